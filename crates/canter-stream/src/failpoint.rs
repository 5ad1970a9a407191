//! Fault tests' hooks: named points where a process can be made to crash.

/// A fault test's hook: `CANTER_FAILPOINT=NAME:N` ends the process (abort, as a crash would)
/// the N-th time a worker passes the point NAME: `commit-before-offsets` (results and
/// changelog flushed, offsets not yet in the transaction), `commit-before-end` (offsets in the
/// transaction, not committed), `hand-over` (tasks revoked, before their commit) on Kafka;
/// `checkpoint-parts` (every worker took its snapshot, the file is not written) and
/// `checkpoint-write` (half the file written, not renamed) in a TCP pipeline's checkpoints.
/// Read once at start; unset, a point costs a comparison.
pub(crate) struct Failpoint {
    at: Option<(String, u64)>,
}

impl Failpoint {
    pub(crate) fn from_env() -> Failpoint {
        let at = std::env::var("CANTER_FAILPOINT").ok().and_then(|v| {
            let (name, n) = v.split_once(':')?;
            Some((name.to_owned(), n.parse().ok()?))
        });
        Failpoint { at }
    }

    pub(crate) fn pass(&mut self, name: &str) {
        if let Some((point, left)) = self.at.as_mut() {
            if point == name {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    tracing::error!(
                        point = name,
                        "CANTER_FAILPOINT reached: aborting the process"
                    );
                    std::process::abort();
                }
            }
        }
    }
}
