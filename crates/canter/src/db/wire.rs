//! One PostgreSQL connection on a worker: the extended-query protocol, pipelined.
//!
//! A query is encoded straight into the connection's output buffer when it is sent
//! ([`Conn::query`]) and takes a place in the connection's queue; the connection's driver (the
//! future [`connect`] returns, one task per connection) writes everything queued in one `send`
//! once the worker's ready tasks have run, reads the answers, and hands each query its rows in
//! the order the queries went out. Nothing crosses threads; places in the queue are reused, and
//! a row of a few columns is stored inline, so a one-row query allocates nothing of its own.
//!
//! Every query is its own `Bind`/`Execute`/`Sync`, so an error in one ends that query alone.
//! When the connection breaks, every query waiting on it fails at once. Over TCP the kernel
//! wakes the driver only once the least its answers in flight can come to has arrived
//! ([`Conn::set_low_water`]), not at each answer the database flushes.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::backend::{ErrorResponseBody, Message};
use postgres_protocol::message::frontend;
use postgres_types::{FromSql, Kind, ToSql, Type};
use smallvec::SmallVec;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::Host;

/// The longest message taken from the database (a row of that size is refused, and the
/// connection reopened), so that a wrong length cannot make the buffer grow without bound.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// How much one turn of the driver reads before it lets the worker's other tasks run.
const READ_BUDGET: usize = 256 * 1024;
/// Queries that may wait in a connection's buffer for the database to answer those in flight
/// (see [`Conn::flush_if_due`]).
const MAX_UNSENT: usize = 64;
/// The fewest bytes the answer to one query can take: `BindComplete` (5), `CommandComplete`
/// with the shortest tag or `EmptyQueryResponse` (5 or more) and `ReadyForQuery` (6); an error
/// is an `ErrorResponse` that always carries a severity, a code and a message (18 or more)
/// and `ReadyForQuery`. A statement's preparation answers with more.
const LEAST_ANSWER: usize = 16;
/// The fewest bytes left of an answer that has begun: its `ReadyForQuery`.
const LEAST_REST: usize = 6;

/// Why a query or a connection failed, as the database or the connection said it.
#[derive(Debug, Clone)]
pub struct PgError {
    code: Option<String>,
    message: String,
    timed_out: bool,
}

impl PgError {
    pub(crate) fn new(message: impl Into<String>) -> PgError {
        PgError {
            code: None,
            message: message.into(),
            timed_out: false,
        }
    }

    fn timeout() -> PgError {
        PgError {
            timed_out: true,
            ..PgError::new("the database did not answer in time")
        }
    }

    /// True when the query was given up at the query timeout.
    pub(crate) fn is_timeout(&self) -> bool {
        self.timed_out
    }

    fn io(e: &io::Error) -> PgError {
        PgError::new(e.to_string())
    }

    fn server(body: &ErrorResponseBody) -> PgError {
        let mut code = None;
        let mut message = String::new();
        let mut fields = body.fields();
        while let Ok(Some(field)) = fields.next() {
            match field.type_() {
                b'C' => code = Some(String::from_utf8_lossy(field.value_bytes()).into_owned()),
                b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
                _ => {}
            }
        }
        PgError {
            code,
            message,
            timed_out: false,
        }
    }

    /// The SQLSTATE code the database gave, if the error came from the database.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{code}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PgError {}

/// A row of a query's answer, with the types of its columns.
pub struct Row {
    columns: Rc<[Type]>,
    /// The row's values as they came, one after the other (inline when small, as most rows are).
    data: SmallVec<[u8; 16]>,
    /// Where each column's value ends in `data` (it starts where the one before ends), with
    /// [`NULL`] set for a NULL.
    ends: SmallVec<[u32; 4]>,
}

/// The mark of a NULL column in [`Row::ends`].
const NULL: u32 = 1 << 31;

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Row")
            .field("columns", &self.columns)
            .finish()
    }
}

