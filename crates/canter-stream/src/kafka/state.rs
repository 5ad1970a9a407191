//! A task's keyed state, with the keys changed since the last commit.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::pipeline::state::FxBuild;

/// The state of the keys of one task (one partition of the inputs). Reads are free; an
/// [`Keyed::update`] marks its key, and the marked keys' latest values go to the changelog at
/// the next commit. A key may also have a wake-up time ([`Keyed::wake_at`]): the worker then
/// calls the task's [`KeyedTask::wake`](super::KeyedTask::wake) for it once that time comes.
pub struct Keyed<K, S> {
    map: HashMap<K, (S, bool), FxBuild>,
    changed: Vec<K>,
    /// Keys removed since the last commit (tombstones in the changelog).
    removed: Vec<K>,
    /// Each key's wake-up (ns of system time since the Unix epoch), and the keys by time.
    wakes: HashMap<K, u64, FxBuild>,
    by_time: BTreeMap<u64, Vec<K>>,
}

impl<K: Hash + Eq + Clone, S> Default for Keyed<K, S> {
    fn default() -> Self {
        Keyed {
            map: HashMap::default(),
            changed: Vec::new(),
            removed: Vec::new(),
            wakes: HashMap::default(),
            by_time: BTreeMap::new(),
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

    /// Removes a key (a tombstone in the changelog at the next commit), and its wake-up.
    pub fn remove(&mut self, key: &K) -> Option<S> {
        self.wake_at(key, None);
        let (s, _) = self.map.remove(key)?;
        self.removed.push(key.clone());
        Some(s)
    }

    /// Sets (or with None clears) when the task's [`wake`](super::KeyedTask::wake) runs for
    /// `key`: ns of system time since the Unix epoch (a time past runs at the worker's next
    /// turn). Wake-ups are not in the changelog: a task restored sets them again
    /// ([`KeyedTask::restored`](super::KeyedTask::restored)).
    pub fn wake_at(&mut self, key: &K, at: Option<u64>) {
        let old = match at {
            Some(at) => self.wakes.insert(key.clone(), at),
            None => self.wakes.remove(key),
        };
        if old == at {
            return;
        }
        if let Some(old) = old {
            if let Some(keys) = self.by_time.get_mut(&old) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_time.remove(&old);
                }
            }
        }
        if let Some(at) = at {
            self.by_time.entry(at).or_default().push(key.clone());
        }
    }

    /// The keys whose wake-up time is at or before `now`, earliest first; their wake-ups are
    /// cleared.
    pub(crate) fn due(&mut self, now: u64) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(entry) = self.by_time.first_entry() {
            if *entry.key() > now {
                break;
            }
            for k in entry.remove() {
                self.wakes.remove(&k);
                due.push(k);
            }
        }
        due
    }

    /// Whether any key has a wake-up.
    #[inline]
    pub(crate) fn has_wakes(&self) -> bool {
        !self.by_time.is_empty()
    }

    /// The keys with state.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
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
                self.wake_at(&key, None);
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

    #[test]
    fn wake_ups_come_due_in_time_order_once_and_go_with_their_key() {
        let mut k: Keyed<u32, u64> = Keyed::default();
        for key in 1..=4 {
            *k.update(key, || 0) += 1;
        }
        k.wake_at(&1, Some(30));
        k.wake_at(&2, Some(10));
        k.wake_at(&3, Some(10));
        k.wake_at(&4, Some(20));
        // Moved later, and cleared with its key.
        k.wake_at(&2, Some(40));
        k.remove(&4);
        assert!(k.due(9).is_empty());
        assert_eq!(k.due(30), vec![3, 1]);
        assert!(k.due(30).is_empty(), "each wake-up comes once");
        assert!(k.has_wakes());
        k.restore(2, None);
        assert!(!k.has_wakes());
        assert!(k.due(u64::MAX).is_empty());
    }
}
