//! A pipeline's head as the channel it reads sees it (below the worker's environment, the
//! sinks that write channels and the heads that read them).

/// A pipeline's head as the channel it reads sees it: items in, then the end.
pub(super) trait Input<T> {
    /// Runs `items` (each with its read time) through the steps, as one read of a source.
    fn items(&mut self, items: &mut Vec<(T, u64)>);
    /// One writer of the channel has ended on this worker (the input ends with the last).
    fn end(&mut self);
}