impl Row {
    /// A row from a `DataRow` message's body: a 16-bit column count, then each column as a
    /// 32-bit length (-1 for NULL) and that many bytes.
    fn parse(columns: Rc<[Type]>, body: &[u8]) -> io::Result<Row> {
        let bad = || protocol("a malformed DataRow");
        let count = u16::from_be_bytes(
            body.get(..2)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        let mut ends = SmallVec::with_capacity(count as usize);
        let mut data = SmallVec::new();
        let mut at = 2;
        for _ in 0..count {
            let len = i32::from_be_bytes(
                body.get(at..at + 4)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?,
            );
            at += 4;
            if len < 0 {
                ends.push(data.len() as u32 | NULL);
                continue;
            }
            let value = body.get(at..at + len as usize).ok_or_else(bad)?;
            at += len as usize;
            data.extend_from_slice(value);
            if data.len() >= NULL as usize {
                return Err(protocol("a row over 2 GiB"));
            }
            ends.push(data.len() as u32);
        }
        Ok(Row {
            columns,
            data,
            ends,
        })
    }

    /// The number of columns.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the row has no columns.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Column `idx` converted to `T`, or why it cannot be.
    pub fn try_get<'a, T: FromSql<'a>>(&'a self, idx: usize) -> Result<T, PgError> {
        let (Some(ty), Some(&end)) = (self.columns.get(idx), self.ends.get(idx)) else {
            return Err(PgError::new(format!(
                "no column {idx} in a row of {}",
                self.ends.len()
            )));
        };
        if !T::accepts(ty) {
            return Err(PgError::new(format!(
                "column {idx} of type {ty} cannot be read as {}",
                std::any::type_name::<T>()
            )));
        }
        let start = match idx {
            0 => 0,
            _ => (self.ends[idx - 1] & !NULL) as usize,
        };
        let raw = (end & NULL == 0).then(|| &self.data[start..end as usize]);
        T::from_sql_nullable(ty, raw)
            .map_err(|e| PgError::new(format!("column {idx} of type {ty}: {e}")))
    }

    /// Column `idx` converted to `T`.
    ///
    /// # Panics
    /// When there is no such column or it does not convert to `T` (a mistake in the program,
    /// like indexing past the end of a slice); [`Row::try_get`] returns the error instead.
    pub fn get<'a, T: FromSql<'a>>(&'a self, idx: usize) -> T {
        match self.try_get(idx) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }
}

/// A statement prepared on one connection.
pub(crate) struct Statement {
    name: String,
    params: Vec<Type>,
    columns: Rc<[Type]>,
}

/// What a query got back.
#[derive(Default)]
pub(crate) struct Answer {
    /// The rows (inline when there is one, as for most queries).
    pub(crate) rows: SmallVec<[Row; 1]>,
    /// From the command tag: rows changed (or returned).
    pub(crate) affected: u64,
    params: Vec<Type>,
    columns: Option<Rc<[Type]>>,
}

/// A query in the connection's queue.
struct Pending {
    answer: Answer,
    error: Option<Box<PgError>>,
    /// The database has answered (or the connection has ended).
    done: bool,
    /// Its future has taken the answer or was dropped: the place goes once `done`.
    gone: bool,
    waker: Option<Waker>,
}

/// The queries sent on a connection, in the order they went out. Places are reused: a query
/// costs no allocation of its own.
#[derive(Default)]
struct Queue {
    slots: VecDeque<Pending>,
    /// The sequence number of `slots[0]`.
    head: u64,
    /// How many of `slots`, from the front, have their answer.
    answered: usize,
}

impl Queue {
    fn push(&mut self, pending: Pending) -> u64 {
        self.slots.push_back(pending);
        self.head + self.slots.len() as u64 - 1
    }

    fn get(&mut self, seq: u64) -> Option<&mut Pending> {
        let i = usize::try_from(seq.checked_sub(self.head)?).ok()?;
        self.slots.get_mut(i)
    }

    /// The query the next answer belongs to.
    fn answering(&mut self) -> Option<&mut Pending> {
        self.slots.get_mut(self.answered)
    }

    /// Frees the places at the front that are answered and taken.
    fn trim(&mut self) {
        while self.answered > 0 && self.slots.front().is_some_and(|p| p.gone) {
            self.slots.pop_front();
            self.head += 1;
            self.answered -= 1;
        }
    }
}

/// A connection's state, shared by its driver and the queries sent on it (one thread).
pub(crate) struct Conn {
    out: RefCell<BytesMut>,
    queue: RefCell<Queue>,
    driver: RefCell<Option<Waker>>,
    /// Why the connection ended, once it has.
    ended: RefCell<Option<PgError>>,
    /// The client no longer wants the connection: the driver says goodbye and ends.
    released: Cell<bool>,
    /// Queries in `out` that have not started to go out: they wait while earlier queries are
    /// in flight (see [`Conn::flush_if_due`]).
    unsent: Cell<usize>,
    /// `out` holds the rest of a write that has begun.
    writing: Cell<bool>,
    statements: Cell<u32>,
    /// The socket's receive low-water mark (`SO_RCVLOWAT`), as last set.
    low_water: Cell<usize>,
}

impl Conn {
    /// True once the connection has ended; queries then fail at once.
    pub(crate) fn is_closed(&self) -> bool {
        self.ended.borrow().is_some()
    }

    /// Queries written (or being written) and not yet answered: those in `q` after the answered
    /// ones, less the ones still waiting in `out` to start going out.
    fn in_flight(&self, q: &Queue) -> usize {
        q.slots.len().saturating_sub(q.answered + self.unsent.get())
    }

    /// Asks the driver to close the connection.
    pub(crate) fn release(&self) {
        self.released.set(true);
        if let Some(w) = self.driver.borrow_mut().take() {
            w.wake();
        }
    }

