//! A FIFO list with O(1) removal from anywhere, without `unsafe`.
//!
//! Nodes live in a [`Slab`] and link to each other by key. A node can be
//! *unlinked* (it leaves the FIFO order but keeps its storage, e.g. a granted
//! waiter that has not yet collected its reservation) and later *removed*.
//! Freed slab entries are reused, so a queue that has reached its working
//! size allocates nothing more.

use slab::Slab;

/// "No node": links are `u32` to keep nodes small.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node<T> {
    value: T,
    prev: u32,
    next: u32,
    linked: bool,
}

fn key_of(link: u32) -> Option<usize> {
    (link != NIL).then_some(link as usize)
}

fn link(key: Option<usize>) -> u32 {
    // Queues are bounded far below 2^32 entries; a larger key is never
    // produced because `push_back` refuses it (see there).
    key.and_then(|k| u32::try_from(k).ok()).unwrap_or(NIL)
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct WaitList<T> {
    nodes: Slab<Node<T>>,
    head: Option<usize>,
    tail: Option<usize>,
    linked: usize,
}

impl<T> WaitList<T> {
    pub(crate) fn new() -> Self {
        WaitList {
            nodes: Slab::new(),
            head: None,
            tail: None,
            linked: 0,
        }
    }

    /// Linked nodes (the FIFO's length).
    pub(crate) fn len(&self) -> usize {
        self.linked
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.linked == 0
    }

    /// The first linked node.
    pub(crate) fn front(&self) -> Option<usize> {
        self.head
    }

    /// Appends `value` at the tail; returns its key, or gives the value
    /// back when the list already holds `u32::MAX - 1` nodes.
    pub(crate) fn push_back(&mut self, value: T) -> Result<usize, T> {
        if self.nodes.len() >= (NIL - 1) as usize {
            return Err(value);
        }
        let key = self.nodes.insert(Node {
            value,
            prev: link(self.tail),
            next: NIL,
            linked: true,
        });
        match self.tail.and_then(|t| self.nodes.get_mut(t)) {
            Some(tail) => tail.next = link(Some(key)),
            None => self.head = Some(key),
        }
        self.tail = Some(key);
        self.linked += 1;
        Ok(key)
    }

    /// Takes `key` out of the FIFO order, keeping its storage. Returns
    /// whether it was linked.
    pub(crate) fn unlink(&mut self, key: usize) -> bool {
        let (prev, next) = match self.nodes.get_mut(key) {
            Some(n) if n.linked => {
                n.linked = false;
                let links = (key_of(n.prev), key_of(n.next));
                n.prev = NIL;
                n.next = NIL;
                links
            }
            _ => return false,
        };
        match prev.and_then(|p| self.nodes.get_mut(p)) {
            Some(p) => p.next = link(next),
            None => self.head = next,
        }
        match next.and_then(|n| self.nodes.get_mut(n)) {
            Some(n) => n.prev = link(prev),
            None => self.tail = prev,
        }
        self.linked -= 1;
        true
    }

    /// Unlinks (if needed) and frees `key`, returning its value.
    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        self.unlink(key);
        self.nodes.try_remove(key).map(|n| n.value)
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        self.nodes.get(key).map(|n| &n.value)
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        self.nodes.get_mut(key).map(|n| &mut n.value)
    }

    /// The linked values in FIFO order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> + '_ {
        let mut cursor = self.head;
        std::iter::from_fn(move || {
            let key = cursor?;
            let node = self.nodes.get(key)?;
            cursor = key_of(node.next);
            Some((key, &node.value))
        })
    }

    /// Keys of the linked nodes in FIFO order.
    pub(crate) fn keys(&self) -> Vec<usize> {
        self.iter().map(|(k, _)| k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(l: &WaitList<u32>) -> Vec<u32> {
        l.iter().map(|(_, v)| *v).collect()
    }

    // proves: ADM-4 (FIFO order, with removal from anywhere)
    #[test]
    fn keeps_fifo_order_across_removals() {
        let mut l = WaitList::new();
        let a = l.push_back(1).unwrap();
        let b = l.push_back(2).unwrap();
        let c = l.push_back(3).unwrap();
        assert_eq!(values(&l), [1, 2, 3]);
        assert_eq!(l.remove(b), Some(2));
        assert_eq!(values(&l), [1, 3]);
        assert!(l.unlink(a));
        assert!(!l.unlink(a));
        assert_eq!(l.front(), Some(c));
        assert_eq!(l.get(a), Some(&1));
        assert_eq!(l.len(), 1);
        let d = l.push_back(4).unwrap();
        assert_eq!(values(&l), [3, 4]);
        assert_eq!(l.remove(c), Some(3));
        assert_eq!(l.front(), Some(d));
        assert_eq!(l.remove(a), Some(1));
        assert_eq!(l.remove(d), Some(4));
        assert!(l.is_empty());
        assert_eq!(l.front(), None);
        assert_eq!(l.remove(d), None);
    }
}
