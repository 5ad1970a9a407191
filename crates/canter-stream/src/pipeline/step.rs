//! Stateless steps, fused: each step calls the next directly, with no queue between them.

use std::marker::PhantomData;

/// A chain of stateless steps taking `I`: pushes each item through every step and hands what
/// comes out of the last one to `emit`. Built by [`Pipeline`](super::Pipeline)'s `map`,
/// `filter` and `flat_map`; one call per item, all steps inlined into it.
pub trait Step<I>: Clone + Send + 'static {
    /// What the chain's last step gives.
    type Out;
    /// Runs `item` through the chain.
    fn push<E: FnMut(Self::Out)>(&mut self, item: I, emit: &mut E);
    /// Hands on what the chain's steps hold back at the end of a read (a front end's step that
    /// calls its function once per batch of items); nothing for the steps here.
    #[inline]
    fn flush<E: FnMut(Self::Out)>(&mut self, emit: &mut E) {
        let _ = emit;
    }
    /// Items each step has taken so far, first step first.
    fn counts(&self, out: &mut Vec<u64>);
    /// Each step's name, first step first.
    fn names(&self, out: &mut Vec<String>);
}

/// The empty chain: items pass unchanged.
pub struct Id<T>(PhantomData<fn(T) -> T>);

impl<T> Id<T> {
    pub(crate) fn new() -> Self {
        Id(PhantomData)
    }
}

impl<T> Clone for Id<T> {
    fn clone(&self) -> Self {
        Id(PhantomData)
    }
}

impl<T: 'static> Step<T> for Id<T> {
    type Out = T;
    #[inline]
    fn push<E: FnMut(T)>(&mut self, item: T, emit: &mut E) {
        emit(item)
    }
    fn counts(&self, _: &mut Vec<u64>) {}
    fn names(&self, _: &mut Vec<String>) {}
}

/// `chain`, then `f` on each item.
pub struct Map<C, F, O> {
    chain: C,
    f: F,
    n: u64,
    _o: PhantomData<fn() -> O>,
}

impl<C: Clone, F: Clone, O> Clone for Map<C, F, O> {
    fn clone(&self) -> Self {
        Map {
            chain: self.chain.clone(),
            f: self.f.clone(),
            n: 0,
            _o: PhantomData,
        }
    }
}

impl<C, F, O> Map<C, F, O> {
    pub(crate) fn new(chain: C, f: F) -> Self {
        Map {
            chain,
            f,
            n: 0,
            _o: PhantomData,
        }
    }
}

impl<I, C, F, O> Step<I> for Map<C, F, O>
where
    C: Step<I>,
    F: FnMut(C::Out) -> O + Clone + Send + 'static,
    O: 'static,
{
    type Out = O;
    #[inline]
    fn push<E: FnMut(O)>(&mut self, item: I, emit: &mut E) {
        let Map { chain, f, n, .. } = self;
        chain.push(item, &mut |x| {
            *n += 1;
            emit(f(x))
        })
    }
    #[inline]
    fn flush<E: FnMut(O)>(&mut self, emit: &mut E) {
        let Map { chain, f, n, .. } = self;
        chain.flush(&mut |x| {
            *n += 1;
            emit(f(x))
        })
    }
    fn counts(&self, out: &mut Vec<u64>) {
        self.chain.counts(out);
        out.push(self.n);
    }
    fn names(&self, out: &mut Vec<String>) {
        self.chain.names(out);
        out.push(format!("{}:map", out.len() + 1));
    }
}

/// `chain`, then only the items `f` keeps.
pub struct Filter<C, F> {
    chain: C,
    f: F,
    n: u64,
}

impl<C: Clone, F: Clone> Clone for Filter<C, F> {
    fn clone(&self) -> Self {
        Filter {
            chain: self.chain.clone(),
            f: self.f.clone(),
            n: 0,
        }
    }
}

impl<C, F> Filter<C, F> {
    pub(crate) fn new(chain: C, f: F) -> Self {
        Filter { chain, f, n: 0 }
    }
}

impl<I, C, F> Step<I> for Filter<C, F>
where
    C: Step<I>,
    F: FnMut(&C::Out) -> bool + Clone + Send + 'static,
{
    type Out = C::Out;
    #[inline]
    fn push<E: FnMut(C::Out)>(&mut self, item: I, emit: &mut E) {
        let Filter { chain, f, n } = self;
        chain.push(item, &mut |x| {
            *n += 1;
            if f(&x) {
                emit(x)
            }
        })
    }
    #[inline]
    fn flush<E: FnMut(C::Out)>(&mut self, emit: &mut E) {
        let Filter { chain, f, n } = self;
        chain.flush(&mut |x| {
            *n += 1;
            if f(&x) {
                emit(x)
            }
        })
    }
    fn counts(&self, out: &mut Vec<u64>) {
        self.chain.counts(out);
        out.push(self.n);
    }
    fn names(&self, out: &mut Vec<String>) {
        self.chain.names(out);
        out.push(format!("{}:filter", out.len() + 1));
    }
}

/// `chain`, then every item `f` makes of each item.
pub struct FlatMap<C, F, It> {
    chain: C,
    f: F,
    n: u64,
    _it: PhantomData<fn() -> It>,
}

impl<C: Clone, F: Clone, It> Clone for FlatMap<C, F, It> {
    fn clone(&self) -> Self {
        FlatMap {
            chain: self.chain.clone(),
            f: self.f.clone(),
            n: 0,
            _it: PhantomData,
        }
    }
}

