//! PostgreSQL on every worker: each worker owns its connections, prepares its statements once per
//! connection and pipelines the queries of its requests over them.
//!
//! The runtime is thread-per-core, so the client is too: [`Db::start`] runs on a worker's thread
//! (inside the factory given to [`Server::serve`](canter_rt::Server::serve)) and opens
//! [`DbConfig::connections`] connections for that worker alone, with no pool shared across threads
//! on the request path. A query is queued as soon as its future is first polled, so independent
//! queries awaited together ([`Db::query_each`], or `futures_util::future::try_join_all`) leave in
//! one write; requests of one worker share its connections the same way. Each query takes the
//! next connection, round robin; queries that belong together take one with
//! [`Db::connection`] and go out in order on it.
//!
//! The client is canter's own (`wire`): a query is encoded straight into its connection's
//! output buffer and waits in the connection's queue, and one driver task per connection writes
//! the buffer once the worker's ready tasks have run (or, while earlier queries are in flight,
//! once their last answer is in: the database answers in order anyway, and the queries of many
//! requests then cost it one read) and hands each answer to its query, in order. Each query is
//! its own `Bind`/`Execute`/`Sync`. Logins: trust, password, md5 and SCRAM-SHA-256, over TCP or
//! a Unix socket, and over TLS (rustls) as `sslmode` asks: `disable`; `prefer` (the default,
//! as in libpq: TLS when the server offers it, the certificate not checked); `require` (TLS or
//! no connection, the certificate not checked); `verify-full` (TLS, the certificate checked
//! against `sslrootcert`, a PEM file, or the Mozilla root store without it, and against the host
//! name). `verify-ca` is refused: use `verify-full`. Connection strings are otherwise parsed by
//! `tokio_postgres::Config`, and values converted by `postgres-types` ([`ToSql`], [`FromSql`]).
//!
//! Faults are answers, never hangs: with no live connection a query fails at once with
//! [`DbError::Unavailable`] (503), a query that takes longer than
//! [`DbConfig::query_timeout`] fails with [`DbError::Timeout`] (503; late by at most an eighth
//! of the timeout, checked periodically rather than per query), and an error from the
//! server is [`DbError::Query`] (500) with the connection still usable. A broken connection is
//! reopened in the background with exponential backoff, and its statements prepared again.
//!
//! ```no_run
//! use canter::db::{Db, DbConfig, DbError};
//! use canter::{get, Router, State};
//!
//! let mut config = DbConfig::new("postgres://app@127.0.0.1/app").unwrap();
//! let by_id = config.prepare("SELECT randomnumber FROM world WHERE id = $1");
//! let config = std::sync::Arc::new(config);
//!
//! async fn number(State((db, by_id)): State<(Db, canter::db::Stmt)>) -> Result<String, DbError> {
//!     let row = db.query_one(by_id, &[&1_i32]).await?;
//!     Ok(row.get::<i32>(0).to_string())
//! }
//! canter::rt::Server::bind(canter::rt::Config::default())
//!     .unwrap()
//!     .serve(move |_worker| {
//!         Router::new()
//!             .route("/number", get(number))
//!             .with_state((Db::start(config.clone()), by_id))
//!     })
//!     .unwrap();
//! ```

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use canter_rt::http::StatusCode;
use canter_rt::Response;
use futures_util::future::try_join_all;
pub use postgres_types::{FromSql, ToSql, Type};

pub use wire::{PgError, Row};

mod wire;

use crate::app::IntoResponse;

/// A prepared statement of a [`DbConfig`]: prepared on every connection when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stmt(usize);

/// Where the database is, how many connections each worker keeps, the time limits, and the
/// statements to prepare on each connection.
#[derive(Clone)]
pub struct DbConfig {
    pg: tokio_postgres::Config,
    tls: DbTls,
    connections: usize,
    query_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    statements: Vec<String>,
}

impl fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password stays out of logs: tokio_postgres::Config's Debug redacts it.
        f.debug_struct("DbConfig")
            .field("pg", &self.pg)
            .field("connections", &self.connections)
            .field("query_timeout", &self.query_timeout)
            .field("statements", &self.statements.len())
            .finish()
    }
}

