//! Barrier alignment on a worker's inbox: what other workers send a pipeline on this worker,
//! sorted into what runs now and what waits for this worker's snapshot.
//!
//! A checkpoint's barrier from worker `w` says: every record `w` read before its snapshot point
//! is ahead of this in the inbox. From then on `w`'s batches are held (they come after the
//! point) until this worker has taken its snapshot; batches of workers whose barrier has not
//! come yet run as usual (they come before the point). The inbox is aligned once every other
//! worker's barrier has come (or its input has ended). This is Chandy-Lamport's snapshot with
//! aligned barriers, as Flink and Wallaroo take it.

/// Where a record came from: the source stream and its position there (stream 0: a source
/// without positions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rid {
    pub(crate) stream: u64,
    pub(crate) pos: u64,
}

/// What one worker hands another for a pipeline.
pub(super) enum Batch<K, T> {
    /// Records (key, item, read time, origin) from worker `.0`.
    Data(usize, Vec<(K, T, u64, Rid)>),
    /// Checkpoint `.1`'s barrier from worker `.0`.
    Barrier(usize, u64),
    /// Worker `.0`'s input has ended.
    End(usize),
    /// `.1` records from worker `.0` of another process: their read times and the batch as
    /// the pipeline's [`Wire`](super::wire::Wire) encoded it.
    Wire(usize, usize, Vec<u8>),
}

impl<K, T> Batch<K, T> {
    fn from(&self) -> usize {
        match self {
            Batch::Data(w, _) | Batch::Barrier(w, _) | Batch::End(w) | Batch::Wire(w, ..) => *w,
        }
    }
}

/// One pipeline's inbox on one worker, as checkpoints see it.
pub(super) struct Gate<B> {
    /// Workers whose barrier has come (by their number in the group).
    barred: u64,
    /// Workers whose input has ended.
    ended: u64,
    /// The epoch of the barriers that came.
    pub(super) epoch: u64,
    /// The last epoch this inbox reported aligned for.
    pub(super) reported: u64,
    /// Batches of barred workers, in arrival order.
    held: Vec<B>,
}

impl<B> Default for Gate<B> {
    fn default() -> Self {
        Gate {
            barred: 0,
            ended: 0,
            epoch: 0,
            reported: 0,
            held: Vec::new(),
        }
    }
}

impl<K, T> Gate<Batch<K, T>> {
    /// Sorts an arriving batch: returned to run now, or kept (a barrier, or held behind one).
    pub(super) fn admit(&mut self, b: Batch<K, T>) -> Option<Batch<K, T>> {
        let bit = 1u64 << b.from();
        if self.barred & bit != 0 {
            self.held.push(b);
            return None;
        }
        match b {
            Batch::Barrier(_, epoch) => {
                self.barred |= bit;
                self.epoch = epoch;
                None
            }
            Batch::End(_) => {
                self.ended |= bit;
                Some(b)
            }
            Batch::Data(..) | Batch::Wire(..) => Some(b),
        }
    }

    /// Whether every other worker's barrier for `epoch` has come or its input has ended (`me`
    /// and `workers` numbered across the group's processes).
    pub(super) fn aligned(&self, epoch: u64, me: usize, workers: usize) -> bool {
        let all = if workers >= 64 {
            u64::MAX
        } else {
            (1u64 << workers) - 1
        };
        let others = all & !(1u64 << me);
        let done = self.ended | if self.epoch == epoch { self.barred } else { 0 };
        others & !done == 0
    }

    /// Whether batches are held.
    pub(super) fn holding(&self) -> bool {
        self.barred != 0
    }