    /// Queues `bytes`' encoding and a place for its answer; wakes the driver if it had nothing
    /// to write.
    fn send(
        self: &Rc<Self>,
        encode: impl FnOnce(&mut BytesMut) -> Result<(), PgError>,
        columns: Option<Rc<[Type]>>,
    ) -> Result<Answered, PgError> {
        if let Some(e) = &*self.ended.borrow() {
            return Err(e.clone());
        }
        let mut out = self.out.borrow_mut();
        let was_empty = out.is_empty();
        let mark = out.len();
        if let Err(e) = encode(&mut out) {
            out.truncate(mark);
            return Err(e);
        }
        frontend::sync(&mut out);
        drop(out);
        let unsent = self.unsent.get() + 1;
        self.unsent.set(unsent);
        let seq = self.queue.borrow_mut().push(Pending {
            answer: Answer {
                columns,
                ..Answer::default()
            },
            error: None,
            done: false,
            gone: false,
            waker: None,
        });
        // The driver writes on its own while it has queries waiting, except when they reach
        // the most that may wait.
        if was_empty || unsent == MAX_UNSENT {
            if let Some(w) = &*self.driver.borrow() {
                w.wake_by_ref();
            }
        }
        Ok(Answered {
            conn: self.clone(),
            seq,
        })
    }

