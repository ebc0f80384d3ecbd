//! FIFO lines sharing one store of nodes, with O(1) removal from anywhere,
//! without `unsafe`.
//!
//! Nodes live in one [`Slab`] and link to each other by key; each node
//! belongs to one *chain* (a FIFO line: a flow's waiting calls, SPEC
//! FAIR-1), and a chain carries its owner's data `M`. A node can be
//! *unlinked* (it leaves its chain's order but keeps its storage, e.g. a
//! granted waiter that has not yet collected its reservation) and later
//! *removed*. Freed slab entries are reused, so lines that have reached
//! their working size allocate nothing more. A single chain is a plain
//! FIFO list.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use slab::Slab;

/// A map keyed by small numbers the caller chose (flows, holders): a
/// multiplicative hash, much cheaper than SipHash. The keys come from the
/// configuration or the embedding program, never from a request.
pub(crate) type NumberMap<K, V> = HashMap<K, V, BuildHasherDefault<NumberHasher>>;

/// See [`NumberMap`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NumberHasher(u64);

impl Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        // The product's high bits are the well-mixed ones; the table indexes
        // by the low ones.
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// "No node": links are `u32` to keep nodes small.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node<T> {
    value: T,
    prev: u32,
    next: u32,
    /// The chain it belongs to (kept after unlinking).
    chain: u32,
    linked: bool,
}

fn key_of(link: u32) -> Option<usize> {
    (link != NIL).then_some(link as usize)
}

fn link(key: Option<usize>) -> u32 {
    // Lines are bounded far below 2^32 entries; a larger key is never
    // produced because `push_back` refuses it (see there).
    key.and_then(|k| u32::try_from(k).ok()).unwrap_or(NIL)
}

/// One FIFO line and its owner's data.
#[derive(Debug)]
pub(crate) struct Chain<M> {
    head: u32,
    tail: u32,
    len: usize,
    /// The owner's data.
    pub(crate) meta: M,
}

impl<M> Chain<M> {
    /// Linked nodes in this chain.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first linked node.
    pub(crate) fn front(&self) -> Option<usize> {
        key_of(self.head)
    }

