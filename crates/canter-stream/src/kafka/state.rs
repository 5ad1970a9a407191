//! A task's keyed state, with the keys changed since the last commit.

use std::collections::HashMap;
use std::hash::Hash;

use crate::pipeline::state::FxBuild;

/// The state of the keys of one task (one partition of the inputs). Reads are free; an
/// [`Keyed::update`] marks its key, and the marked keys' latest values go to the changelog at
/// the next commit.
pub struct Keyed<K, S> {
    map: HashMap<K, (S, bool), FxBuild>,
    changed: Vec<K>,
    /// Keys removed since the last commit (tombstones in the changelog).
    removed: Vec<K>,
}

impl<K: Hash + Eq + Clone, S> Default for Keyed<K, S> {
    fn default() -> Self {
        Keyed {
            map: HashMap::default(),
            changed: Vec::new(),
            removed: Vec::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, S> Keyed<K, S> {
    /// A key's state, if it has one.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&S> {
        self.map.get(key).map(|(s, _)| s)
    }

    /// A key's state to change (made by `init` on the key's first sight); the key is written
    /// to the changelog at the next commit.
    #[inline]
    pub fn update(&mut self, key: K, init: impl FnOnce() -> S) -> &mut S {
        use std::collections::hash_map::Entry;
        match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                if !e.get().1 {
                    e.get_mut().1 = true;
                    self.changed.push(e.key().clone());
                }
                &mut e.into_mut().0
            }
            Entry::Vacant(e) => {
                self.changed.push(e.key().clone());
                &mut e.insert((init(), true)).0
            }
        }
    }

    /// Removes a key (a tombstone in the changelog at the next commit).
    pub fn remove(&mut self, key: &K) -> Option<S> {
        let (s, _) = self.map.remove(key)?;
        self.removed.push(key.clone());
        Some(s)
    }

    /// Keys with state.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// No key has state.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Calls `f` with each key changed since the last call and its state (`None`: removed,
    /// a tombstone); clears the marks.
    pub(crate) fn drain_changes(&mut self, mut f: impl FnMut(&K, Option<&S>)) {
        for k in self.changed.drain(..) {
            if let Some((s, mark)) = self.map.get_mut(&k) {
                if *mark {
                    *mark = false;
                    f(&k, Some(s));
                }
            }
        }
        for k in self.removed.drain(..) {
            if !self.map.contains_key(&k) {
                f(&k, None);
            }
        }
    }

    /// Sets a key's state from the changelog (not marked).
    pub(crate) fn restore(&mut self, key: K, state: Option<S>) {
        match state {
            Some(s) => {
                self.map.insert(key, (s, false));
            }
            None => {
                self.map.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(k: &mut Keyed<u32, u64>) -> Vec<(u32, Option<u64>)> {
        let mut v = Vec::new();
        k.drain_changes(|key, s| v.push((*key, s.copied())));
        v.sort();
        v
    }

    #[test]
    fn each_changed_key_goes_to_the_changelog_once_per_commit_with_its_last_value() {
        let mut k: Keyed<u32, u64> = Keyed::default();
        *k.update(1, || 0) += 1;
        *k.update(1, || 0) += 1;
        *k.update(2, || 10) += 1;
        assert_eq!(k.get(&1), Some(&2));
        assert_eq!(changes(&mut k), vec![(1, Some(2)), (2, Some(11))]);
        // Nothing changed since: nothing to write.
        assert_eq!(changes(&mut k), vec![]);
        // Reads don't mark; a removed key is a tombstone; a restored key is not marked.
        let _ = k.get(&2);
        k.remove(&1);
        k.restore(3, Some(30));
        assert_eq!(changes(&mut k), vec![(1, None)]);
        assert_eq!(k.get(&3), Some(&30));
        // Removed, then made again before the commit: its value, not a tombstone.
        k.remove(&2);
        *k.update(2, || 5) += 0;
        assert_eq!(changes(&mut k), vec![(2, Some(5))]);
        k.restore(3, None);
        assert_eq!((k.get(&3), k.len()), (None, 1));
    }
}
