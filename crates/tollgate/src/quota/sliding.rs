//! `sliding_window`: a log of admissions per limit (SPEC Q-2, the default).
//!
//! # Invariant
//!
//! `used` equals the sum of the amounts of the live log slots plus `carry`.
//! A demand is admitted only when `used + amount <= limit`, so the amounts
//! stamped inside any interval of length `window` never exceed `limit`
//! (before debt: reconciliation above the estimate may push `used` over the
//! limit, and later demands then wait until the debt ages out).
//!
//! # Bounded memory
//!
//! Admissions less than `resolution` after a slot opened are merged into it,
//! and the slot's expiry moves to one window after the latest of them.
//! Merging only ever keeps an amount counted for longer, never shorter, so
//! the bound above holds exactly; the price is that an amount may stay
//! counted up to `resolution` longer than strictly needed. With
//! `resolution = window / SLOTS` a limit holds at most `SLOTS + 1` slots
//! whatever its rate.
//!
//! # Pending reservations
//!
//! A reservation taken at the head of the queue may wait for concurrency
//! before its attempt starts. Until it is leased its amount is *pending*: if
//! its slot ages out meanwhile, the pending part moves to `carry` and stays
//! counted. Leasing moves the amount to a slot at the lease instant, so what
//! the provider sees arrive is what the log counts (and never earlier).
//!
//! Times are nanoseconds since the scope's epoch ([`Nanos`]).

use std::collections::VecDeque;

use super::Nanos;

/// Slots per window: bounds memory and the merge error (`window / SLOTS`).
pub(crate) const SLOTS: u64 = 512;

/// The most one entry counts (2⁵³, far above any real request, token or
/// cost count): a provider's absurd usage report, a damaged state file's
/// row or a debt is clamped to it, so that the sum of a window's slots
/// and debts (never 2,048 entries of that size) does not overflow and
/// `used` stays their sum (SPEC Q-7).
pub(crate) const MAX_AMOUNT: u64 = 1 << 53;

#[derive(Debug, Clone, Copy)]
struct Slot {
    opened: Nanos,
    /// No admission joins this slot at or after this instant.
    closes: Nanos,
    /// One window after the slot's latest admission.
    expires: Nanos,
    amount: u64,
    pending: u64,
}

/// An amount counted until an instant of its own: budget the provider says
/// is gone (SPEC Q-14), kept apart from the log so that no reservation is
/// ever located in it.
#[derive(Debug, Clone, Copy)]
struct Debt {
    expires: Nanos,
    amount: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct SlidingWindow {
    limit: u64,
    window: Nanos,
    resolution: Nanos,
    log: VecDeque<Slot>,
    /// Ordered by expiry.
    debts: VecDeque<Debt>,
    used: u64,
    carry: u64,
}

impl SlidingWindow {
    pub(crate) fn new(limit: u64, window: Nanos) -> Self {
        SlidingWindow {
            limit,
            window,
            resolution: (window / SLOTS).max(1),
            log: VecDeque::with_capacity(SLOTS as usize + 2),
            debts: VecDeque::new(),
            used: 0,
            carry: 0,
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Counted amount (may exceed the limit through debt).
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Drops slots whose amounts aged out at `now`.
    #[inline]
    pub(crate) fn prune(&mut self, now: Nanos) {
        while let Some(front) = self.log.front() {
            if front.expires > now {
                break;
            }
            let (amount, pending) = (front.amount, front.pending);
            self.log.pop_front();
            self.used = self.used.saturating_sub(amount - pending);
            self.carry += pending;
        }
        while let Some(debt) = self.debts.front() {
            if debt.expires > now {
                break;
            }
            self.used = self.used.saturating_sub(debt.amount);
            self.debts.pop_front();
        }
    }

    /// Whether `amount` fits now. Nothing always fits, even in debt.
    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        amount == 0 || self.used.saturating_add(amount) <= self.limit
    }

    /// Earliest instant at which `amount` fits, assuming no new admissions.
    /// `None`: only a pending lease or refund can make room.
    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        let excess = self.used.saturating_add(amount).saturating_sub(self.limit);
        if excess == 0 || amount == 0 {
            return Some(now);
        }
        // Log slots and debts both free in expiry order: merge them.
        let mut freed = 0u64;
        let (mut slots, mut debts) = (self.log.iter().peekable(), self.debts.iter().peekable());
        loop {
            let (expires, amount) = match (slots.peek(), debts.peek()) {
                (Some(s), Some(d)) if d.expires < s.expires => {
                    let d = debts.next()?;
                    (d.expires, d.amount)
                }
                (Some(_), _) => {
                    let s = slots.next()?;
                    (s.expires, s.amount - s.pending)
                }
                (None, Some(_)) => {
                    let d = debts.next()?;
                    (d.expires, d.amount)
                }
                (None, None) => return None,
            };
            freed += amount;
            if freed >= excess {
                return Some(expires.max(now));
            }
        }
    }