impl DbConfig {
    /// A configuration from a connection string (`postgres://user:password@host:port/db` or
    /// `host=/run/postgresql user=app dbname=app`). Defaults: 2 connections per worker, a 3 s
    /// connect timeout, a 5 s query timeout, reconnection backoff from 50 ms to 2 s.
    ///
    /// `sslmode` and `sslrootcert` choose TLS (see the module doc); a `sslrootcert` that cannot
    /// be read is an error here, not at the first connection.
    pub fn new(url: &str) -> Result<DbConfig, DbError> {
        let (rest, mode, root) = take_tls_options(url)?;
        let mut pg = tokio_postgres::Config::from_str(&rest).map_err(DbError::Config)?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(3));
        }
        let tls = DbTls::new(mode.as_deref().unwrap_or("prefer"), root.as_deref())?;
        Ok(DbConfig {
            pg,
            tls,
            connections: 2,
            query_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            statements: Vec::new(),
        })
    }

    /// Connections each worker opens (at least 1).
    pub fn connections(mut self, n: usize) -> DbConfig {
        self.connections = n.max(1);
        self
    }

    /// How long connecting (TCP, start-up and authentication) may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> DbConfig {
        self.pg.connect_timeout(timeout);
        self
    }

    /// How long a query may wait for its answer before it fails with [`DbError::Timeout`]. It is
    /// kept by one timer per connection: when the oldest unanswered query on a connection has
    /// waited this long, it and every query sent after it on that connection fail (the database
    /// answers in order, so none of them could be answered sooner). The timer checks every
    /// eighth of the timeout (at most every second), so a timeout is late by at most that.
    pub fn query_timeout(mut self, timeout: Duration) -> DbConfig {
        self.query_timeout = timeout;
        self
    }

    /// The shortest and longest waits between attempts to reopen a broken connection (doubling
    /// from one to the other).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> DbConfig {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }

    /// Adds a statement to prepare on every connection; its handle is valid for any [`Db`]
    /// started from this configuration.
    pub fn prepare(&mut self, sql: &str) -> Stmt {
        self.statements.push(sql.to_owned());
        Stmt(self.statements.len() - 1)
    }

    /// Whether connections use TLS, and how they check the server.
    pub fn tls_mode(&self) -> &'static str {
        match &self.tls {
            DbTls::Disable => "disable",
            DbTls::Prefer(_) => "prefer",
            DbTls::Require(_) => "require",
            DbTls::VerifyFull(_) => "verify-full",
        }
    }

    /// The connection settings as `tokio_postgres` parsed them (without `sslmode` and
    /// `sslrootcert`, which [`DbConfig::tls_mode`] reads).
    pub fn pg(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    /// The database name, for logs.
    pub fn dbname(&self) -> &str {
        self.pg.get_dbname().unwrap_or("")
    }
}

/// TLS to the database, from `sslmode` and `sslrootcert`.
#[derive(Clone)]
pub(crate) enum DbTls {
    /// Plain connections only.
    Disable,
    /// TLS when the server offers it; the certificate is not checked.
    Prefer(canter_rt::ClientTls),
    /// TLS or no connection; the certificate is not checked.
    Require(canter_rt::ClientTls),
    /// TLS or no connection; the certificate is checked, with the host name.
    VerifyFull(canter_rt::ClientTls),
}

impl DbTls {
    fn new(mode: &str, root: Option<&str>) -> Result<DbTls, DbError> {
        let bad = |why: String| Err(DbError::Tls(why));
        match mode {
            "disable" => Ok(DbTls::Disable),
            "allow" | "prefer" => Ok(DbTls::Prefer(canter_rt::ClientTls::insecure(&[]))),
            "require" => Ok(DbTls::Require(canter_rt::ClientTls::insecure(&[]))),
            "verify-full" => Ok(DbTls::VerifyFull(match root {
                Some(pem) => canter_rt::ClientTls::ca_file(pem, &[])
                    .map_err(|e| DbError::Tls(format!("sslrootcert: {e}")))?,
                None => canter_rt::ClientTls::webpki_roots(&[]),
            })),
            "verify-ca" => bad(
                "sslmode=verify-ca is not supported: use verify-full (the certificate is then \
                 checked against the host name too) or require"
                    .to_owned(),
            ),
            other => bad(format!(
                "sslmode={other:?}: expected disable, prefer, require or verify-full"
            )),
        }
    }

    /// The settings for a connection, and whether TLS is required; `None`: plain.
    pub(crate) fn client(&self) -> Option<(&canter_rt::ClientTls, bool)> {
        match self {
            DbTls::Disable => None,
            DbTls::Prefer(c) => Some((c, false)),
            DbTls::Require(c) | DbTls::VerifyFull(c) => Some((c, true)),
        }
    }
}