    /// Sends a prepared statement with `params`; the answer arrives through the returned
    /// future. The query leaves with the next write of the driver.
    pub(crate) fn query(
        self: &Rc<Self>,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Answered, PgError> {
        self.send(
            |out| bind_execute(out, statement, params),
            Some(statement.columns.clone()),
        )
    }

    /// Prepares `sql` on this connection.
    pub(crate) async fn prepare(self: &Rc<Self>, sql: &str) -> Result<Statement, PgError> {
        let name = format!("s{}", self.statements.get());
        self.statements.set(self.statements.get() + 1);
        let answer = self
            .send(
                |out| {
                    frontend::parse(&name, sql, None, out).map_err(|e| PgError::io(&e))?;
                    frontend::describe(b'S', &name, out).map_err(|e| PgError::io(&e))
                },
                None,
            )?
            .await?;
        Ok(Statement {
            name,
            params: answer.params,
            columns: answer.columns.unwrap_or_else(|| Rc::from(Vec::new())),
        })
    }

    /// Takes the answers in `input`, in order. The messages of every answer (`BindComplete`,
    /// `DataRow`, `CommandComplete`, `ReadyForQuery`) are read in place; the rarer ones go
    /// through `postgres_protocol`'s parser.
    fn dispatch(&self, input: &mut BytesMut) -> io::Result<()> {
        loop {
            let Some(header) = input.get(..5) else {
                return Ok(());
            };
            let tag = header[0];
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len < 4 {
                return Err(protocol("a message with a bad length"));
            }
            if len > MAX_MESSAGE {
                return Err(protocol("a message over 256 MiB"));
            }
            if input.len() < 1 + len {
                input.reserve(1 + len - input.len());
                return Ok(());
            }
            match tag {
                // NoticeResponse, ParameterStatus, NotificationResponse: not answers
                b'N' | b'S' | b'A' => {
                    input.advance(1 + len);
                    continue;
                }
                b'2' | b'1' | b'n' | b'I' | b'3' | b'D' | b'C' | b'Z' => {}
                _ => {
                    let message =
                        Message::parse(input)?.ok_or_else(|| protocol("a message cut short"))?;
                    self.dispatch_rare(message)?;
                    continue;
                }
            }
            let body = &input[5..1 + len];
            let mut queue = self.queue.borrow_mut();
            let Some(p) = queue.answering() else {
                return Err(protocol("an answer with no query waiting"));
            };
            match tag {
                b'D' => {
                    let columns = p
                        .answer
                        .columns
                        .clone()
                        .unwrap_or_else(|| Rc::from(Vec::new()));
                    p.answer.rows.push(Row::parse(columns, body)?);
                }
                b'C' => p.answer.affected = command_count(body),
                b'Z' => {
                    p.done = true;
                    let waker = p.waker.take();
                    queue.answered += 1;
                    queue.trim();
                    drop(queue);
                    input.advance(1 + len);
                    if let Some(w) = waker {
                        w.wake();
                    }
                    continue;
                }
                // BindComplete, ParseComplete, NoData, EmptyQueryResponse, CloseComplete
                _ => {}
            }
            drop(queue);
            input.advance(1 + len);
        }
    }

    /// An answer's message other than the common ones.
    fn dispatch_rare(&self, message: Message) -> io::Result<()> {
        let mut queue = self.queue.borrow_mut();
        let Some(p) = queue.answering() else {
            return Err(protocol("an answer with no query waiting"));
        };
        match message {
            Message::ErrorResponse(body) => {
                if p.error.is_none() {
                    p.error = Some(Box::new(PgError::server(&body)));
                }
            }
            Message::ParameterDescription(body) => {
                p.answer.params = body.parameters().map(|oid| Ok(type_of(oid))).collect()?;
            }
            Message::RowDescription(body) => {
                let types: Vec<Type> =
                    body.fields().map(|f| Ok(type_of(f.type_oid()))).collect()?;
                p.answer.columns = Some(Rc::from(types));
            }
            _ => return Err(protocol("an unexpected message")),
        }
        Ok(())
    }

    /// Ends the connection: every query waiting on it fails with `why`.
    fn end(&self, why: PgError) {
        *self.ended.borrow_mut() = Some(why.clone());
        let mut wakers = Vec::new();
        {
            let mut queue = self.queue.borrow_mut();
            let from = queue.answered;
            for p in queue.slots.range_mut(from..) {
                p.done = true;
                p.error = Some(Box::new(why.clone()));
                wakers.extend(p.waker.take());
            }
            queue.answered = queue.slots.len();
            queue.trim();
        }
        for w in wakers {
            w.wake();
        }
    }

    fn poll_drive(
        &self,
        stream: &Stream,
        input: &mut BytesMut,
        watch: &mut Watch,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = self.poll_io(stream, input, cx);
        if polled.is_pending() {
            self.poll_watch(watch, cx);
        }
        polled
    }

    /// The query timeout, one timer per connection, checked every `watch.period` while
    /// queries wait (not at every answer: an answer costs no clock read and no timer update).
    /// A query that is the oldest unanswered one at two checks `watch.limit` apart has waited
    /// at least the limit: it and every query sent after it fail with a timeout (the database
    /// answers in order, so none of them can be answered sooner). Their places stay in the
    /// queue, and their answers are dropped if they come. A timeout is late by at most a period.
    fn poll_watch(&self, watch: &mut Watch, cx: &mut Context<'_>) {
        if watch.armed && !watch.sleep.is_elapsed() {
            return;
        }
        loop {
            let (unanswered, sent) = {
                let q = self.queue.borrow();
                (q.head + q.answered as u64, q.head + q.slots.len() as u64)
            };
            let oldest = unanswered.max(watch.failed_before);
            if oldest >= sent {
                // Nothing waits: the timer stays off until a query does.
                watch.armed = false;
                watch.oldest = None;
                return;
            }
            let now = tokio::time::Instant::now();
            let since = match watch.oldest {
                Some((seq, since)) if seq == oldest => since,
                _ => {
                    watch.oldest = Some((oldest, now));
                    now
                }
            };
            match since.checked_add(watch.limit) {
                Some(deadline) if deadline <= now => {}
                deadline => {
                    let next = now + watch.period;
                    let next = deadline.map_or(next, |d| d.min(next));
                    watch.sleep.as_mut().reset(next);
                    watch.armed = true;
                    if watch.sleep.as_mut().poll(cx).is_pending() {
                        return;
                    }
                    continue;
                }
            }
            let mut wakers = Vec::new();
            {
                let mut q = self.queue.borrow_mut();
                let head = q.head;
                for seq in oldest..sent {
                    let Some(p) = usize::try_from(seq - head)
                        .ok()
                        .and_then(|i| q.slots.get_mut(i))
                    else {
                        continue;
                    };
                    if !p.done {
                        p.done = true;
                        p.error = Some(Box::new(PgError::timeout()));
                        wakers.extend(p.waker.take());
                    }
                }
            }
            watch.failed_before = sent;
            watch.oldest = None;
            for w in wakers {
                w.wake();
            }
        }
    }

    /// Writes what `out` holds until it is empty or the socket is full (the driver is then
    /// woken when it can write again). The socket is tried first: readiness is asked for, and
    /// the waker registered, only when a write would block.
    fn write_out(&self, stream: &Stream, cx: &mut Context<'_>) -> io::Result<()> {
        let mut out = self.out.borrow_mut();
        loop {
            if out.is_empty() {
                // What a TLS session still holds is part of the write.
                if stream.flush_session()? {
                    self.writing.set(false);
                    return Ok(());
                }
                match stream.poll_write_ready(cx) {
                    Poll::Pending => break,
                    Poll::Ready(r) => {
                        r?;
                        continue;
                    }
                }
            }
            match stream.try_write(&out) {
                Ok(n) => out.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match stream.poll_write_ready(cx) {
                        Poll::Pending => break,
                        Poll::Ready(r) => r?,
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes the queries waiting in `out` unless the database is still working on earlier
    /// ones of this connection: then they wait until its last answer is in (or
    /// [`MAX_UNSENT`] of them wait), and go out together. The database answers a connection's
    /// queries one after another, so a query waiting here would have waited in its socket
    /// anyway, less one round trip; in return a busy connection costs one write (here) and one
    /// read and wake-up (in the database) per batch instead of per request.
    fn flush_if_due(&self, stream: &Stream, cx: &mut Context<'_>) -> io::Result<()> {
        let unsent = self.unsent.get();
        // A write the socket cut short is finished first: the database cannot answer half a
        // message.
        if !self.writing.get()
            && unsent > 0
            && unsent < MAX_UNSENT
            && self.in_flight(&self.queue.borrow()) > 0
        {
            return Ok(());
        }
        self.unsent.set(0);
        self.writing.set(true);
        self.write_out(stream, cx)
    }

    /// Before the driver waits for answers, tells the kernel not to wake it until enough
    /// has arrived to be worth a wake-up (`SO_RCVLOWAT`, TCP only). The database flushes
    /// every answer on its own, and waking this thread for each one (it is often asleep by
    /// then) costs the database a cross-CPU wake-up inside its `send` and this worker a turn
    /// of its event loop. When a task waits for the very next answer, that answer is enough
    /// (`/db`: one query a request). Otherwise no task can go on before more has arrived (the
    /// first 19 answers of a request's 20, whose task waits for the last), and the mark is
    /// the least that everything in flight can come to, answers of other requests included.
    ///
    /// The mark is a lower bound from the protocol, never an estimate: once every answer it
    /// counts has arrived, it has been reached, so the last answer in flight always wakes the
    /// driver. `buffered` bytes of them are already read. An end of the connection or an
    /// error wakes the driver whatever the mark, and the kernel signals readiness at once when
    /// the mark is lowered below what it holds. A task that starts waiting for the next answer
    /// after the mark was set wakes the driver to lower it ([`Answered`]).
    fn set_low_water(&self, stream: &Stream, buffered: usize) -> io::Result<()> {
        let Stream::Tcp(tcp) = stream else {
            return Ok(());
        };
        let mark = if self.writing.get() {
            // Queries cut short in `out` are not answered until they are written.
            1
        } else {
            let q = self.queue.borrow();
            let in_flight = self.in_flight(&q);
            if in_flight == 0 {
                // Nothing is awaited: the mark is set again when something is.
                return Ok(());
            }
            // A task waits for the next answer: woken by it, as without a mark. Otherwise
            // (the first 19 answers of a request's 20, whose task waits for the last) up to
            // everything in flight, answers of other requests included.
            let first = q.answered;
            let waited = if q.slots.get(first).is_some_and(|p| p.waker.is_some()) {
                1
            } else {
                in_flight
            };
            (LEAST_ANSWER * (waited - 1) + LEAST_REST)
                .saturating_sub(buffered)
                .max(1)
        };
        if mark == self.low_water.get() {
            return Ok(());
        }
        let value = libc::c_int::try_from(mark).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is the connection's open socket, borrowed here; the option's
        // value is a c_int read by the kernel, passed with its size.
        let set = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(tcp),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        self.low_water.set(mark);
        Ok(())
    }

    fn poll_io(
        &self,
        stream: &Stream,
        input: &mut BytesMut,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        {
            let mut driver = self.driver.borrow_mut();
            if !driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *driver = Some(cx.waker().clone());
            }
        }
        if self.released.get() {
            let mut bye = BytesMut::new();
            frontend::terminate(&mut bye);
            let _ = stream.try_write(&bye);
            return Poll::Ready(Ok(()));
        }
        // The driver runs after the tasks that queued queries in this turn, so they leave in one
        // write; while earlier queries are in flight they wait for the last answer (checked
        // again after every read).
        self.flush_if_due(stream, cx)?;
        let mut budget = READ_BUDGET;
        loop {
            input.reserve(16 * 1024);
            match stream.read_draining(input) {
                Ok(0) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the database closed the connection",
                    )))
                }
                Ok(n) => {
                    self.dispatch(input)?;
                    self.flush_if_due(stream, cx)?;
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.set_low_water(stream, input.len())?;
                    match stream.poll_read_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {}
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Encodes `Bind` and `Execute` of `statement` with `params` (the unnamed portal, binary
/// results).
fn bind_execute(
    out: &mut BytesMut,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(), PgError> {
    let types = &statement.params;
    if params.len() != types.len() {
        return Err(PgError::new(format!(
            "the statement takes {} parameters, {} given",
            types.len(),
            params.len()
        )));
    }
    // Bind: the unnamed portal, the statement, each parameter's format, the values, and one
    // result format (binary) for every column.
    let too_long = || PgError::new("a query message over 2 GiB");
    out.put_u8(b'B');
    let start = out.len();
    out.put_i32(0);
    out.put_u8(0);
    out.put_slice(statement.name.as_bytes());
    out.put_u8(0);
    let n = i16::try_from(params.len()).map_err(|_| PgError::new("over 32,767 parameters"))?;
    out.put_i16(n);
    for (p, ty) in params.iter().zip(types) {
        out.put_i16(p.encode_format(ty) as i16);
    }
    out.put_i16(n);
    for (p, ty) in params.iter().zip(types) {
        let at = out.len();
        out.put_i32(0);
        let len = match p.to_sql_checked(ty, out) {
            Ok(postgres_types::IsNull::Yes) => -1,
            Ok(postgres_types::IsNull::No) => {
                i32::try_from(out.len() - at - 4).map_err(|_| too_long())?
            }
            Err(e) => return Err(PgError::new(format!("a parameter does not convert: {e}"))),
        };
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    out.put_i16(1);
    out.put_i16(1);
    let len = i32::try_from(out.len() - start).map_err(|_| too_long())?;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    // Execute the unnamed portal, all rows.
    out.put_slice(&[b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0]);
    Ok(())
}

/// The row count at the end of a `CommandComplete` tag (`UPDATE 20`, `SELECT 1`), or 0.
fn command_count(body: &[u8]) -> u64 {
    let tag = body.strip_suffix(&[0]).unwrap_or(body);
    let digits = tag.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    if digits == tag.len() {
        return 0;
    }
    tag[tag.len() - digits..]
        .iter()
        .try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .unwrap_or(0)
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("database protocol error: {what}"),
    )
}

/// The type of an OID: a built-in type, or one known by its number alone (values of it read
/// and written as raw bytes by types that accept any).
fn type_of(oid: u32) -> Type {
    Type::from_oid(oid)
        .unwrap_or_else(|| Type::new(format!("oid{oid}"), oid, Kind::Simple, String::new()))
}

/// The driver's query timer (see [`Conn::poll_watch`]).
struct Watch {
    limit: Duration,
    /// How often the oldest query is checked while queries wait.
    period: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The sleep is set for the next check and holds the driver's waker.
    armed: bool,
    /// The oldest unanswered query at the last check, and the time of the first check that
    /// found it the oldest (it has been the oldest since then at least).
    oldest: Option<(u64, tokio::time::Instant)>,
    /// Queries before this one have failed with a timeout already.
    failed_before: u64,
}

/// The answer to a query, once the database has given it.
pub(crate) struct Answered {
    conn: Rc<Conn>,
    seq: u64,
}

impl Future for Answered {
    type Output = Result<Answer, PgError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut queue = self.conn.queue.borrow_mut();
        let Some(p) = queue.get(self.seq).filter(|p| !p.gone) else {
            return Poll::Ready(Err(PgError::new("the answer was taken already")));
        };
        if !p.done {
            let first_wait = p.waker.is_none();
            if !p.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                p.waker = Some(cx.waker().clone());
            }
            // The next answer, in flight, now awaited while the socket's mark may count past
            // it: the driver lowers the mark (see `Conn::set_low_water`).
            let conn = &self.conn;
            if first_wait
                && self.seq == queue.head + queue.answered as u64
                && conn.low_water.get() > LEAST_REST
                && conn.in_flight(&queue) > 0
            {
                if let Some(w) = &*conn.driver.borrow() {
                    w.wake_by_ref();
                }
            }
            return Poll::Pending;
        }
        p.gone = true;
        let result = match p.error.take() {
            Some(e) => Err(*e),
            None => Ok(std::mem::take(&mut p.answer)),
        };
        queue.trim();
        Poll::Ready(result)
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        // A query given up (a timeout, a closed client): its answer is dropped on arrival.
        if let Ok(mut queue) = self.conn.queue.try_borrow_mut() {
            if let Some(p) = queue.get(self.seq) {
                p.gone = true;
                p.waker = None;
            }
            queue.trim();
        }
    }
}

/// The socket to the database.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS over TCP (`sslmode`): the session is driven with the same readiness calls as a
    /// socket. A read takes everything the session has decrypted, so the session never holds
    /// plaintext while the driver waits on the socket; a write leaves records the socket did
    /// not take in the session, and [`Stream::flush_session`] pushes them out.
    Tls(Box<RefCell<canter_rt::TlsStream>>),
}

/// Most plaintext one [`tls_read`] takes before it returns (the driver reads again at once).
const TLS_READ_MOST: usize = 64 * 1024;

/// Reads what a TLS session decrypts, reading the socket as needed, until the socket would
/// block or [`TLS_READ_MOST`] bytes are in: a would-block leaves no plaintext in the session,
/// so the driver may then wait on the socket's readiness.
fn tls_read(s: &mut canter_rt::TlsStream, buf: &mut BytesMut) -> io::Result<usize> {
    let mut cx = noop_context();
    let mut piece = [0u8; 16 * 1024];
    let mut total = 0;
    while total < TLS_READ_MOST {
        let mut rb = tokio::io::ReadBuf::new(&mut piece);
        match tokio::io::AsyncRead::poll_read(Pin::new(&mut *s), &mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {
                buf.extend_from_slice(rb.filled());
                total += rb.filled().len();
            }
            Poll::Ready(Err(e)) if total == 0 => return Err(e),
            Poll::Pending if total == 0 => return Err(io::ErrorKind::WouldBlock.into()),
            Poll::Ready(Err(_)) | Poll::Pending => break,
        }
    }
    Ok(total)
}

/// A waker that does nothing: the TLS session's reads and writes are tried without waiting,
/// and the driver registers its own waker with the socket's readiness when they would block.
fn noop_context() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

impl Stream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            Stream::Tls(s) => s.borrow().get_ref().0.poll_read_ready(cx),
        }
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_write_ready(cx),
            Stream::Unix(s) => s.poll_write_ready(cx),
            Stream::Tls(s) => s.borrow().get_ref().0.poll_write_ready(cx),
        }
    }

    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            Stream::Unix(s) => s.try_read_buf(buf),
            Stream::Tls(s) => tls_read(&mut s.borrow_mut(), buf),
        }
    }

    /// Pushes out TLS records the session still holds (a write the socket cut short);
    /// `Ok(false)` while some remain (the socket is full). Nothing to do for plain sockets.
    fn flush_session(&self) -> io::Result<bool> {
        let Stream::Tls(s) = self else {
            return Ok(true);
        };
        let mut s = s.borrow_mut();
        if !s.get_ref().1.wants_write() {
            return Ok(true);
        }
        match tokio::io::AsyncWrite::poll_flush(Pin::new(&mut *s), &mut noop_context()) {
            Poll::Ready(r) => r.map(|()| !s.get_ref().1.wants_write()),
            Poll::Pending => Ok(false),
        }
    }

    /// Reads what has arrived. A read that leaves room in `buf` has emptied the socket's
    /// queue, so it also clears the socket's readiness: the next wait goes straight to the
    /// event loop instead of costing a `recv` that finds nothing (more data raises a new event).
    fn read_draining(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let room = buf.capacity() - buf.len();
        let mut got = None;
        let mut read = || {
            let n = self.try_read_buf(buf)?;
            got = Some(n);
            if n > 0 && n < room {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        };
        let result = match self {
            Stream::Tcp(s) => s.try_io(Interest::READABLE, &mut read),
            Stream::Unix(s) => s.try_io(Interest::READABLE, &mut read),
            // The session reads the socket itself, to its would-block.
            Stream::Tls(_) => read(),
        };
        match got {
            Some(n) => Ok(n),
            None => result,
        }
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
            Stream::Tls(s) => {
                let mut s = s.borrow_mut();
                match tokio::io::AsyncWrite::poll_write(Pin::new(&mut *s), &mut noop_context(), buf)
                {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            std::future::poll_fn(|cx| self.poll_write_ready(cx)).await?;
            match self.try_write(buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        while !self.flush_session()? {
            std::future::poll_fn(|cx| self.poll_write_ready(cx)).await?;
        }
        Ok(())
    }

    async fn read_message(&self, input: &mut BytesMut) -> io::Result<Message> {
        loop {
            if let Some(h) = input.get(1..5) {
                if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize > MAX_MESSAGE {
                    return Err(protocol("a message over 256 MiB"));
                }
            }
            if let Some(m) = Message::parse(input)? {
                return Ok(m);
            }
            std::future::poll_fn(|cx| self.poll_read_ready(cx)).await?;
            input.reserve(4096);
            match self.try_read_buf(input) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the database closed the connection during start-up",
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Opens a connection: the socket, start-up and authentication. The returned future drives
/// the connection until it breaks or [`Conn::release`] is called.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    tls: &super::DbTls,
    query_timeout: Duration,
) -> Result<(Rc<Conn>, impl Future<Output = Result<(), PgError>>), PgError> {
    let (stream, host) = open_socket(config).await?;
    // TLS is asked for over TCP only, as libpq does (not over a Unix socket).
    let stream = match (stream, host, tls.client()) {
        (Stream::Tcp(tcp), Some(host), Some((client, required))) => {
            start_tls(tcp, &host, client, required).await?
        }
        (stream, ..) => stream,
    };
    let mut input = BytesMut::with_capacity(16 * 1024);
    start_up(config, &stream, &mut input).await?;
    let conn = Rc::new(Conn {
        out: RefCell::new(BytesMut::with_capacity(16 * 1024)),
        queue: RefCell::new(Queue::default()),
        driver: RefCell::new(None),
        ended: RefCell::new(None),
        released: Cell::new(false),
        unsent: Cell::new(0),
        writing: Cell::new(false),
        statements: Cell::new(0),
        low_water: Cell::new(1),
    });
    let driven = conn.clone();
    let mut watch = Watch {
        limit: query_timeout,
        period: (query_timeout / 8).clamp(Duration::from_millis(1), Duration::from_secs(1)),
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        armed: false,
        oldest: None,
        failed_before: 0,
    };
    let drive = async move {
        let result =
            std::future::poll_fn(|cx| driven.poll_drive(&stream, &mut input, &mut watch, cx)).await;
        let why = match &result {
            Ok(()) => PgError::new("the connection was closed"),
            Err(e) => PgError::io(e),
        };
        driven.end(why.clone());
        result.map_err(|_| why)
    };
    Ok((conn, drive))
}

/// Asks the database for TLS (`SSLRequest`) and runs the handshake for `host` if it agrees; a
/// database that refuses is served in plaintext unless TLS is `required`.
async fn start_tls(
    mut tcp: TcpStream,
    host: &str,
    client: &canter_rt::ClientTls,
    required: bool,
) -> Result<Stream, PgError> {
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &SSL_REQUEST)
        .await
        .map_err(|e| PgError::io(&e))?;
    // One byte, 'S' or 'N', and nothing after it until the client speaks again.
    let mut answer = [0u8; 1];
    loop {
        tcp.readable().await.map_err(|e| PgError::io(&e))?;
        match tcp.try_read(&mut answer) {
            Ok(0) => return Err(PgError::new("the database closed the connection at TLS")),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(PgError::io(&e)),
        }
    }
    match answer[0] {
        b'S' => {
            let tls = client
                .connect(host, tcp)
                .await
                .map_err(|e| PgError::new(format!("TLS with the database at {host}: {e}")))?;
            Ok(Stream::Tls(Box::new(RefCell::new(tls))))
        }
        b'N' if !required => Ok(Stream::Tcp(tcp)),
        b'N' => Err(PgError::new(format!(
            "the database at {host} does not accept TLS, and sslmode requires it"
        ))),
        other => Err(PgError::new(format!(
            "the database answered the TLS request with {other:#04x}"
        ))),
    }
}

/// Connects to the first host that answers; returns the socket and, for TCP, the host's name
/// (for TLS).
async fn open_socket(config: &tokio_postgres::Config) -> Result<(Stream, Option<String>), PgError> {
    let ports = config.get_ports();
    let port_of = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut last = PgError::new("no database host configured");
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = port_of(i);
        let opened = match host {
            Host::Tcp(name) => TcpStream::connect((name.as_str(), port)).await.map(|s| {
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s), Some(name.clone()))
            }),
            Host::Unix(dir) => UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                .await
                .map(|s| (Stream::Unix(s), None)),
        };
        match opened {
            Ok(s) => return Ok(s),
            Err(e) => last = PgError::new(format!("cannot connect to {host:?}:{port}: {e}")),
        }
    }
    for (i, addr) in config.get_hostaddrs().iter().enumerate() {
        match TcpStream::connect((*addr, port_of(i))).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok((Stream::Tcp(s), Some(addr.to_string())));
            }
            Err(e) => last = PgError::new(format!("cannot connect to {addr}: {e}")),
        }
    }
    Err(last)
}