    /// Counts `amount` at `now` (the caller checked that it fits, or is
    /// recording debt).
    #[inline]
    pub(crate) fn add(&mut self, amount: u64, now: Nanos, pending: bool) {
        let amount = amount.min(MAX_AMOUNT);
        if amount == 0 {
            return;
        }
        self.used = self.used.saturating_add(amount);
        let pend = if pending { amount } else { 0 };
        let expires = now.saturating_add(self.window);
        if self.log.back().is_some_and(|back| now < back.opened) {
            // A recount placed an amount ahead of `now` (SPEC Q-15): this
            // one goes before it, where its stamp locates it.
            return self.insert_before_back(amount, now, pend);
        }
        if let Some(back) = self.log.back_mut()
            && now < back.closes
        {
            back.amount = back.amount.saturating_add(amount);
            back.pending = back.pending.saturating_add(pend);
            back.expires = back.expires.max(expires);
            return;
        }
        self.log.push_back(Slot {
            opened: now,
            closes: now.saturating_add(self.resolution),
            expires,
            amount,
            pending: pend,
        });
    }

    /// The slot holding the reservation stamped `stamp`: the one whose
    /// span (`opened` to `closes`) holds the stamp. Every amount joins
    /// the slot whose span holds its instant, or opens one, so a live
    /// reservation is always found in its own slot; a slot with an empty
    /// span (a seed, a restored amount) holds none.
    #[inline]
    fn locate(&self, stamp: Nanos) -> Option<usize> {
        // Most lookups are for a recent reservation: try the newest slot.
        let i = match self.log.back() {
            Some(back) if back.opened <= stamp => self.log.len() - 1,
            _ => self
                .log
                .partition_point(|s| s.opened <= stamp)
                .checked_sub(1)?,
        };
        (stamp < self.log[i].closes).then_some(i)
    }

    /// Removes a reservation's amount from wherever it is counted. A
    /// pending amount is what its slot holds pending, the rest carried
    /// (its slot aged out): pending amounts are taken only from what is
    /// pending, so none is ever left without a reservation to take it. A
    /// leased amount is taken only from what its slot holds leased.
    fn take(&mut self, stamp: Nanos, amount: u64, pending: bool) {
        let slot = self.locate(stamp).and_then(|i| self.log.get_mut(i));
        match slot {
            Some(slot) if pending => {
                let a = amount.min(slot.pending);
                slot.amount -= a;
                slot.pending -= a;
                self.used = self.used.saturating_sub(a);
                self.take_carried(amount.min(MAX_AMOUNT) - a);
            }
            Some(slot) => {
                let a = amount.min(slot.amount - slot.pending);
                slot.amount -= a;
                self.used = self.used.saturating_sub(a);
            }
            None if pending => self.take_carried(amount),
            // A leased amount whose slot aged out is no longer counted.
            None => {}
        }
    }

    /// Takes up to `amount` of what is carried: pending amounts whose
    /// slots aged out, and those a seed holds (see
    /// `LimitState::release_seeded`).
    pub(crate) fn take_carried(&mut self, amount: u64) {
        let a = amount.min(self.carry);
        self.carry -= a;
        self.used = self.used.saturating_sub(a);
    }

    /// Returns a reservation that never started (SPEC Q-9).
    pub(crate) fn refund(&mut self, stamp: Nanos, amount: u64, pending: bool) {
        self.take(stamp, amount, pending);
    }