    /// The last linked node.
    pub(crate) fn back(&self) -> Option<usize> {
        key_of(self.tail)
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Lines<T, M> {
    nodes: Slab<Node<T>>,
    chains: Slab<Chain<M>>,
    linked: usize,
}

impl<T, M> Default for Lines<T, M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, M> Lines<T, M> {
    pub(crate) fn new() -> Self {
        Lines {
            nodes: Slab::new(),
            chains: Slab::new(),
            linked: 0,
        }
    }

    /// Linked nodes in every chain.
    pub(crate) fn len(&self) -> usize {
        self.linked
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.linked == 0
    }

    /// Opens an empty chain; `None` past `u32::MAX - 1` chains.
    pub(crate) fn open(&mut self, meta: M) -> Option<u32> {
        if self.chains.len() >= (NIL - 1) as usize {
            return None;
        }
        let id = self.chains.insert(Chain {
            head: NIL,
            tail: NIL,
            len: 0,
            meta,
        });
        u32::try_from(id).ok()
    }

    /// Closes an empty chain, returning its data (`None` if it still has
    /// linked nodes or does not exist). Unlinked nodes that named it keep
    /// the number, which a later chain may reuse: read a node's chain only
    /// while it is linked.
    pub(crate) fn close(&mut self, chain: u32) -> Option<M> {
        match self.chains.get(chain as usize) {
            Some(c) if c.len == 0 => self.chains.try_remove(chain as usize).map(|c| c.meta),
            _ => None,
        }
    }

    pub(crate) fn chain(&self, chain: u32) -> Option<&Chain<M>> {
        self.chains.get(chain as usize)
    }

    pub(crate) fn chain_mut(&mut self, chain: u32) -> Option<&mut Chain<M>> {
        self.chains.get_mut(chain as usize)
    }

    /// Every chain with its number.
    pub(crate) fn chains(&self) -> impl Iterator<Item = (u32, &Chain<M>)> + '_ {
        self.chains
            .iter()
            .map(|(i, c)| (u32::try_from(i).unwrap_or(NIL), c))
    }

    /// Numbers of every chain.
    pub(crate) fn chain_ids(&self) -> Vec<u32> {
        self.chains().map(|(i, _)| i).collect()
    }

    /// The chain `key` was last linked in.
    pub(crate) fn chain_of(&self, key: usize) -> Option<u32> {
        self.nodes.get(key).map(|n| n.chain)
    }

    /// Whether `key` is linked in a chain.
    pub(crate) fn is_linked(&self, key: usize) -> bool {
        self.nodes.get(key).is_some_and(|n| n.linked)
    }

    /// Appends `value` at the tail of `chain`; returns its key, or gives the
    /// value back when the store already holds `u32::MAX - 1` nodes or the
    /// chain does not exist.
    pub(crate) fn push_back(&mut self, chain: u32, value: T) -> Result<usize, T> {
        if self.nodes.len() >= (NIL - 1) as usize {
            return Err(value);
        }
        let Some(tail) = self.chains.get(chain as usize).map(|c| c.tail) else {
            return Err(value);
        };
        let key = self.nodes.insert(Node {
            value,
            prev: tail,
            next: NIL,
            chain,
            linked: true,
        });
        match key_of(tail).and_then(|t| self.nodes.get_mut(t)) {
            Some(t) => t.next = link(Some(key)),
            None => {
                if let Some(c) = self.chains.get_mut(chain as usize) {
                    c.head = link(Some(key));
                }
            }
        }
        if let Some(c) = self.chains.get_mut(chain as usize) {
            c.tail = link(Some(key));
            c.len += 1;
        }
        self.linked += 1;
        Ok(key)
    }

    /// Takes `key` out of its chain's order, keeping its storage. Returns
    /// the chain it was linked in, `None` if it was not linked.
    pub(crate) fn unlink(&mut self, key: usize) -> Option<u32> {
        let (prev, next, chain) = match self.nodes.get_mut(key) {
            Some(n) if n.linked => {
                n.linked = false;
                let links = (key_of(n.prev), key_of(n.next), n.chain);
                n.prev = NIL;
                n.next = NIL;
                links
            }
            _ => return None,
        };
        match prev.and_then(|p| self.nodes.get_mut(p)) {
            Some(p) => p.next = link(next),
            None => {
                if let Some(c) = self.chains.get_mut(chain as usize) {
                    c.head = link(next);
                }
            }
        }
        match next.and_then(|n| self.nodes.get_mut(n)) {
            Some(n) => n.prev = link(prev),
            None => {
                if let Some(c) = self.chains.get_mut(chain as usize) {
                    c.tail = link(prev);
                }
            }
        }
        if let Some(c) = self.chains.get_mut(chain as usize) {
            c.len -= 1;
        }
        self.linked -= 1;
        Some(chain)
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

    /// The linked values of `chain` in FIFO order.
    pub(crate) fn iter_chain(&self, chain: u32) -> impl Iterator<Item = (usize, &T)> + '_ {
        let mut cursor = self.chains.get(chain as usize).and_then(|c| c.front());
        std::iter::from_fn(move || {
            let key = cursor?;
            let node = self.nodes.get(key)?;
            cursor = key_of(node.next);
            Some((key, &node.value))
        })
    }

    /// Keys of every linked node, chain by chain, each in FIFO order.
    pub(crate) fn keys(&self) -> Vec<usize> {
        let mut keys = Vec::with_capacity(self.linked);
        for (id, _) in self.chains() {
            keys.extend(self.iter_chain(id).map(|(k, _)| k));
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(l: &Lines<u32, ()>, chain: u32) -> Vec<u32> {
        l.iter_chain(chain).map(|(_, v)| *v).collect()
    }

    // proves: ADM-4 (FIFO order, with removal from anywhere)
    #[test]
    fn keeps_fifo_order_across_removals() {
        let mut l = Lines::new();
        let ch = l.open(()).unwrap();
        let a = l.push_back(ch, 1).unwrap();
        let b = l.push_back(ch, 2).unwrap();
        let c = l.push_back(ch, 3).unwrap();
        assert_eq!(values(&l, ch), [1, 2, 3]);
        assert_eq!(l.remove(b), Some(2));
        assert_eq!(values(&l, ch), [1, 3]);
        assert_eq!(l.unlink(a), Some(ch));
        assert_eq!(l.unlink(a), None);
        assert_eq!(l.chain(ch).unwrap().front(), Some(c));
        assert_eq!(l.get(a), Some(&1));
        assert_eq!(l.len(), 1);
        let d = l.push_back(ch, 4).unwrap();
        assert_eq!(values(&l, ch), [3, 4]);
        assert_eq!(l.remove(c), Some(3));
        assert_eq!(l.chain(ch).unwrap().front(), Some(d));
        assert_eq!(l.remove(a), Some(1));
        assert_eq!(l.remove(d), Some(4));
        assert!(l.is_empty());
        assert_eq!(l.chain(ch).unwrap().front(), None);
        assert_eq!(l.remove(d), None);
    }

    // proves: FAIR-1 (each flow's line keeps its own FIFO order while the
    // lines share one store)
    #[test]
    fn chains_are_independent_lines() {
        let mut l: Lines<u32, &str> = Lines::new();
        let x = l.open("x").unwrap();
        let y = l.open("y").unwrap();
        let x1 = l.push_back(x, 1).unwrap();
        let y1 = l.push_back(y, 10).unwrap();
        let x2 = l.push_back(x, 2).unwrap();
        let y2 = l.push_back(y, 20).unwrap();
        assert_eq!(values_of(&l, x), [1, 2]);
        assert_eq!(values_of(&l, y), [10, 20]);
        assert_eq!(l.len(), 4);
        assert_eq!(l.unlink(y1), Some(y));
        assert_eq!(l.chain(y).unwrap().len(), 1);
        assert_eq!(l.chain(x).unwrap().back(), Some(x2));
        assert_eq!(l.close(x), None, "a chain with nodes stays open");
        l.remove(x1);
        l.remove(x2);
        assert_eq!(l.close(x), Some("x"));
        assert_eq!(l.chain_of(y2), Some(y));
        assert_eq!(l.keys(), [y2]);
    }

    fn values_of(l: &Lines<u32, &str>, chain: u32) -> Vec<u32> {
        l.iter_chain(chain).map(|(_, v)| *v).collect()
    }
}