/// Takes `sslmode` and `sslrootcert` out of a connection string (URL or `key=value` form), which
/// canter reads itself: `tokio_postgres::Config` knows only three modes, and no root file.
fn take_tls_options(url: &str) -> Result<(String, Option<String>, Option<String>), DbError> {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            mode = Some(value);
            true
        }
        "sslrootcert" => {
            root = Some(value);
            true
        }
        _ => false,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), None, None));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| DbError::Tls(format!("{key}: not UTF-8")))?
                .into_owned();
            if !take(key, value) {
                kept.push(pair);
            }
        }
        let rest = match kept.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", kept.join("&")),
        };
        return Ok((rest, mode, root));
    }
    let mut kept = Vec::new();
    for word in url.split_whitespace() {
        let taken = word
            .split_once('=')
            .is_some_and(|(key, value)| take(key, value.trim_matches('\'').to_owned()));
        if !taken {
            kept.push(word);
        }
    }
    Ok((kept.join(" "), mode, root))
}

/// Why a query has no answer. As a response: 503 when the database cannot be reached in time
/// (so a balancer retries elsewhere), 500 when it answered with an error; the cause is logged
/// (at most one line per second per worker and kind, with the count of failures since the last
/// line).
#[derive(Debug)]
pub enum DbError {
    /// The connection string does not parse.
    Config(tokio_postgres::Error),
    /// The TLS settings (`sslmode`, `sslrootcert`) are wrong.
    Tls(String),
    /// No connection of this worker is open (the database is down or unreachable).
    Unavailable,
    /// The query got no answer within the query timeout.
    Timeout,
    /// The connection broke while the query was in flight.
    Closed(PgError),
    /// The database answered with an error (the connection stays usable), or a parameter or
    /// a column did not convert.
    Query(PgError),
}

impl DbError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            DbError::Unavailable | DbError::Timeout | DbError::Closed(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            DbError::Config(_) | DbError::Tls(_) | DbError::Query(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// A failed query: [`DbError::Timeout`] at the query timeout, [`DbError::Closed`] when its
    /// connection has ended.
    fn from_pg(e: PgError, conn: &wire::Conn) -> DbError {
        if e.is_timeout() {
            DbError::Timeout
        } else if conn.is_closed() {
            DbError::Closed(e)
        } else {
            DbError::Query(e)
        }
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbError::Config(e) => write!(f, "bad database configuration: {e}"),
            DbError::Tls(e) => write!(f, "bad database TLS configuration: {e}"),
            DbError::Unavailable => f.write_str("no database connection is open"),
            DbError::Timeout => f.write_str("the database did not answer in time"),
            DbError::Closed(e) => write!(f, "the database connection broke: {e}"),
            DbError::Query(e) => write!(f, "query failed: {e}"),
        }
    }
}

impl std::error::Error for DbError {}

thread_local! {
    /// Per kind of failure: when this worker last logged one, and how many it has not logged
    /// since.
    static LAST_LOGGED: [Cell<(Option<std::time::Instant>, u64)>; 5] =
        const { [const { Cell::new((None, 0)) }; 5] };
}

/// Logs a failed database request: at most one line per second per worker and kind of failure
/// (an outage under load fails thousands of requests a second), each saying how many it stands
/// for.
fn log_failure(error: &DbError) {
    let kind = match error {
        DbError::Config(_) | DbError::Tls(_) => 0,
        DbError::Unavailable => 1,
        DbError::Timeout => 2,
        DbError::Closed(_) => 3,
        DbError::Query(_) => 4,
    };
    LAST_LOGGED.with(|cells| {
        let cell = &cells[kind];
        let (last, unlogged) = cell.get();
        let now = std::time::Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            cell.set((last, unlogged + 1));
            return;
        }
        cell.set((Some(now), 0));
        tracing::error!(target: "canter::db", error = %error, more_since_last_line = unlogged, "database request failed");
    });
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        let status = self.status();
        log_failure(&self);
        let message = match status {
            StatusCode::SERVICE_UNAVAILABLE => "database unavailable\n",
            _ => "database error\n",
        };
        (status, message).into_response()
    }
}

/// One worker's database client: its connections and their prepared statements. Cheap to clone
/// (a reference count); not `Send`, as it belongs to the worker that started it.
#[derive(Clone)]
pub struct Db(Rc<Inner>);

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("connections", &self.0.slots.len())
            .field("open", &self.open_connections())
            .finish()
    }
}

struct Inner {
    config: Arc<DbConfig>,
    slots: Vec<RefCell<Option<Rc<Live>>>>,
    next: Cell<usize>,
}

/// An open connection and its statements, in the order of [`DbConfig::prepare`].
struct Live {
    conn: Rc<wire::Conn>,
    statements: Vec<wire::Statement>,
}

