//! A deadline for asynchronous handlers.

use std::time::Duration;

use canter_rt::http::StatusCode;
use canter_rt::{Reply, Request};

use super::{Middleware, Next};
use crate::app::{IntoResponse, Rejection};

/// Answers 503 (with a JSON error body) when the inner service's future has not produced a
/// response within the duration; the future is dropped. A synchronous reply is already complete
/// and passes untouched. The runtime's own `handler_timeout` remains the server-wide bound;
/// this layer sets a tighter one for an app or part of it.
///
/// ```
/// use std::time::Duration;
/// use canter::middleware::Timeout;
///
/// let app = canter::Router::new().layer(Timeout::new(Duration::from_millis(250)));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Timeout {
    limit: Duration,
}

impl Timeout {
    /// A timeout of `limit`.
    pub fn new(limit: Duration) -> Timeout {
        Timeout { limit }
    }
}

impl Middleware for Timeout {
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        match next.run(req) {
            Reply::Ready(res) => Reply::Ready(res),
            Reply::Pending(fut) => {
                let limit = self.limit;
                Reply::future(async move {
                    match tokio::time::timeout(limit, fut).await {
                        Ok(res) => res,
                        Err(_) => {
                            tracing::warn!(target: "canter::timeout", ?limit, "handler timed out");
                            Rejection::new(StatusCode::SERVICE_UNAVAILABLE, "handler timed out")
                                .into_response()
                        }
                    }
                })
            }
        }
    }
}
