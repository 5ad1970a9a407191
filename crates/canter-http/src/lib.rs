//! What canter's HTTP engines (canter-h1, canter-h2) and its runtime share, with no protocol
//! of their own: the [`RequestHead`] every protocol hands the application, the size [`Limits`]
//! a request is held to, the [`Timeouts`] of a connection's phases, and the [`ConfigError`]
//! every settings builder of the project returns.

mod head;
mod limits;

pub use head::{
    alnum_and, BodyKind, FieldsError, HeadParts, Method, PathAndQuery, RequestHead, Span, Version,
    TCHAR,
};
pub use limits::{ConfigError, Limits, LimitsBuilder, Timeouts, TimeoutsBuilder};