impl Drop for Live {
    fn drop(&mut self) {
        // The worker's client let go of the connection: its driver closes it.
        self.conn.release();
    }
}

impl Db {
    /// Starts this worker's client: one background task per connection opens it, prepares the
    /// statements, and reopens it with backoff whenever it breaks. Returns at once; queries fail
    /// with [`DbError::Unavailable`] until a connection is open.
    ///
    /// Must run on a worker thread (it spawns local tasks), as the service factory does.
    pub fn start(config: Arc<DbConfig>) -> Db {
        let slots = (0..config.connections)
            .map(|_| RefCell::new(None))
            .collect();
        let db = Db(Rc::new(Inner {
            config,
            slots,
            next: Cell::new(0),
        }));
        for i in 0..db.0.slots.len() {
            tokio::task::spawn_local(keep_open(Rc::downgrade(&db.0), i));
        }
        db
    }

    /// How many of this worker's connections are open.
    pub fn open_connections(&self) -> usize {
        self.0
            .slots
            .iter()
            .filter(|s| s.borrow().as_ref().is_some_and(|l| !l.conn.is_closed()))
            .count()
    }

    /// The next open connection, round robin.
    fn live(&self) -> Result<Rc<Live>, DbError> {
        let n = self.0.slots.len();
        let start = self.0.next.get();
        for k in 0..n {
            let i = (start + k) % n;
            if let Some(live) = &*self.0.slots[i].borrow() {
                if !live.conn.is_closed() {
                    self.0.next.set((i + 1) % n);
                    return Ok(live.clone());
                }
            }
        }
        Err(DbError::Unavailable)
    }

    /// The next open connection (round robin), for queries that belong together: they go
    /// out in order on one connection, as a pool's client would send them. Every query method
    /// of [`Db`] takes the next connection itself.
    pub fn connection(&self) -> Result<DbConn, DbError> {
        self.live().map(DbConn)
    }