    /// Every pending reservation starts at `now` (a projection, SPEC
    /// the pending amounts, in their slots or carried, are counted
    /// as leased then.
    pub(crate) fn lease_pending(&mut self, now: Nanos) {
        let mut pending = std::mem::take(&mut self.carry);
        for slot in &mut self.log {
            let p = std::mem::take(&mut slot.pending).min(slot.amount);
            pending = pending.saturating_add(p);
            slot.amount -= p;
        }
        self.used = self.used.saturating_sub(pending);
        self.add(pending, now, false);
    }

    /// Moves a pending reservation to the lease instant.
    pub(crate) fn lease(&mut self, stamp: Nanos, amount: u64, now: Nanos) {
        self.take(stamp, amount, true);
        self.add(amount, now, false);
    }

    /// Replaces a leased estimate by the reported amount in the same slot
    /// (SPEC Q-5). Nothing changes once the slot aged out. A limit that
    /// holds no slot of the reservation (one a reload added after it was
    /// taken, seeded with what it counted) counts the debt from the
    /// reservation's instant, until one window after it (`now`: the
    /// latest instant the window was brought to).
    pub(crate) fn reconcile(&mut self, stamp: Nanos, estimate: u64, actual: u64, now: Nanos) {
        let (estimate, actual) = (estimate.min(MAX_AMOUNT), actual.min(MAX_AMOUNT));
        if estimate == 0 {
            // A zero amount opened no slot: its debt is counted from its
            // own instant (the slot found by its stamp may have closed
            // before it, and would let the debt go too early).
            self.insert_at(actual, stamp, stamp);
            return;
        }
        let Some(i) = self.locate(stamp) else {
            self.insert_at(actual.saturating_sub(estimate), stamp, now);
            return;
        };
        if let Some(slot) = self.log.get_mut(i) {
            if actual >= estimate {
                let debt = actual - estimate;
                slot.amount = slot.amount.saturating_add(debt);
                self.used = self.used.saturating_add(debt);
            } else {
                let refund = (estimate - actual).min(slot.amount - slot.pending);
                slot.amount -= refund;
                self.used = self.used.saturating_sub(refund);
            }
        }
    }

    /// Counts `amount` as admitted at `at`, an instant that may lie before
    /// the newest slot (SPEC ), keeping the log ordered by
    /// opening and by expiry: merged into the slot whose span holds `at`,
    /// or in a slot of its own between its neighbours. An amount whose
    /// window already ended at `now` is not counted.
    pub(crate) fn insert_at(&mut self, amount: u64, at: Nanos, now: Nanos) {
        let amount = amount.min(MAX_AMOUNT);
        let expires = at.saturating_add(self.window);
        if amount == 0 || expires <= now {
            return;
        }
        match self.log.back() {
            None => return self.add(amount, at, false),
            Some(back) if at >= back.opened => return self.add(amount, at, false),
            Some(_) => {}
        }
        self.used = self.used.saturating_add(amount);
        self.insert_before_back(amount, at, 0);
    }

    /// Puts `amount` (of which `pending` is pending), already added to
    /// `used`, at `at`, an instant before the newest slot opened: merged
    /// into the slot whose span holds `at`, or in a slot of its own
    /// between its neighbours, so the log stays ordered by opening and by
    /// expiry.
    fn insert_before_back(&mut self, amount: u64, at: Nanos, pending: u64) {
        let expires = at.saturating_add(self.window);
        // The first slot opened after `at`; its predecessor opened at or
        // before it.
        let next = self.log.partition_point(|s| s.opened <= at);
        if let Some(prev) = next.checked_sub(1).and_then(|i| self.log.get_mut(i))
            && at < prev.closes
        {
            // Every later slot opened after `at` expires after `expires`.
            prev.amount = prev.amount.saturating_add(amount);
            prev.pending = prev.pending.saturating_add(pending);
            prev.expires = prev.expires.max(expires);
            return;
        }
        // Admissions of the previous slot all lie before `at`, those of
        // the next one after it: both orders are kept.
        let closes = self
            .log
            .get(next)
            .map_or(at.saturating_add(self.resolution), |n| {
                n.opened.min(at.saturating_add(self.resolution))
            });
        self.log.insert(
            next,
            Slot {
                opened: at,
                closes,
                expires,
                amount,
                pending,
            },
        );
    }