    /// This worker's snapshot is taken: the bars lift; the held batches, to run (through
    /// [`Gate::admit`] again) before anything newer.
    pub(super) fn release(&mut self) -> Vec<Batch<K, T>> {
        self.barred = 0;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    //! Three workers' inboxes under scripted arrivals, in every order the senders' queues
    //! allow: each worker's snapshot holds exactly the records sent before the barriers, and
    //! every record is applied once.
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// One sender's script: records before its barrier, then after.
    fn script(from: usize, before: u64, after: u64, base: u64) -> Vec<Batch<(), u64>> {
        let data = |v: u64| Batch::Data(from, vec![((), base + v, 0, Rid::default())]);
        let mut s: Vec<_> = (0..before).map(data).collect();
        s.push(Batch::Barrier(from, 1));
        s.extend((before..before + after).map(data));
        s
    }

    /// Every interleaving of the queues (each queue's order kept), as sequences of queue indexes.
    fn interleavings(lens: &[usize]) -> Vec<Vec<usize>> {
        if lens.iter().all(|&l| l == 0) {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            if l > 0 {
                let mut rest = lens.to_vec();
                rest[i] -= 1;
                for mut tail in interleavings(&rest) {
                    tail.insert(0, i);
                    out.push(tail);
                }
            }
        }
        out
    }

    #[test]
    fn a_snapshot_holds_exactly_what_came_before_every_barrier_in_any_order() {
        // Worker 0's inbox, fed by workers 1 and 2; the snapshot point comes at any step.
        let (me, workers) = (0, 3);
        let s1 = script(1, 2, 2, 100);
        let s2 = script(2, 1, 2, 200);
        let want_before: u64 = [100, 101, 200].iter().sum();
        let want_all: u64 = [100, 101, 102, 103, 200, 201, 202].iter().sum();
        let orders = interleavings(&[s1.len(), s2.len()]);
        assert_eq!(orders.len(), 126);
        for order in orders {
            let mut queues = [s1.iter(), s2.iter()];
            let mut gate: Gate<Batch<(), u64>> = Gate::default();
            let (mut state, mut snapshot) = (0u64, None);
            let apply = |b: Batch<(), u64>, state: &mut u64| {
                if let Batch::Data(_, v) = b {
                    *state += v.iter().map(|x| x.1).sum::<u64>();
                }
            };
            for q in order {
                let b = match queues[q].next().unwrap() {
                    Batch::Data(w, v) => Batch::Data(*w, v.clone()),
                    Batch::Barrier(w, e) => Batch::Barrier(*w, *e),
                    Batch::End(w) => Batch::End(*w),
                    Batch::Wire(..) => unreachable!("no wire batches in this script"),
                };
                if let Some(b) = gate.admit(b) {
                    apply(b, &mut state);
                }
                if snapshot.is_none() && gate.aligned(1, me, workers) {
                    snapshot = Some(state);
                    for b in gate.release() {
                        if let Some(b) = gate.admit(b) {
                            apply(b, &mut state);
                        }
                    }
                }
            }
            assert_eq!(snapshot, Some(want_before));
            assert_eq!(state, want_all);
            assert!(!gate.holding());
        }
    }

    #[test]
    fn an_ended_input_needs_no_barrier_and_other_epochs_do_not_count() {
        let mut gate: Gate<Batch<(), u64>> = Gate::default();
        assert!(gate.aligned(1, 0, 1), "alone, a worker is aligned at once");
        assert!(!gate.aligned(1, 0, 2));
        assert!(gate.admit(Batch::End(1)).is_some());
        assert!(gate.aligned(1, 0, 2));
        let mut gate: Gate<Batch<(), u64>> = Gate::default();
        assert!(gate.admit(Batch::Barrier(1, 4)).is_none());
        assert!(
            !gate.aligned(5, 0, 2),
            "a barrier of epoch 4 does not align epoch 5"
        );
        assert!(gate.aligned(4, 0, 2));
        // Held behind the barrier: the end too, until the release.
        assert!(gate.admit(Batch::End(1)).is_none());
        let held = gate.release();
        assert_eq!(held.len(), 1);
        assert!(!gate.holding());
    }
}