async fn start_up(
    config: &tokio_postgres::Config,
    stream: &Stream,
    input: &mut BytesMut,
) -> Result<(), PgError> {
    let user = config
        .get_user()
        .ok_or_else(|| PgError::new("no database user configured"))?;
    let mut params = vec![("user", user), ("client_encoding", "UTF8")];
    if let Some(db) = config.get_dbname() {
        params.push(("database", db));
    }
    if let Some(options) = config.get_options() {
        params.push(("options", options));
    }
    if let Some(name) = config.get_application_name() {
        params.push(("application_name", name));
    }
    let mut out = BytesMut::new();
    frontend::startup_message(params, &mut out).map_err(|e| PgError::io(&e))?;
    let password = || {
        config
            .get_password()
            .ok_or_else(|| PgError::new("the database asks for a password and none is configured"))
    };
    let mut scram = None;
    loop {
        if !out.is_empty() {
            stream.write_all(&out).await.map_err(|e| PgError::io(&e))?;
            out.clear();
        }
        let message = stream
            .read_message(input)
            .await
            .map_err(|e| PgError::io(&e))?;
        let io_err = |e: io::Error| PgError::io(&e);
        match message {
            Message::AuthenticationOk
            | Message::BackendKeyData(_)
            | Message::ParameterStatus(_)
            | Message::NoticeResponse(_) => {}
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?, &mut out).map_err(io_err)?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(user.as_bytes(), password()?, body.salt());
                frontend::password_message(hash.as_bytes(), &mut out).map_err(io_err)?;
            }
            Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let mut found = false;
                while let Some(m) = mechanisms.next().map_err(io_err)? {
                    found |= m == sasl::SCRAM_SHA_256;
                }
                if !found {
                    return Err(PgError::new(
                        "the database offers no SASL mechanism this client speaks",
                    ));
                }
                let s = sasl::ScramSha256::new(password()?, sasl::ChannelBinding::unsupported());
                frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut out)
                    .map_err(io_err)?;
                scram = Some(s);
            }
            Message::AuthenticationSaslContinue(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| PgError::new("SASL continued before it began"))?;
                s.update(body.data()).map_err(io_err)?;
                frontend::sasl_response(s.message(), &mut out).map_err(io_err)?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| PgError::new("SASL finished before it began"))?;
                s.finish(body.data()).map_err(io_err)?;
            }
            Message::ErrorResponse(body) => return Err(PgError::server(&body)),
            Message::ReadyForQuery(_) => return Ok(()),
            _ => {
                return Err(PgError::new(
                    "the database asks for an authentication method this client does not speak",
                ))
            }
        }
    }
}