impl<C, F, It> FlatMap<C, F, It> {
    pub(crate) fn new(chain: C, f: F) -> Self {
        FlatMap {
            chain,
            f,
            n: 0,
            _it: PhantomData,
        }
    }
}

impl<I, C, F, It> Step<I> for FlatMap<C, F, It>
where
    C: Step<I>,
    F: FnMut(C::Out) -> It + Clone + Send + 'static,
    It: IntoIterator + 'static,
{
    type Out = It::Item;
    #[inline]
    fn push<E: FnMut(It::Item)>(&mut self, item: I, emit: &mut E) {
        let FlatMap { chain, f, n, .. } = self;
        chain.push(item, &mut |x| {
            *n += 1;
            for y in f(x) {
                emit(y)
            }
        })
    }
    #[inline]
    fn flush<E: FnMut(It::Item)>(&mut self, emit: &mut E) {
        let FlatMap { chain, f, n, .. } = self;
        chain.flush(&mut |x| {
            *n += 1;
            for y in f(x) {
                emit(y)
            }
        })
    }
    fn counts(&self, out: &mut Vec<u64>) {
        self.chain.counts(out);
        out.push(self.n);
    }
    fn names(&self, out: &mut Vec<String>) {
        self.chain.names(out);
        out.push(format!("{}:flat_map", out.len() + 1));
    }
}

/// `chain`, then the chain `next` on what it gives: steps written as a [`Step`] of their own
/// (a front end's, say) joined to a pipeline's.
#[derive(Clone)]
pub struct Then<C, N> {
    chain: C,
    next: N,
}

impl<C, N> Then<C, N> {
    pub(crate) fn new(chain: C, next: N) -> Self {
        Then { chain, next }
    }
}

impl<I, C, N> Step<I> for Then<C, N>
where
    C: Step<I>,
    N: Step<C::Out>,
{
    type Out = N::Out;
    #[inline]
    fn push<E: FnMut(N::Out)>(&mut self, item: I, emit: &mut E) {
        let Then { chain, next } = self;
        chain.push(item, &mut |x| next.push(x, emit))
    }
    #[inline]
    fn flush<E: FnMut(N::Out)>(&mut self, emit: &mut E) {
        let Then { chain, next } = self;
        chain.flush(&mut |x| next.push(x, emit));
        next.flush(emit)
    }
    fn counts(&self, out: &mut Vec<u64>) {
        self.chain.counts(out);
        self.next.counts(out);
    }
    fn names(&self, out: &mut Vec<String>) {
        self.chain.names(out);
        self.next.names(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_fuse_into_one_call_and_count_what_each_took() {
        let chain = Id::<u32>::new();
        let chain = Map::new(chain, |x: u32| x * 10);
        let chain = Filter::new(chain, |x: &u32| *x != 20);
        let mut chain = FlatMap::new(chain, |x: u32| [x, x + 1]);
        let mut out = Vec::new();
        for i in 1..=3 {
            chain.push(i, &mut |y| out.push(y));
        }
        assert_eq!(out, [10, 11, 30, 31]);
        let mut counts = Vec::new();
        chain.counts(&mut counts);
        assert_eq!(counts, [3, 3, 2]);
        let mut names = Vec::new();
        chain.names(&mut names);
        assert_eq!(names, ["1:map", "2:filter", "3:flat_map"]);
    }

    #[test]
    fn then_joins_two_chains() {
        let first = Map::new(Id::<u32>::new(), |x: u32| x + 1);
        let second = Filter::new(Id::<u32>::new(), |x: &u32| x.is_multiple_of(2));
        let mut chain = Then::new(first, second);
        let mut out = Vec::new();
        for i in 0..6 {
            chain.push(i, &mut |y| out.push(y));
        }
        assert_eq!(out, [2, 4, 6]);
        let mut counts = Vec::new();
        chain.counts(&mut counts);
        assert_eq!(counts, [6, 6]);
    }

    /// A step that holds its items until the end of the read, as a front end's batch step.
    #[derive(Clone, Default)]
    struct Held(Vec<u32>);

    impl Step<u32> for Held {
        type Out = u32;
        fn push<E: FnMut(u32)>(&mut self, item: u32, _emit: &mut E) {
            self.0.push(item)
        }
        fn flush<E: FnMut(u32)>(&mut self, emit: &mut E) {
            for x in self.0.drain(..) {
                emit(x)
            }
        }
        fn counts(&self, _: &mut Vec<u64>) {}
        fn names(&self, _: &mut Vec<String>) {}
    }

    #[test]
    fn what_a_step_holds_comes_out_on_flush_through_the_steps_after_it() {
        // A held step first, then a map; a map, then a held step, then a filter.
        let mut first = Map::new(Then::new(Id::<u32>::new(), Held::default()), |x: u32| x * 2);
        let mut later = Filter::new(
            Then::new(Map::new(Id::<u32>::new(), |x: u32| x + 1), Held::default()),
            |x: &u32| *x != 3,
        );
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 1..=3 {
            first.push(i, &mut |y| a.push(y));
            later.push(i, &mut |y| b.push(y));
        }
        assert!(a.is_empty() && b.is_empty(), "held until the flush");
        first.flush(&mut |y| a.push(y));
        later.flush(&mut |y| b.push(y));
        assert_eq!(a, [2, 4, 6]);
        assert_eq!(b, [2, 4]);
        let mut counts = Vec::new();
        later.counts(&mut counts);
        assert_eq!(counts, [3, 3], "the filter counts what the flush brought");
        first.flush(&mut |y| a.push(y));
        assert_eq!(a.len(), 3, "a second flush has nothing");
    }
}
