//! Who a call belongs to, for fair sharing of a scope (SPEC §15).

use std::fmt;
use std::str::FromStr;

/// A priority class (SPEC FAIR-2), highest first: `interactive` before
/// `standard` (the default) before `batch`. A lower class still receives
/// its `min_share` of a scope's admitted cost, so none starves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum Priority {
    /// Served first: a person is waiting.
    Interactive = 0,
    /// The default class.
    #[default]
    Standard = 1,
    /// Served last: bulk work that can wait (the batch runner's default).
    Batch = 2,
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 3] = [Priority::Interactive, Priority::Standard, Priority::Batch];

    /// The stable lower-case name: `interactive`, `standard` or `batch`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Standard => "standard",
            Priority::Batch => "batch",
        }
    }

    /// The class's rank, 0 for the highest (an index into per-class
    /// arrays such as [`ScopeCounters::served_cost`](crate::ScopeCounters::served_cost)).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The lower of two classes: a caller may lower its class, never raise
    /// it (SPEC FAIR-7).
    pub fn at_most(self, ceiling: Priority) -> Priority {
        // A higher class has a smaller rank.
        if self.index() < ceiling.index() {
            ceiling
        } else {
            self
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a priority class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority class {0:?} (expected interactive, standard or batch)")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;

    /// Parses a class name, ignoring ASCII case and surrounding blanks.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| UnknownPriority(t.to_owned()))
    }
}

/// The flow a call belongs to (SPEC FAIR-1): a tenant, a priority class
/// and the tenant's weight.
///
/// Waiting calls of one scope are grouped by (tenant, class); within a flow
/// they are served first in, first out, and across flows of one class in
/// proportion to their weights by cost (FAIR-3). The tenant is a small
/// number the caller chooses (the gateway numbers its configured tenants);
/// it never comes from a request, and it is never a metric label by
/// itself. Every call without a flow is in `Flow::default()`: tenant 0,
/// class `standard`, weight 1, so a scope used without flows is plain FIFO.
///
/// ```
/// use tollgate::{Call, Flow, Priority, ScopeId};
/// let chat = Call::new(ScopeId::FIRST).with_flow(Flow::new(7, Priority::Interactive).with_weight(3));
/// assert_eq!(chat.flow.tenant(), 7);
/// assert_eq!(chat.flow.weight(), 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    tenant: u32,
    priority: Priority,
    weight: u32,
}

impl Default for Flow {
    fn default() -> Self {
        Flow::DEFAULT
    }
}

impl Flow {
    /// Tenant 0, class `standard`, weight 1.
    pub const DEFAULT: Flow = Flow {
        tenant: 0,
        priority: Priority::Standard,
        weight: 1,
    };

    /// The flow of `tenant` in class `priority`, weight 1.
    pub const fn new(tenant: u32, priority: Priority) -> Self {
        Flow {
            tenant,
            priority,
            weight: 1,
        }
    }

    /// A number for the tenant called `name`: FNV-1a of its bytes, the
    /// same whatever the order of a configuration. Two names may hash to
    /// one number (about one pair in 2^32), and calls of one number share
    /// a flow: a shell running several named tenants on one controller
    /// checks the numbers it hands out (the gateway takes the next free
    /// number on a collision).
    ///
    /// ```
    /// use tollgate::Flow;
    /// assert_eq!(Flow::tenant_number("bulk"), Flow::tenant_number("bulk"));
    /// assert_ne!(Flow::tenant_number("bulk"), Flow::tenant_number("chat"));
    /// ```
    pub fn tenant_number(name: &str) -> u32 {
        name.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        })
    }

    /// Sets the tenant's weight (its share relative to other tenants of
    /// the same class); 0 counts as 1.
    pub const fn with_weight(mut self, weight: u32) -> Self {
        self.weight = if weight == 0 { 1 } else { weight };
        self
    }

    /// Sets the class.
    pub const fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The tenant.
    pub const fn tenant(&self) -> u32 {
        self.tenant
    }

    /// The class.
    pub const fn priority(&self) -> Priority {
        self.priority
    }

    /// The weight (at least 1).
    pub const fn weight(&self) -> u32 {
        self.weight
    }

    /// What identifies the flow's line in a scope: tenant and class.
    pub(crate) const fn key(&self) -> FlowKey {
        FlowKey {
            tenant: self.tenant,
            priority: self.priority,
        }
    }
}

/// A flow without its weight: the identity of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FlowKey {
    pub(crate) tenant: u32,
    pub(crate) priority: Priority,
}

impl FlowKey {
    /// One number per key, for the permit queues (`0` for the default
    /// flow): the class in the low byte.
    pub(crate) const fn holder(self) -> u64 {
        ((self.tenant as u64) << 8) | (self.priority as u64 ^ Priority::Standard as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_ceilings_clamp() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
        }
        assert_eq!(" Batch ".parse::<Priority>(), Ok(Priority::Batch));
        assert!("urgent".parse::<Priority>().is_err());
        assert_eq!(
            Priority::Interactive.at_most(Priority::Standard),
            Priority::Standard
        );
        assert_eq!(Priority::Batch.at_most(Priority::Standard), Priority::Batch);
        assert_eq!(Flow::DEFAULT.key().holder(), 0);
        assert_ne!(Flow::new(0, Priority::Batch).key().holder(), 0);
        assert_eq!(Flow::new(1, Priority::Batch).with_weight(0).weight(), 1);
    }
}