    /// Runs a prepared statement and returns its rows.
    pub async fn query(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, DbError> {
        self.connection()?.query(stmt, params).await
    }

    /// Runs a prepared statement that returns exactly one row.
    pub async fn query_one(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, DbError> {
        self.connection()?.query_one(stmt, params).await
    }

    /// Runs a prepared statement and returns the number of rows it changed.
    pub async fn execute(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, DbError> {
        self.connection()?.execute(stmt, params).await
    }

    /// [`DbConn::query_each`] on the next open connection.
    pub async fn query_each<P: ToSql + Sync>(
        &self,
        stmt: Stmt,
        values: &[P],
    ) -> Result<Vec<Row>, DbError> {
        self.connection()?.query_each(stmt, values).await
    }
}

/// One of a worker's database connections, from [`Db::connection`]: the queries sent through
/// it go out in order on that connection. When the connection breaks they fail with
/// [`DbError::Closed`]; take another from the [`Db`].
#[derive(Clone)]
pub struct DbConn(Rc<Live>);

impl fmt::Debug for DbConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbConn")
            .field("closed", &self.0.conn.is_closed())
            .finish()
    }
}

impl DbConn {
    /// Runs a prepared statement and returns its rows.
    pub async fn query(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, DbError> {
        Ok(self.run(stmt, params).await?.rows.into_vec())
    }

    /// Runs a prepared statement that returns exactly one row.
    pub async fn query_one(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, DbError> {
        one_row(self.run(stmt, params).await?.rows)
    }

    /// Runs a prepared statement and returns the number of rows it changed.
    pub async fn execute(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, DbError> {
        Ok(self.run(stmt, params).await?.affected)
    }

    /// Runs a prepared statement with one parameter once per value, all pipelined on one
    /// connection (sent together, answered together); each must return exactly one row, and the
    /// rows come back in the order of `values`.
    ///
    /// Each query is its own `Bind`/`Execute`/`Sync` (its own implicit transaction, as the
    /// TechEmpower rules require): an error in one fails the call but does not stop the others.
    pub async fn query_each<P: ToSql + Sync>(
        &self,
        stmt: Stmt,
        values: &[P],
    ) -> Result<Vec<Row>, DbError> {
        let live = &self.0;
        let failed = |e| DbError::from_pg(e, &live.conn);
        let statement = &live.statements[stmt.0];
        // Every query is sent before the first answer is awaited.
        // (A collect through `Result` would not know the length and grow the vector 4 times.)
        let mut sent = Vec::with_capacity(values.len());
        for v in values {
            sent.push(live.conn.query(statement, &[v]).map_err(failed)?);
        }
        // The answers come in order: once the last is in, all are. Waiting for it first wakes
        // this task once, not once for every answer that arrives on its own.
        let Some(last) = sent.pop() else {
            return Ok(Vec::new());
        };
        let last = last.await;
        let mut rows = Vec::with_capacity(values.len());
        for answered in sent {
            rows.push(one_row(answered.await.map_err(failed)?.rows)?);
        }
        rows.push(one_row(last.map_err(failed)?.rows)?);
        Ok(rows)
    }

    /// Sends one query on this connection and waits for its answer (the query timeout
    /// is the connection's: one timer per connection, not per query).
    async fn run(
        &self,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<wire::Answer, DbError> {
        let live = &self.0;
        let failed = |e| DbError::from_pg(e, &live.conn);
        live.conn
            .query(&live.statements[stmt.0], params)
            .map_err(failed)?
            .await
            .map_err(failed)
    }
}

/// The one row of an answer that must have exactly one.
fn one_row(rows: smallvec::SmallVec<[Row; 1]>) -> Result<Row, DbError> {
    let n = rows.len();
    let mut rows = rows.into_iter();
    match (rows.next(), n) {
        (Some(row), 1) => Ok(row),
        _ => Err(DbError::Query(PgError::new(format!(
            "expected one row, the query returned {n}"
        )))),
    }
}

/// Keeps connection `i` of a worker's client open until the client is dropped.
async fn keep_open(db: std::rc::Weak<Inner>, i: usize) {
    let mut backoff = None::<Duration>;
    loop {
        let Some(inner) = db.upgrade() else { return };
        let config = inner.config.clone();
        drop(inner);
        if let Some(wait) = backoff {
            tokio::time::sleep(wait).await;
        }
        let opened = open(&config).await;
        let Some(inner) = db.upgrade() else { return };
        let connection = match opened {
            Ok((live, connection)) => {
                if backoff.is_some() {
                    tracing::info!(target: "canter::db", db = config.dbname(), "database connection reopened");
                }
                *inner.slots[i].borrow_mut() = Some(Rc::new(live));
                connection
            }
            Err(e) => {
                let next = match backoff {
                    None => config.backoff_min,
                    Some(d) => (d * 2).min(config.backoff_max),
                };
                // One line per outage at warn, then the retries at debug.
                if backoff.is_none() {
                    tracing::warn!(target: "canter::db", db = config.dbname(), error = %e, "cannot connect to the database; retrying");
                } else {
                    tracing::debug!(target: "canter::db", error = %e, retry_in = ?next, "database still unreachable");
                }
                backoff = Some(next);
                continue;
            }
        };
        drop(inner);
        if let Err(e) = connection.await {
            tracing::warn!(target: "canter::db", error = %e, "database connection broke; reopening");
        } else {
            tracing::warn!(target: "canter::db", "database closed the connection; reopening");
        }
        let Some(inner) = db.upgrade() else { return };
        *inner.slots[i].borrow_mut() = None;
        backoff = Some(config.backoff_min);
    }
}

type Connection = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PgError>>>>;

/// Why a connection could not be opened.
enum OpenError {
    Pg(PgError),
    /// The connection timed out before it was ready.
    Timeout,
    /// The server closed the connection while the statements were being prepared.
    ClosedWhilePreparing,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Pg(e) => e.fmt(f),
            OpenError::Timeout => f.write_str("timed out connecting to the database"),
            OpenError::ClosedWhilePreparing => {
                f.write_str("connection closed while preparing statements")
            }
        }
    }
}

/// Opens one connection and prepares every statement on it; the returned future drives the
/// connection and ends when it breaks.
async fn open(config: &DbConfig) -> Result<(Live, Connection), OpenError> {
    let limit = config
        .pg
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(3));
    let (conn, connection) = tokio::time::timeout(
        limit,
        wire::connect(&config.pg, &config.tls, config.query_timeout),
    )
    .await
    .map_err(|_| OpenError::Timeout)?
    .map_err(OpenError::Pg)?;
    let mut connection: Connection = Box::pin(connection);
    // The connection must be driven while the statements are prepared: poll both together.
    let statements = {
        let prepare = try_join_all(config.statements.iter().map(|sql| conn.prepare(sql)));
        tokio::pin!(prepare);
        tokio::select! {
            prepared = &mut prepare => prepared.map_err(OpenError::Pg)?,
            ended = &mut connection => {
                ended.map_err(OpenError::Pg)?;
                return Err(OpenError::ClosedWhilePreparing);
            }
        }
    };
    Ok((Live { conn, statements }, connection))
}