    /// Moves a leased reservation's amount to `at`, the latest instant the
    /// provider can have counted it (SPEC Q-15): it stays counted until one
    /// window after `at` instead of after its lease. `at` may lie after
    /// `now` (an attempt cancelled before its arrival bound passed): the
    /// amount then sits in a slot opened in the future, and admissions
    /// until then go before it. Returns the stamp that now locates it.
    pub(crate) fn recount(&mut self, stamp: Nanos, amount: u64, at: Nanos, now: Nanos) -> Nanos {
        if at <= stamp {
            return stamp;
        }
        self.take(stamp, amount, false);
        self.insert_at(amount, at, now);
        at
    }

    /// Counts `amount` until `until` (budget a provider says is gone,
    /// SPEC Q-14). Nothing if `until` is not after `now`.
    pub(crate) fn charge_until(&mut self, amount: u64, until: Nanos, now: Nanos) {
        let amount = amount.min(MAX_AMOUNT);
        if amount == 0 || until <= now {
            return;
        }
        self.used = self.used.saturating_add(amount);
        let at = self.debts.partition_point(|d| d.expires <= until);
        match self.debts.get_mut(at.wrapping_sub(1)) {
            Some(d) if d.expires == until => d.amount = d.amount.saturating_add(amount),
            _ => self.debts.insert(
                at,
                Debt {
                    expires: until,
                    amount,
                },
            ),
        }
    }

    /// tollgate's own amount counted at instant `at` (not after `now`):
    /// the live slots whose span covers `at` and pending amounts, without
    /// debts. What this limit held of tollgate's traffic when a provider's
    /// response began (SPEC Q-14).
    pub(crate) fn own_at(&self, at: Nanos) -> u64 {
        let live: u64 = self
            .log
            .iter()
            .take_while(|s| s.opened <= at)
            .filter(|s| s.expires > at)
            .map(|s| s.amount)
            .sum();
        live.saturating_add(self.carry)
    }

    /// tollgate's own amount counted now: everything but debts.
    pub(crate) fn own(&self) -> u64 {
        let debts: u64 = self.debts.iter().map(|d| d.amount).sum();
        self.used.saturating_sub(debts)
    }

    /// Replaces every debt by `amount` counted until `until` (the latest
    /// estimate of what other clients hold at the provider, SPEC Q-14).
    /// Returns the change in the counted amount.
    pub(crate) fn replace_debts(&mut self, amount: u64, until: Nanos, now: Nanos) -> i128 {
        let before: u64 = self.debts.iter().map(|d| d.amount).sum();
        self.used = self.used.saturating_sub(before);
        self.debts.clear();
        self.charge_until(amount, until, now);
        let after: u64 = self.debts.iter().map(|d| d.amount).sum();
        i128::from(after) - i128::from(before)
    }

