//! Handlers: plain `fn`s and `async fn`s whose arguments are extractors and whose result is
//! anything [`IntoResponse`].
//!
//! A synchronous handler whose arguments all come from the head ([`FromParts`]) is answered with
//! `Reply::Ready`: no future, no box. A handler that is `async` or whose last argument reads the
//! body ([`FromBody`]) is answered with a future that runs on the connection's task.

use std::future::Future;
use std::marker::PhantomData;

use canter_rt::Reply;

use super::extract::{FromBody, FromParts, Parts};
use super::response::IntoResponse;

/// A function usable as a handler. `T` is an inference marker (sync or async, body or not, the
/// argument types); you never name it.
///
/// ```
/// use canter::{get, Path, Router};
///
/// fn sync_handler(Path(id): Path<u64>) -> String {
///     id.to_string()
/// }
/// async fn async_handler() -> &'static str {
///     "later"
/// }
/// let app = Router::new()
///     .route("/sync/{id}", get(sync_handler))
///     .route("/async", get(async_handler));
/// # let _ = app;
/// ```
pub trait Handler<T>: Clone + 'static {
    /// Runs the handler on a request.
    fn call(&self, parts: Parts) -> Reply;
}

/// Marker: the handler returns its response directly.
#[doc(hidden)]
#[derive(Debug)]
pub enum Now {}
/// Marker: the handler returns a future.
#[doc(hidden)]
#[derive(Debug)]
pub enum Later {}
/// Marker: every argument is [`FromParts`].
#[doc(hidden)]
#[derive(Debug)]
pub enum ViaParts {}
/// Marker: the last argument is [`FromBody`].
#[doc(hidden)]
#[derive(Debug)]
pub enum ViaBody {}

macro_rules! extract {
    ($parts:ident, $ty:ident) => {
        match $ty::from_parts(&mut $parts) {
            Ok(v) => v,
            Err(e) => return Reply::Ready(e.into_response()),
        }
    };
}

macro_rules! impl_handler {
    ($($ty:ident),*) => {
        impl<F, R, $($ty,)*> Handler<(Now, ViaParts, $($ty,)*)> for F
        where
            F: Fn($($ty,)*) -> R + Clone + 'static,
            R: IntoResponse,
            $($ty: FromParts,)*
        {
            #[inline]
            #[allow(non_snake_case, unused_mut, unused_variables)]
            fn call(&self, mut parts: Parts) -> Reply {
                $(let $ty = extract!(parts, $ty);)*
                Reply::Ready(self($($ty,)*).into_response())
            }
        }

        impl<F, Fut, R, $($ty,)*> Handler<(Later, ViaParts, $($ty,)*)> for F
        where
            F: Fn($($ty,)*) -> Fut + Clone + 'static,
            Fut: Future<Output = R> + 'static,
            R: IntoResponse,
            $($ty: FromParts,)*
        {
            #[inline]
            #[allow(non_snake_case, unused_mut, unused_variables)]
            fn call(&self, mut parts: Parts) -> Reply {
                $(let $ty = extract!(parts, $ty);)*
                let fut = self($($ty,)*);
                Reply::future(async move { fut.await.into_response() })
            }
        }
    };
}

macro_rules! impl_body_handler {
    ([$($ty:ident),*], $last:ident) => {
        impl<F, R, $($ty,)* $last> Handler<(Now, ViaBody, $($ty,)* $last)> for F
        where
            F: Fn($($ty,)* $last) -> R + Clone + 'static,
            R: IntoResponse,
            $($ty: FromParts + 'static,)*
            $last: FromBody,
        {
            #[inline]
            #[allow(non_snake_case, unused_mut)]
            fn call(&self, mut parts: Parts) -> Reply {
                $(let $ty = extract!(parts, $ty);)*
                let f = self.clone();
                Reply::future(async move {
                    match $last::from_body(parts).await {
                        Ok(last) => f($($ty,)* last).into_response(),
                        Err(e) => e.into_response(),
                    }
                })
            }
        }

        impl<F, Fut, R, $($ty,)* $last> Handler<(Later, ViaBody, $($ty,)* $last)> for F
        where
            F: Fn($($ty,)* $last) -> Fut + Clone + 'static,
            Fut: Future<Output = R> + 'static,
            R: IntoResponse,
            $($ty: FromParts + 'static,)*
            $last: FromBody,
        {
            #[inline]
            #[allow(non_snake_case, unused_mut)]
            fn call(&self, mut parts: Parts) -> Reply {
                $(let $ty = extract!(parts, $ty);)*
                let f = self.clone();
                Reply::future(async move {
                    match $last::from_body(parts).await {
                        Ok(last) => f($($ty,)* last).await.into_response(),
                        Err(e) => e.into_response(),
                    }
                })
            }
        }
    };
}

impl_handler!();
impl_handler!(T1);
impl_handler!(T1, T2);
impl_handler!(T1, T2, T3);
impl_handler!(T1, T2, T3, T4);
impl_handler!(T1, T2, T3, T4, T5);
impl_handler!(T1, T2, T3, T4, T5, T6);
impl_body_handler!([], T1);
impl_body_handler!([T1], T2);
impl_body_handler!([T1, T2], T3);
impl_body_handler!([T1, T2, T3], T4);
impl_body_handler!([T1, T2, T3, T4], T5);
impl_body_handler!([T1, T2, T3, T4, T5], T6);

/// A handler with its marker erased, stored in the routing table.
pub(crate) trait ErasedHandler {
    fn call(&self, parts: Parts) -> Reply;
}

pub(crate) struct Erased<H, T> {
    pub(crate) handler: H,
    pub(crate) _marker: PhantomData<fn() -> T>,
}

impl<H: Handler<T>, T: 'static> ErasedHandler for Erased<H, T> {
    #[inline]
    fn call(&self, parts: Parts) -> Reply {
        self.handler.call(parts)
    }
}