    /// Changes the limit (a limit learned from the provider, SPEC Q-14);
    /// what is counted stays counted.
    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Gives back a leased amount in full (a refusal the provider did not
    /// charge, SPEC Q-16).
    pub(crate) fn release(&mut self, stamp: Nanos, amount: u64) {
        self.take(stamp, amount, false);
    }

    /// What is counted: tollgate's own leased amounts and debts, and
    /// the amounts of pending reservations (a reconfiguration's seed).
    pub(crate) fn counted(&self) -> (u64, u64) {
        let pending = self
            .log
            .iter()
            .map(|s| s.pending)
            .sum::<u64>()
            .saturating_add(self.carry);
        (self.used.saturating_sub(pending), pending)
    }

    /// The leased amounts counted until more than one window after `now`,
    /// each with the instant one window before its expiry: attempts the
    /// provider may count as late as then (SPEC Q-15), debts counted from
    /// them, and any amount of a slot one of those joined (counted from
    /// that instant too: longer).
    pub(crate) fn ahead(&self, now: Nanos) -> Vec<(Nanos, u64)> {
        let since = |expires: Nanos| expires.saturating_sub(self.window);
        self.log
            .iter()
            .filter(|s| since(s.expires) > now && s.amount > s.pending)
            .map(|s| (since(s.expires), s.amount - s.pending))
            .chain(
                self.debts
                    .iter()
                    .filter(|d| since(d.expires) > now)
                    .map(|d| (since(d.expires), d.amount)),
            )
            .collect()
    }

    /// Settles a reservation this window holds no slot of (taken before a
    /// reconfiguration seeded it, or before a restore, see
    /// `LimitState::foreign`): its leased amount is part of the seed, or
    /// was no longer counted, so nothing is given back; a debt above the
    /// estimate is counted from the reservation's own instant.
    pub(crate) fn reconcile_foreign(
        &mut self,
        stamp: Nanos,
        estimate: u64,
        actual: u64,
        now: Nanos,
    ) {
        if actual > estimate {
            self.insert_at(actual - estimate, stamp, now);
        }
    }

    /// Recounts a reservation this window holds no slot of (see
    /// [`reconcile_foreign`](Self::reconcile_foreign)) to `at`: counted
    /// from there, beside whatever counts it already.
    pub(crate) fn recount_foreign(
        &mut self,
        stamp: Nanos,
        amount: u64,
        at: Nanos,
        now: Nanos,
    ) -> Nanos {
        if at <= stamp {
            return stamp;
        }
        self.insert_at(amount, at, now);
        at
    }

    /// Seeds a fresh window with what another limit counted (a
    /// reconfiguration that changed the window or the algorithm): the
    /// pending amounts in `carry`, where the lease or refund of a
    /// reservation from before takes them (`LimitState::release_seeded`);
    /// each amount of `ahead` (part of `counted`) as admitted at its
    /// instant, after `now`; and the rest as admitted at `now` (later than
    /// it was, so counted longer: conservative), in a slot whose span is
    /// empty, so nothing joins it and no stamp locates it.
    pub(crate) fn seed(&mut self, counted: u64, pending: u64, ahead: &[(Nanos, u64)], now: Nanos) {
        self.carry = self.carry.saturating_add(pending);
        self.used = self.used.saturating_add(pending);
        let later = ahead
            .iter()
            .filter(|(at, _)| *at > now)
            .fold(0u64, |sum, (_, a)| sum.saturating_add(*a));
        let counted = counted.saturating_sub(later).min(MAX_AMOUNT);
        if counted > 0 && !self.log.is_empty() {
            // Into a running log (a restore): as admitted now, joining the
            // slot open then, which the stamps of its own reservations
            // locate, as they did.
            self.add(counted, now, false);
        } else if counted > 0 {
            self.used = self.used.saturating_add(counted);
            self.log.push_back(Slot {
                opened: now,
                closes: now,
                expires: now.saturating_add(self.window),
                amount: counted,
                pending: 0,
            });
        }
        for &(at, amount) in ahead.iter().filter(|(at, _)| *at > now) {
            self.insert_at(amount, at, now);
        }
    }

    /// What it counts and until when (leased amounts and debts, in expiry
    /// order): what a restart must not forget (SPEC DQ-8). Pending
    /// amounts are left out: their attempts have not started.
    pub(crate) fn saved(&self) -> Vec<(Nanos, u64)> {
        let mut out: Vec<(Nanos, u64)> = self
            .log
            .iter()
            .filter(|s| s.amount > s.pending)
            .map(|s| (s.expires, s.amount - s.pending))
            .chain(self.debts.iter().map(|d| (d.expires, d.amount)))
            .collect();
        out.sort_by_key(|e| e.0);
        out
    }

    /// Counts amounts saved before a restart, each until its expiry
    /// (`entries` in expiry order). An expiry is believed up to one window
    /// after `now` plus the larger of one window and the arrival cap (an
    /// amount recounted to an instant ahead, SPEC Q-15, is counted until
    /// one window after that instant); further is a clock that went back,
    /// and counts until that horizon.
    /// Into an empty log they go as slots of their own that nothing joins
    /// or is located in (opened at the epoch, with an empty span), so each
    /// frees at its own expiry; next to amounts already counted they are
    /// counted as admitted at `now`, which is longer, or, expiring more
    /// than a window after `now`, as admitted one window before their
    /// expiry (an instant ahead).
    pub(crate) fn restore(&mut self, entries: &[(Nanos, u64)], now: Nanos) {
        let ahead = self
            .window
            .max(super::limit::nanos(crate::lifecycle::ARRIVAL_CAP));
        let horizon = now.saturating_add(self.window).saturating_add(ahead);
        let live = entries
            .iter()
            .filter(|(expires, amount)| *expires > now && *amount > 0)
            .map(|&(expires, amount)| (expires.min(horizon), amount.min(MAX_AMOUNT)));
        if !self.log.is_empty() {
            let mut total = 0u64;
            for (expires, amount) in live {
                let at = expires.saturating_sub(self.window);
                if at > now {
                    self.insert_at(amount, at, now);
                } else {
                    total = total.saturating_add(amount);
                }
            }
            self.add(total, now, false);
            return;
        }
        for (expires, amount) in live {
            self.used = self.used.saturating_add(amount);
            match self.log.back_mut() {
                Some(back) if back.expires >= expires => {
                    back.amount = back.amount.saturating_add(amount);
                }
                _ => self.log.push_back(Slot {
                    opened: 0,
                    closes: 0,
                    expires,
                    amount,
                    pending: 0,
                }),
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.log.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    // proves: Q-2 (sliding window: a full limit may be used at once, and frees
    // exactly one window after each admission)
    #[test]
    fn frees_one_window_after_each_admission() {
        let mut w = SlidingWindow::new(2, 60 * S);
        w.add(1, 0, false);
        w.add(1, 30 * S, false);
        assert!(!w.fits(1));
        assert_eq!(w.earliest(1, 31 * S), Some(60 * S));
        assert_eq!(w.earliest(2, 31 * S), Some(90 * S));
        w.prune(60 * S);
        assert!(w.fits(1));
        assert!(!w.fits(2));
    }

    // proves: Q-2 (memory stays bounded by merging admissions into slots)
    #[test]
    fn slots_stay_bounded_under_a_high_rate() {
        let mut w = SlidingWindow::new(u64::MAX / 2, 60 * S);
        for i in 0..200_000u64 {
            let now = i * 1_000_000;
            w.prune(now);
            w.add(1, now, false);
            assert!(w.slots() <= SLOTS as usize + 1);
        }
    }

    // proves: Q-5 (reconciliation lands in the slot of the estimate)
    #[test]
    fn reconcile_adjusts_the_original_slot() {
        let mut w = SlidingWindow::new(100, 60 * S);
        w.add(40, 0, false);
        w.add(10, 10 * S, false);
        w.reconcile(0, 40, 25, 10 * S);
        assert_eq!(w.used(), 35);
        w.reconcile(10 * S, 10, 30, 10 * S);
        assert_eq!(w.used(), 55);
        // The refund frees room now, the debt expires with its own slot.
        w.prune(60 * S);
        assert_eq!(w.used(), 30);
        w.prune(70 * S);
        assert_eq!(w.used(), 0);
        // Once aged out, reconciliation changes nothing.
        w.reconcile(0, 40, 400, 70 * S);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-9 (a pending reservation stays counted until leased or
    // refunded, even when its slot ages out)
    #[test]
    fn pending_amounts_outlive_their_slot() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(6, 0, true);
        w.prune(61 * S);
        assert_eq!(w.used(), 6);
        assert_eq!(w.earliest(5, 61 * S), None);
        w.lease(0, 6, 61 * S);
        assert_eq!(w.used(), 6);
        w.prune(121 * S);
        assert_eq!(w.used(), 0);

        w.add(4, 130 * S, true);
        w.prune(200 * S);
        w.refund(130 * S, 4, true);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-15 (an amount recounted at a later instant stays counted
    // until one window after it, and settles where it now is)
    #[test]
    fn recount_moves_an_amount_to_a_later_instant() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(4, 0, false);
        w.add(1, 5 * S, false);
        // The provider counted the first admission 2 s later.
        let stamp = w.recount(0, 4, 2 * S, 5 * S);
        assert_eq!(stamp, 2 * S);
        assert_eq!(w.used(), 5);
        w.prune(60 * S);
        assert_eq!(w.used(), 5, "not freed one window after the lease");
        w.reconcile(stamp, 4, 1, stamp);
        assert_eq!(w.used(), 2, "settled in its new slot");
        w.prune(62 * S);
        assert_eq!(w.used(), 1);
        w.prune(65 * S);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-14, Q-15 (amounts inserted in the past keep the log ordered
    // by expiry, so the earliest-fit instant stays exact)
    #[test]
    fn inserted_amounts_keep_expiries_ordered() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(2, 0, false);
        w.add(2, 30 * S, false);
        w.insert_at(3, 10 * S, 31 * S);
        w.insert_at(1, 30 * S + 1, 31 * S); // merges into the 30 s slot
        assert_eq!(w.used(), 8);
        let mut last = 0;
        for s in &w.log {
            assert!(s.expires >= last, "expiries out of order: {:?}", w.log);
            last = s.expires;
        }
        assert!(!w.fits(3));
        assert_eq!(w.earliest(3, 31 * S), Some(60 * S));
        assert_eq!(w.earliest(4, 31 * S), Some(60 * S));
        assert_eq!(w.earliest(5, 31 * S), Some(70 * S));
        // Already out of its window: not counted.
        w.insert_at(5, 0, 61 * S);
        assert_eq!(w.used(), 8);
        assert_eq!(w.own_at(20 * S), 5);
    }

    // proves: Q-5, Q-7 (debt on a zero estimate, which opened no slot, is
    // counted for a whole window from the attempt's own instant)
    #[test]
    fn debt_on_a_zero_estimate_is_counted_from_its_instant() {
        let mut w = SlidingWindow::new(100, 60 * S);
        w.add(1, 0, false);
        w.add(0, 30 * S, false);
        w.reconcile(30 * S, 0, 40, 30 * S);
        assert_eq!(w.used(), 41);
        w.prune(60 * S);
        assert_eq!(w.used(), 40, "not gone with the earlier slot");
        w.prune(90 * S);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-2 (merged admissions expire one window after the latest)
    #[test]
    fn merged_slot_expires_after_its_latest_admission() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(1, 0, false);
        w.add(1, 50_000_000, false); // 50 ms later: same slot
        assert_eq!(w.slots(), 1);
        w.prune(60 * S);
        assert_eq!(w.used(), 2);
        w.prune(60 * S + 50_000_000);
        assert_eq!(w.used(), 0);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// 512 slots of 1,000 ns: steps of a few slots make admissions,
        /// recounts and merges meet inside slots all the time.
        const W: Nanos = 512_000;
        const STEP: Nanos = 3_000;

        #[derive(Debug, Clone)]
        enum Op {
            Admit { amount: u64, pending: bool },
            Lease(usize),
            Refund(usize),
            Release(usize),
            Recount { index: usize, delay: Nanos },
            Debt { amount: u64, length: Nanos },
            Advance(Nanos),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (1..50u64, any::<bool>())
                    .prop_map(|(amount, pending)| Op::Admit { amount, pending }),
                any::<usize>().prop_map(Op::Lease),
                any::<usize>().prop_map(Op::Refund),
                any::<usize>().prop_map(Op::Release),
                (any::<usize>(), 0..2 * STEP)
                    .prop_map(|(index, delay)| Op::Recount { index, delay }),
                (1..50u64, 1..W).prop_map(|(amount, length)| Op::Debt { amount, length }),
                (0..STEP).prop_map(Op::Advance),
                (W / 2..W).prop_map(Op::Advance),
            ]
        }

        /// What the log must count: each amount from its counting instant.
        #[derive(Debug, Clone, Copy)]
        struct Entry {
            stamp: Nanos,
            amount: u64,
            pending: bool,
        }

        fn check(w: &SlidingWindow, entries: &[Entry], debts: &[(Nanos, u64)], now: Nanos) {
            let logged: u64 = w.log.iter().map(|s| s.amount).sum();
            let owed: u64 = w.debts.iter().map(|d| d.amount).sum();
            assert_eq!(
                w.used,
                logged + w.carry + owed,
                "used is the sum of its parts"
            );
            assert!(
                w.log
                    .iter()
                    .zip(w.log.iter().skip(1))
                    .all(|(a, b)| a.opened <= b.opened && a.expires <= b.expires),
                "log ordered by opening and expiry: {:?}",
                w.log
            );
            assert!(
                w.debts
                    .iter()
                    .zip(w.debts.iter().skip(1))
                    .all(|(a, b)| a.expires <= b.expires)
            );
            let live = |slack: Nanos| -> u64 {
                entries
                    .iter()
                    .filter(|e| e.pending || e.stamp + W + slack > now)
                    .map(|e| e.amount)
                    .sum::<u64>()
                    + debts.iter().filter(|d| d.0 > now).map(|d| d.1).sum::<u64>()
            };
            // Every live amount is found again by its stamp, in a slot that
            // keeps it for its window and at most one slot's span longer.
            for e in entries.iter().filter(|e| e.stamp + W > now) {
                let slot = w.locate(e.stamp).and_then(|i| w.log.get(i));
                let slot = slot.unwrap_or_else(|| panic!("{e:?} not found in {:?}", w.log));
                assert!(
                    slot.opened <= e.stamp && e.stamp < slot.closes,
                    "{e:?} located in {slot:?}"
                );
                assert!(
                    slot.expires >= e.stamp + W,
                    "{e:?} expires early in {slot:?}"
                );
                assert!(
                    slot.expires <= e.stamp + W + w.resolution,
                    "{e:?} held too long in {slot:?}"
                );
            }
            // Never counted shorter than its window; at most one slot's
            // span longer (SPEC ).
            assert!(
                live(0) <= w.used(),
                "undercount: {} < {}",
                w.used(),
                live(0)
            );
            assert!(
                w.used() <= live(w.resolution),
                "overcount: {} > {}",
                w.used(),
                live(w.resolution)
            );
        }

        proptest! {
            // proves, Q-15 (amounts moved to later
            // instants, some still ahead of now, debts until a reset, refunds and releases keep the
            // log ordered and every amount counted for exactly its window,
            // up to one slot's span)
            #[test]
            fn every_amount_is_counted_for_its_window(ops in proptest::collection::vec(op(), 1..200)) {
                let mut w = SlidingWindow::new(u64::MAX / 4, W);
                let mut entries: Vec<Entry> = Vec::new();
                let mut debts: Vec<(Nanos, u64)> = Vec::new();
                let mut now: Nanos = 0;
                for op in ops {
                    match op {
                        Op::Admit { amount, pending } => {
                            w.add(amount, now, pending);
                            entries.push(Entry { stamp: now, amount, pending });
                        }
                        Op::Lease(i) => {
                            if let Some(e) = pick(&mut entries, i, true) {
                                w.lease(e.stamp, e.amount, now);
                                e.stamp = now;
                                e.pending = false;
                            }
                        }
                        Op::Refund(i) => {
                            if let Some(k) = index(&entries, i, true) {
                                let e = entries.remove(k);
                                w.refund(e.stamp, e.amount, true);
                            }
                        }
                        Op::Release(i) => {
                            if let Some(k) = index(&entries, i, false) {
                                let e = entries.remove(k);
                                w.release(e.stamp, e.amount);
                            }
                        }
                        Op::Recount { index: i, delay } => {
                            if let Some(e) = pick(&mut entries, i, false) {
                                // Up to two steps ahead of `now`: an
                                // attempt cancelled before its arrival
                                // bound passed.
                                let at = e.stamp + delay;
                                let stamp = w.recount(e.stamp, e.amount, at, now);
                                assert_eq!(stamp, at.max(e.stamp));
                                e.stamp = stamp;
                            }
                        }
                        Op::Debt { amount, length } => {
                            w.charge_until(amount, now + length, now);
                            debts.push((now + length, amount));
                        }
                        Op::Advance(dt) => {
                            now += dt;
                            w.prune(now);
                        }
                    }
                    check(&w, &entries, &debts, now);
                }
            }
        }

        /// The `i`-th (modulo) entry that is pending (or leased and still
        /// in its window).
        fn index(entries: &[Entry], i: usize, pending: bool) -> Option<usize> {
            let matching: Vec<usize> = (0..entries.len())
                .filter(|&k| entries[k].pending == pending)
                .collect();
            (!matching.is_empty()).then(|| matching[i % matching.len()])
        }

        fn pick(entries: &mut [Entry], i: usize, pending: bool) -> Option<&mut Entry> {
            index(entries, i, pending).map(move |k| &mut entries[k])
        }
    }
}
