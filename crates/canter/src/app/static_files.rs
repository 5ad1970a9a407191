//! Static files: [`ServeDir`] answers GET and HEAD from a directory, with validators
//! (ETag, Last-Modified, 304), byte ranges (206, 416), precompressed `.br`/`.gz` siblings and
//! a root that no request path can leave. Bodies go out with `sendfile(2)`
//! ([`Body::File`](canter_rt::Body::File)).
//!
//! ```no_run
//! use canter::rt::{Config, Server};
//! use canter::{get, Router, ServeDir};
//!
//! Server::bind(Config::default())
//!     .unwrap()
//!     .serve(|_worker| {
//!         Router::new()
//!             .route("/", get(|| "home\n"))
//!             // GET /static/, /static/css/site.css … from ./public; /static redirects to /static/
//!             .serve_dir("/static", ServeDir::new("public"))
//!     })
//!     .unwrap();
//! ```

use crate::middleware::Coding;
use crate::negotiate::AcceptEncoding;
use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(feature = "compression")]
use bytes::Bytes;
use canter_rt::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use canter_rt::{Body, Reply, Response};

use super::extract::Parts;
use super::handler::Handler;
use super::response::IntoResponse;
use super::router::{get, Router};
#[cfg(feature = "compression")]
use super::static_compress::{read_and_compress, FileChunks, Key, StaticCompression};

const ACCEPT_RANGES_BYTES: HeaderValue = HeaderValue::from_static("bytes");
const VARY_ACCEPT_ENCODING: HeaderValue = HeaderValue::from_static("accept-encoding");
const OCTET_STREAM: &str = "application/octet-stream";
const INDEX: &str = "index.html";

/// Serves the files under a directory: a handler for `GET` routes, or mounted whole with
/// [`Router::serve_dir`].
///
/// The file is named by the route's last path parameter (typically `{*path}`), percent-decoded;
/// a route without parameters serves the directory's own index.
///
/// - **Types and directories.** Content-Type comes from the extension (`mime_guess`;
///   `application/octet-stream` if unknown). A directory serves its `index.html`; a directory
///   asked for without a trailing slash is redirected (308) to the path with one, so relative
///   links in the page resolve.
/// - **Validators.** A strong ETag `"<size hex>-<mtime ns hex>"` and Last-Modified.
///   `If-None-Match` (a list or `*`, weak comparison) and, only without it,
///   `If-Modified-Since` answer 304 with no body (RFC 9110 §13.2.2).
/// - **Ranges** (GET only, RFC 9110 §14): one range `bytes=a-b`, `a-` or `-n` gets 206 with
///   Content-Range; a range that starts past the end gets 416 with `Content-Range: bytes */size`.
///   A request for several ranges gets the whole file with 200 (a server may ignore Range;
///   multipart/byteranges is not implemented), as does a malformed Range. `If-Range` (an ETag,
///   compared strongly, or a date equal to a Last-Modified at least a second old) keeps the
///   range only if the file is unchanged. 200 responses say `Accept-Ranges: bytes`.
/// - **Precompressed siblings.** If `file.br` or `file.gz` exists next to `file` and the client
///   accepts `br` or `gzip` (Accept-Encoding, `q=0` refuses; the higher q wins, br on a tie), it
///   is served instead with Content-Encoding, `file`'s Content-Type and its own ETag; ranges
///   apply to it. `Vary: Accept-Encoding` is sent whenever a sibling exists.
/// - **Confinement.** A path with a `..` or `.` segment (also percent-encoded), an encoded `/`
///   (`%2f`), a backslash or NUL in a segment, an empty segment (`//`, an absolute path), or
///   that resolves (through symlinks) outside the root gets the same 404 as a missing file. The
///   root and each candidate are canonicalized and compared by path prefix; the final open uses
///   `O_NOFOLLOW` and `O_NONBLOCK` and checks that the open file is a regular file, so a FIFO or
///   device is never opened for reading.
/// - **Hidden files.** Names starting with `.` get 404 too, except `.well-known`, unless
///   [`ServeDir::serve_hidden`] says otherwise.
///
/// **Blocking.** Resolving, opening and `stat`ing run on the worker's thread with `std::fs`:
/// on a local disk they are served from the kernel's dentry and inode caches in microseconds,
/// far less than handing each request to a blocking pool and back (a thread hop, a future
/// and a boxed reply); the handler stays synchronous, on the runtime's fast path. The body is
/// not read here at all: `sendfile(2)` moves it in the runtime. On a slow or network file
/// system, put the lookup behind [`spawn_blocking`](canter_rt::spawn_blocking) in your own
/// handler instead.
///
/// Cloning is one reference count; the value is `Send + Sync`, so one `ServeDir` can be cloned
/// into every worker's router.
///
/// ```no_run
/// use canter::{get, Router, ServeDir};
///
/// let files = ServeDir::new("public");
/// let app = Router::new()
///     .route("/assets/{*path}", get(files.clone()))
///     .route("/favicon.ico", get(|| canter::rt::http::StatusCode::NO_CONTENT));
/// # let _ = (app, files);
/// ```
#[derive(Clone, Debug)]
pub struct ServeDir {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    /// The root as given.
    root: PathBuf,
    /// The root canonicalized when the `ServeDir` was made (`None` if that failed, for example
    /// because the directory does not exist yet; then it is tried again per request).
    canonical: Option<PathBuf>,
    /// The root opened as a directory (`O_PATH`), for `openat2(RESOLVE_BENEATH)`: one system
    /// call opens a file and proves it is below the root. `None` if the root could not be
    /// opened when the `ServeDir` was made, or the kernel lacks `openat2` (then paths are
    /// canonicalized and compared instead).
    root_fd: Option<Arc<OwnedFd>>,
    /// Serve names starting with `.` (see [`ServeDir::serve_hidden`]).
    hidden: bool,
    /// Cache-Control of files not judged immutable (see [`ServeDir::max_age`]).
    cache_control: HeaderValue,
    /// Which file names carry a content hash (see [`ServeDir::immutable_if`]).
    immutable: Immutable,
    /// Compressing files without a precompressed sibling (see [`ServeDir::compress`]).
    #[cfg(feature = "compression")]
    compress: Option<StaticCompression>,
}

/// Which files are sent as never changing.
#[derive(Clone)]
struct Immutable(Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for Immutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Immutable(..)")
    }
}

/// `Cache-Control` of a file judged immutable: a year (RFC 9111 §5.2.2.1: servers should not
/// send more) and `immutable` (RFC 8246), so browsers skip revalidating it even on reload.
const CACHE_IMMUTABLE: HeaderValue =
    HeaderValue::from_static("public, max-age=31536000, immutable");
/// `Cache-Control` with a max-age of 0: stored, but revalidated (cheaply, by ETag) on each use.
const CACHE_REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");

impl ServeDir {
    /// Serves the files under `root`. A root that does not exist (yet) is not an error: its
    /// requests get 404 until it does.
    ///
    /// ```
    /// let files = canter::ServeDir::new("/srv/www");
    /// # let _ = files;
    /// ```
    pub fn new(root: impl Into<PathBuf>) -> ServeDir {
        let root = root.into();
        let canonical = std::fs::canonicalize(&root).ok();
        let root_fd = open_root(&root).map(Arc::new);
        ServeDir {
            inner: Arc::new(Inner {
                root,
                canonical,
                root_fd,
                hidden: false,
                cache_control: CACHE_REVALIDATE,
                immutable: Immutable(Arc::new(content_hashed)),
                #[cfg(feature = "compression")]
                compress: None,
            }),
        }
    }

    /// Whether names starting with `.` (`.git/`, `.env`, `.htpasswd`) are served. Off by
    /// default: such paths get the same 404 as a missing file, except `/.well-known/` (RFC 8615),
    /// which is always served.
    ///
    /// ```
    /// let files = canter::ServeDir::new("/srv/www").serve_hidden(true);
    /// # let _ = files;
    /// ```
    pub fn serve_hidden(mut self, yes: bool) -> ServeDir {
        Arc::make_mut(&mut self.inner).hidden = yes;
        self
    }

    /// How long caches may use a file without asking again: `Cache-Control: public,
    /// max-age=SECS`. The default, zero, sends `no-cache`: caches store the file but revalidate
    /// it on each use, which the ETag makes a 304 without a body. Either way the freshness is
    /// explicit, so no cache guesses one from Last-Modified (RFC 9111 §4.2.2). Files whose names
    /// carry a content hash get a year and `immutable` instead (see [`ServeDir::immutable_if`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// let files = canter::ServeDir::new("/srv/www").max_age(Duration::from_secs(600));
    /// # let _ = files;
    /// ```
    pub fn max_age(mut self, age: std::time::Duration) -> ServeDir {
        let secs = age.as_secs();
        Arc::make_mut(&mut self.inner).cache_control = if secs == 0 {
            CACHE_REVALIDATE
        } else {
            HeaderValue::from_str(&format!("public, max-age={secs}")).unwrap_or(CACHE_REVALIDATE)
        };
        self
    }

    /// Which files never change under their name, told by the file name (its last path
    /// segment): those get `Cache-Control: public, max-age=31536000, immutable` (RFC 8246)
    /// instead of [`max_age`](ServeDir::max_age)'s value. The default is
    /// [`content_hashed`]; `immutable_if(|_| false)` turns it off.
    ///
    /// ```
    /// // Only the files under a build tool's naming scheme, `name.<hash>.js`.
    /// let files = canter::ServeDir::new("/srv/www")
    ///     .immutable_if(|name| name.ends_with(".js") && canter::content_hashed(name));
    /// # let _ = files;
    /// ```
    pub fn immutable_if(mut self, f: impl Fn(&str) -> bool + Send + Sync + 'static) -> ServeDir {
        Arc::make_mut(&mut self.inner).immutable = Immutable(Arc::new(f));
        self
    }

    /// Compresses the files of compressible types that have no precompressed sibling, for
    /// clients that accept it (see [`StaticCompression`]): from a cache of compressed copies, or
    /// as they are sent for large files. The compressed response has its own (weak) ETag, so
    /// If-None-Match and 304 work for each representation, and `Vary: Accept-Encoding`; a
    /// Range request gets the file as it is (as nginx does). `canter serve --compress` turns
    /// it on for `--static`.
    ///
    /// ```
    /// use canter::middleware::Compression;
    /// use canter::{ServeDir, StaticCompression};
    ///
    /// let files = ServeDir::new("public").compress(StaticCompression::new(Compression::new()));
    /// # let _ = files;
    /// ```
    #[cfg(feature = "compression")]
    pub fn compress(mut self, compression: StaticCompression) -> ServeDir {
        Arc::make_mut(&mut self.inner).compress = Some(compression);
        self
    }

    /// Opens `rel` below the root: a regular file (with its metadata) or a directory; `None`
    /// for anything else, anything missing, and anything that resolves (through `..` or a
    /// symlink) outside the root.
    fn lookup(&self, rel: &Path) -> Option<Found> {
        if let Some(root) = &self.inner.root_fd {
            match open_beneath(root, rel) {
                Ok(found) => return found,
                // No `openat2` here (an old kernel, or a sandbox that refuses it).
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {}
                Err(_) => return None,
            }
        }
        let root = match &self.inner.canonical {
            Some(root) => root.clone(),
            None => std::fs::canonicalize(&self.inner.root).ok()?,
        };
        let path = confine(&root, &root.join(rel))?;
        if std::fs::metadata(&path).ok()?.is_dir() {
            return Some(Found::Dir);
        }
        open_regular(&path).map(|(file, meta)| Found::File(file, meta))
    }

    /// The Cache-Control value for the file at `path`.
    fn cache_control(&self, path: &Path) -> HeaderValue {
        let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
        if (self.inner.immutable.0)(name) {
            CACHE_IMMUTABLE
        } else {
            self.inner.cache_control.clone()
        }
    }

    /// Answers one request; `rel` is the still percent-encoded path below the root.
    fn serve(&self, method: &Method, rel: &str, parts: &Parts) -> Reply {
        match self.find(method, rel, parts) {
            Ok(found) => found,
            Err(response) => Reply::Ready(response),
        }
    }

    /// [`ServeDir::serve`], with every early answer (404, 405, a redirect) as an `Err`.
    fn find(&self, method: &Method, rel: &str, parts: &Parts) -> Result<Reply, Response> {
        if *method != Method::GET && *method != Method::HEAD {
            return Err(Response::text("method not allowed\n")
                .with_status(StatusCode::METHOD_NOT_ALLOWED)
                .with_header(header::ALLOW, HeaderValue::from_static("GET, HEAD")));
        }
        let request_path = parts.path();
        let Some(segments) = decode_path(rel) else {
            return Err(not_found());
        };
        if !self.inner.hidden
            && segments
                .iter()
                .any(|s| s.starts_with(b".") && s != b".well-known")
        {
            return Err(not_found());
        }
        let mut rel = PathBuf::new();
        rel.extend(segments.iter().map(|s| OsStr::from_bytes(s)));
        let wants_dir = request_path.ends_with('/');
        let (rel, file, meta) = match self.lookup(&rel) {
            Some(Found::File(file, meta)) if !wants_dir => (rel, file, meta),
            // `file.txt/` names no directory.
            Some(Found::File(..)) | None => return Err(not_found()),
            Some(Found::Dir) if !wants_dir => {
                return Err(redirect_to_dir(request_path, parts.query()))
            }
            Some(Found::Dir) => {
                let index = rel.join(INDEX);
                match self.lookup(&index) {
                    Some(Found::File(file, meta)) => (index, file, meta),
                    _ => return Err(not_found()),
                }
            }
        };
        let path = self.inner.root.join(&rel);
        let content_type = content_type(&rel);
        let mut selected = Representation::identity(file, &meta);
        let accepted =
            AcceptEncoding::parse(header_values(parts, "accept-encoding")).unwrap_or_default();
        #[cfg(feature = "compression")]
        let compressible = self
            .inner
            .compress
            .as_ref()
            .is_some_and(|sc| sc.compression.worth(content_type.as_bytes(), meta.len()));
        #[cfg(not(feature = "compression"))]
        let compressible = false;
        // Siblings in the client's order of preference (zstd, br, gzip on a tie): the first
        // fresh one is served. A sibling older than the file was made from an earlier version.
        let fresh = |m: &Metadata| m.modified().ok() >= meta.modified().ok();
        let mut order = [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip];
        order.sort_by_key(|e| std::cmp::Reverse(accepted.weight(e.coding())));
        let mut has_sibling = false;
        // With compression on, a file found without siblings a moment ago is not probed again
        // (three failed opens per request otherwise); a sibling added since shows within a
        // second, one made for a changed file at once.
        #[cfg(feature = "compression")]
        let mtime_ns = mtime_ns(&meta);
        #[cfg(feature = "compression")]
        let probe = match &self.inner.compress {
            Some(sc) if compressible => !sc.known_without_siblings(&path, meta.len(), mtime_ns),
            _ => true,
        };
        #[cfg(not(feature = "compression"))]
        let probe = true;
        for encoding in order.into_iter().filter(|_| probe) {
            let accepted_here = accepted.weight(encoding.coding()) > 0;
            // Looked for only if it might be served, or to know whether to send Vary.
            if !accepted_here && (has_sibling || compressible) {
                continue;
            }
            let mut name = rel.clone().into_os_string();
            name.push(encoding.suffix());
            let Some(Found::File(file, sibling_meta)) = self.lookup(Path::new(&name)) else {
                continue;
            };
            if !fresh(&sibling_meta) {
                continue;
            }
            has_sibling = true;
            if accepted_here && selected.encoding.is_none() {
                selected = Representation::encoded(file, &sibling_meta, encoding);
            }
        }
        #[cfg(feature = "compression")]
        if let (true, false, Some(sc)) = (probe, has_sibling, &self.inner.compress) {
            if compressible {
                sc.without_siblings(path.clone(), meta.len(), mtime_ns);
            }
        }
        let cache_control = self.cache_control(&path);
        #[cfg_attr(not(feature = "compression"), allow(unused_mut))]
        let mut vary = has_sibling;
        #[cfg(feature = "compression")]
        if let (None, Some(sc)) = (selected.encoding, &self.inner.compress) {
            if compressible {
                // The file has a compressed representation for some clients.
                vary = true;
                // A Range gets the file as it is: ranges of a compressed copy would depend on
                // how it was compressed.
                let coding = accepted.choose(sc.compression.offered());
                if let (Some(coding), None) = (coding, parts.header("range")) {
                    match selected.compressed(
                        coding,
                        sc,
                        path,
                        parts,
                        content_type.clone(),
                        cache_control.clone(),
                    ) {
                        Ok(reply) => return Ok(reply),
                        Err(identity) => selected = identity,
                    }
                }
            }
        }
        Ok(Reply::Ready(selected.respond(
            method,
            parts,
            content_type,
            cache_control,
            vary,
        )))
    }
}

/// Whether a file name carries a content hash, as build tools write them: some part of the name
/// between `.`, `-` or `_` (the extension aside) is at least 8 characters of lowercase
/// hexadecimal with both a digit and a letter (webpack's and Rollup's `[hash]`:
/// `app.3f9a2c1e.js`, `main-5d41402abc4b2a76.css`) or of uppercase base32, `A-Z` and `2-7`,
/// with both (esbuild's `app-5XDBKMQS.js`). Dates (`report-20261125`) and words are not hashes.
/// Mixed-case hashes (Vite's `index-BHkq3Dn5.js`) cannot be told from words by their letters
/// alone: name their directory in [`ServeDir::immutable_if`] instead. The default test of
/// [`ServeDir::immutable_if`].
///
/// ```
/// assert!(canter::content_hashed("app.3f9a2c1e.js"));
/// assert!(canter::content_hashed("main-5d41402abc4b2a76.css"));
/// assert!(canter::content_hashed("chunk-5XDBKMQS.js"));
/// assert!(!canter::content_hashed("report-20261125.pdf"));
/// assert!(!canter::content_hashed("Dashboard2.js"));
/// assert!(!canter::content_hashed("style.css"));
/// ```
pub fn content_hashed(name: &str) -> bool {
    // The extension is not part of the name's hash: `file.0123abcd` has none.
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    stem.split(['.', '-', '_']).any(|part| {
        let b = part.as_bytes();
        let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
        let hex = b
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
        let base32 = b
            .iter()
            .all(|c| c.is_ascii_uppercase() || (b'2'..=b'7').contains(c));
        b.len() >= 8 && digits > 0 && digits < b.len() && (hex || base32)
    })
}

/// `ServeDir` as a handler; the marker is private.
#[doc(hidden)]
#[derive(Debug)]
pub enum ViaServeDir {}

impl Handler<ViaServeDir> for ServeDir {
    fn call(&self, parts: Parts) -> Reply {
        let path = parts.path();
        let rel = parts.params.iter(path).last().map_or("", |(_, v)| v);
        self.serve(parts.method(), rel, &parts)
    }
}

impl Router {
    /// Mounts `dir` at `prefix`: `GET`/`HEAD` of `prefix/` serve the directory's index,
    /// `prefix/{*path}` its files, and `prefix` itself redirects to `prefix/`. Other methods get
    /// 405 with `Allow: GET, HEAD`. A prefix of `"/"` mounts the directory at the root.
    ///
    /// # Panics
    ///
    /// If `prefix` does not start with `/` or ends with `/` (other than `"/"` itself), or a
    /// route conflicts.
    ///
    /// ```no_run
    /// use canter::{Router, ServeDir};
    ///
    /// let app = Router::new().serve_dir("/static", ServeDir::new("public"));
    /// # let _ = app;
    /// ```
    pub fn serve_dir(self, prefix: &str, dir: ServeDir) -> Router {
        assert!(
            prefix == "/" || (prefix.starts_with('/') && !prefix.ends_with('/')),
            "serve_dir prefix {prefix:?} must start with '/' and not end with it"
        );
        let base = prefix.trim_end_matches('/');
        let router = if base.is_empty() {
            self
        } else {
            self.route(base, get(dir.clone()))
        };
        router
            .route(&format!("{base}/"), get(dir.clone()))
            .route(&format!("{base}/{{*path}}"), get(dir))
    }
}

/// The percent-decoded segments of `rel` (a trailing slash adds none), or `None` if any segment
/// is empty (before the end), `.` or `..`, or holds `/`, `\` or NUL once decoded.
fn decode_path(rel: &str) -> Option<Vec<Vec<u8>>> {
    let rel = rel.strip_suffix('/').unwrap_or(rel);
    if rel.is_empty() {
        return Some(Vec::new());
    }
    let mut segments = Vec::new();
    for raw in rel.split('/') {
        let segment: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
        let bad = segment.is_empty()
            || segment == b"."
            || segment == b".."
            || segment.iter().any(|&b| matches!(b, b'/' | b'\\' | 0));
        if bad {
            return None;
        }
        segments.push(segment);
    }
    Some(segments)
}

/// `candidate` with every symlink resolved, if that exists and lies under `root` (canonical).
fn confine(root: &Path, candidate: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(candidate).ok()?;
    real.starts_with(root).then_some(real)
}

/// A file's modification time in nanoseconds since the epoch (0 if unknown).
#[cfg(feature = "compression")]
fn mtime_ns(meta: &Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// What a path below the root names.
enum Found {
    File(File, Metadata),
    Dir,
}

/// The root as an `O_PATH` directory descriptor, if it can be opened and `openat2` works here.
fn open_root(root: &Path) -> Option<OwnedFd> {
    let dir = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)
        .ok()?;
    let fd = OwnedFd::from(dir);
    // One probe: a kernel without `openat2` (before 5.6) or a sandbox refusing it.
    match open_beneath(&fd, Path::new(".")) {
        Ok(_) => Some(fd),
        Err(_) => None,
    }
}

/// `openat2(root, rel, O_RDONLY | O_NONBLOCK, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: opens
/// `rel` only if it resolves below `root` (symlinks included; `..` and absolute links out fail
/// with `EXDEV`), without blocking on a FIFO. `Ok(None)`: missing, out of bounds, or neither a
/// regular file nor a directory.
fn open_beneath(root: &OwnedFd, rel: &Path) -> io::Result<Option<Found>> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let Ok(c_rel) = std::ffi::CString::new(rel.as_os_str().as_bytes()) else {
        return Ok(None);
    };
    // SAFETY: `open_how` is plain data; all-zero is valid and the fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `root` is an open descriptor, `c_rel` a NUL-terminated path and `how` a valid
    // `open_how` of the size passed; the kernel reads them and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c_rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS | libc::EPERM) => Err(e),
            _ => Ok(None),
        };
    }
    // SAFETY: `fd` is a descriptor the kernel just returned to us and nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    let meta = file.metadata()?;
    Ok(if meta.is_file() {
        Some(Found::File(file, meta))
    } else if meta.is_dir() {
        Some(Found::Dir)
    } else {
        None
    })
}

/// Opens `path` for reading without following a last-component symlink (it was resolved
/// already; one appearing since is refused) and without blocking on a FIFO, and returns it
/// only if the open file is a regular file.
fn open_regular(path: &Path) -> Option<(File, Metadata)> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    meta.is_file().then_some((file, meta))
}

fn content_type(path: &Path) -> HeaderValue {
    let mime = mime_guess::from_path(path)
        .first_raw()
        .unwrap_or(OCTET_STREAM);
    HeaderValue::from_static(mime)
}

#[cfg(feature = "compression")]
fn internal_error() -> Response {
    Response::text("internal server error\n").with_status(StatusCode::INTERNAL_SERVER_ERROR)
}

fn not_found() -> Response {
    Response::text("not found\n").with_status(StatusCode::NOT_FOUND)
}

/// 308 to `path/` (with the query). `path` passed the same checks as a served file and starts
/// with a single `/`, so the target is a path on this server, never `//host`.
fn redirect_to_dir(path: &str, query: Option<&str>) -> Response {
    if path.starts_with("//") {
        return not_found();
    }
    let target = match query {
        Some(q) => format!("{path}/?{q}"),
        None => format!("{path}/"),
    };
    super::Redirect::permanent(&target).into_response()
}

/// A content coding a precompressed sibling can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Zstd,
    Brotli,
    Gzip,
}

impl Encoding {
    fn suffix(self) -> &'static str {
        match self {
            Encoding::Zstd => ".zst",
            Encoding::Brotli => ".br",
            Encoding::Gzip => ".gz",
        }
    }

    fn token(self) -> &'static str {
        self.coding().as_str()
    }

    fn coding(self) -> Coding {
        match self {
            Encoding::Zstd => Coding::Zstd,
            Encoding::Brotli => Coding::Brotli,
            Encoding::Gzip => Coding::Gzip,
        }
    }
}

fn header_values<'a>(parts: &'a Parts, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    parts
        .head()
        .headers()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// The file chosen to answer with, and its validators.
struct Representation {
    file: File,
    size: u64,
    /// Modification time, whole seconds since the epoch (the precision of Last-Modified).
    modified_secs: Option<u64>,
    /// Modification time in nanoseconds since the epoch (0 if unknown).
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    mtime_ns: u128,
    last_modified: Option<HeaderValue>,
    /// The opaque tag with its quotes, `"…"`.
    etag: String,
    encoding: Option<Encoding>,
}

impl Representation {
    fn identity(file: File, meta: &Metadata) -> Representation {
        Representation::new(file, meta, None)
    }

    fn encoded(file: File, meta: &Metadata, encoding: Encoding) -> Representation {
        Representation::new(file, meta, Some(encoding))
    }

    fn new(file: File, meta: &Metadata, encoding: Option<Encoding>) -> Representation {
        let size = meta.len();
        let modified = meta.modified().ok();
        let since_epoch = modified.and_then(|m| m.duration_since(UNIX_EPOCH).ok());
        let nanos = since_epoch.map_or(0, |d| d.as_nanos());
        let modified_secs = since_epoch.map(|d| d.as_secs());
        Representation {
            file,
            size,
            modified_secs,
            mtime_ns: nanos,
            last_modified: modified.zip(modified_secs).and_then(last_modified),
            etag: etag(size, nanos, encoding.map(Encoding::token), false),
            encoding,
        }
    }

    fn respond(
        self,
        method: &Method,
        parts: &Parts,
        content_type: HeaderValue,
        cache_control: HeaderValue,
        vary: bool,
    ) -> Response {
        // Sent with a 304 too: it updates what the cache stored (RFC 9110 §15.4.5).
        let mut validators: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(4);
        validators.push((header::CACHE_CONTROL, cache_control));
        if let Ok(etag) = HeaderValue::from_str(&self.etag) {
            validators.push((header::ETAG, etag));
        }
        if let Some(lm) = &self.last_modified {
            validators.push((header::LAST_MODIFIED, lm.clone()));
        }
        if vary {
            validators.push((header::VARY, VARY_ACCEPT_ENCODING));
        }
        if self.not_modified(parts) {
            return with_headers(Response::new(StatusCode::NOT_MODIFIED), validators);
        }
        let mut response = with_headers(Response::new(StatusCode::OK), validators)
            .with_header(header::CONTENT_TYPE, content_type)
            .with_header(header::ACCEPT_RANGES, ACCEPT_RANGES_BYTES);
        if let Some(e) = self.encoding {
            response = response.with_header(
                header::CONTENT_ENCODING,
                HeaderValue::from_static(e.token()),
            );
        }
        // Range is defined for GET only (RFC 9110 §14.2): a HEAD gets the 200 head.
        let range = match parts.header("range") {
            Some(v) if *method == Method::GET && self.if_range_holds(parts) => {
                parse_range(v, self.size)
            }
            _ => ByteRange::Full,
        };
        match range {
            ByteRange::Full => response.with_body(Body::file(self.file, 0, self.size)),
            ByteRange::Part { start, end } => {
                let value = format!("bytes {start}-{end}/{}", self.size);
                match HeaderValue::from_str(&value) {
                    Ok(content_range) => response
                        .with_status(StatusCode::PARTIAL_CONTENT)
                        .with_header(header::CONTENT_RANGE, content_range)
                        .with_body(Body::file(self.file, start, end - start + 1)),
                    Err(_) => response.with_body(Body::file(self.file, 0, self.size)),
                }
            }
            ByteRange::Unsatisfiable => {
                let value = format!("bytes */{}", self.size);
                let mut r = Response::text("range not satisfiable\n")
                    .with_status(StatusCode::RANGE_NOT_SATISFIABLE);
                if let Ok(v) = HeaderValue::from_str(&value) {
                    r = r.with_header(header::CONTENT_RANGE, v);
                }
                r
            }
        }
    }

    /// The file compressed with `coding` (it has no precompressed sibling): from the cache of
    /// compressed copies, compressed on the blocking pool on a miss, or as it is sent when it
    /// is too large to keep. Its ETag is weak (the bytes depend on the compressor, not only on
    /// the file) and names the coding. `Err(self)`: the copy is being made for another request
    /// right now, so this one is better answered with the file as it is.
    #[cfg(feature = "compression")]
    fn compressed(
        self,
        coding: Coding,
        sc: &StaticCompression,
        path: PathBuf,
        parts: &Parts,
        content_type: HeaderValue,
        cache_control: HeaderValue,
    ) -> Result<Reply, Representation> {
        let key = Key {
            path,
            coding,
            size: self.size,
            mtime_ns: self.mtime_ns,
        };
        // `W/"…"`; compared without the `W/`.
        let weak = etag(self.size, self.mtime_ns, Some(coding.as_str()), true);
        let etag = weak.get(2..).unwrap_or_default();
        let mut validators: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(4);
        validators.push((header::CACHE_CONTROL, cache_control));
        if let Ok(value) = HeaderValue::from_str(&weak) {
            validators.push((header::ETAG, value));
        }
        if let Some(lm) = &self.last_modified {
            validators.push((header::LAST_MODIFIED, lm.clone()));
        }
        validators.push((header::VARY, VARY_ACCEPT_ENCODING));
        if self.not_modified_as(parts, etag) {
            return Ok(Reply::Ready(with_headers(
                Response::new(StatusCode::NOT_MODIFIED),
                validators,
            )));
        }
        let response = with_headers(Response::new(StatusCode::OK), validators)
            .with_header(header::CONTENT_TYPE, content_type)
            .with_header(header::CONTENT_ENCODING, coding.header_value());
        if self.size > sc.max_entry {
            let source = Box::pin(FileChunks {
                file: self.file,
                left: self.size,
            });
            return Ok(Reply::Ready(
                match sc.compression.compress_stream(coding, self.size, source) {
                    Ok(body) => response.with_body(body),
                    Err(e) => {
                        tracing::error!(error = %e, path = %key.path.display(), "cannot start compressing a file");
                        internal_error()
                    }
                },
            ));
        }
        if let Some(data) = sc.cached(&key) {
            return Ok(Reply::Ready(response.with_body(Body::Full(data))));
        }
        if !sc.claim(&key) {
            return Err(self);
        }
        let (sc, file, len) = (sc.clone(), self.file, self.size);
        Ok(Reply::Pending(Box::pin(async move {
            let compression = sc.cached.clone();
            let work = move || read_and_compress(file, len, &compression, coding);
            match canter_rt::spawn_blocking(work).await {
                Ok(Ok(data)) => {
                    let data = Bytes::from(data);
                    sc.keep(key, Some(data.clone()));
                    response.with_body(Body::Full(data))
                }
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(error = %e, path = %key.path.display(), "cannot compress a file");
                    sc.keep(key, None);
                    internal_error()
                }
            }
        })))
    }

    /// The conditional GET of RFC 9110 §13.2.2: If-None-Match decides when present (weak
    /// comparison), else If-Modified-Since.
    fn not_modified(&self, parts: &Parts) -> bool {
        self.not_modified_as(parts, &self.etag)
    }

    /// [`Representation::not_modified`] for the representation tagged `etag`.
    fn not_modified_as(&self, parts: &Parts, etag: &str) -> bool {
        let mut if_none_match = header_values(parts, "if-none-match").peekable();
        if if_none_match.peek().is_some() {
            return if_none_match.any(|v| etag_list_matches(v, etag, false));
        }
        let Some(since) = parts
            .header("if-modified-since")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
        else {
            return false;
        };
        match (self.modified_secs, secs(since)) {
            (Some(modified), Some(since)) => modified <= since,
            _ => false,
        }
    }

    /// Whether a Range may apply: no If-Range, or one naming this exact representation (an
    /// ETag compared strongly, or the Last-Modified date if that is at least a second old).
    fn if_range_holds(&self, parts: &Parts) -> bool {
        let Some(value) = parts.header("if-range") else {
            return true;
        };
        let value = value.trim_ascii();
        if value.starts_with(b"\"") || value.starts_with(b"W/") {
            return etag_list_matches(value, &self.etag, true) && !value.starts_with(b"W/");
        }
        let date = std::str::from_utf8(value)
            .ok()
            .and_then(|v| httpdate::parse_http_date(v).ok());
        // A date is only a strong validator once the file has not changed for a whole second
        // (RFC 9110 §8.8.2.2): a second change within the same second would keep the date.
        let settled = self
            .modified_secs
            .is_some_and(|m| secs(SystemTime::now()).is_some_and(|now| now > m));
        match (date.and_then(secs), self.modified_secs) {
            (Some(date), Some(modified)) => settled && date == modified,
            _ => false,
        }
    }
}

/// An entity tag, `"<size>-<mtime ns>"` in hexadecimal with `-<coding>` for an encoded
/// representation, quoted, and with `W/` before it when `weak`. Written by hand: the formatting
/// machinery (two `u128` hex conversions and a `format!`) cost about a thousand instructions
/// per request.
fn etag(size: u64, mtime_ns: u128, coding: Option<&str>, weak: bool) -> String {
    let mut s = String::with_capacity(48);
    if weak {
        s.push_str("W/");
    }
    s.push('"');
    push_hex(&mut s, u128::from(size));
    s.push('-');
    push_hex(&mut s, mtime_ns);
    if let Some(coding) = coding {
        s.push('-');
        s.push_str(coding);
    }
    s.push('"');
    s
}

/// Appends `v` in lowercase hexadecimal, without leading zeros ("0" for zero).
fn push_hex(s: &mut String, mut v: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 32];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = DIGITS[(v & 0xf) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    s.extend(buf[at..].iter().map(|&b| char::from(b)));
}

thread_local! {
    /// The Last-Modified value made last on this worker, by the second it names: a file served
    /// again and again is formatted once.
    static LAST_MODIFIED: std::cell::RefCell<Option<(u64, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

/// The Last-Modified value for a file modified at `at` (`secs` after the epoch).
fn last_modified((at, secs): (SystemTime, u64)) -> Option<HeaderValue> {
    LAST_MODIFIED.with(|cell| {
        let mut cached = cell.borrow_mut();
        if let Some((s, value)) = &*cached {
            if *s == secs {
                return Some(value.clone());
            }
        }
        let value = HeaderValue::from_str(&httpdate::fmt_http_date(at)).ok()?;
        *cached = Some((secs, value.clone()));
        Some(value)
    })
}

fn secs(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

fn with_headers(mut r: Response, headers: Vec<(HeaderName, HeaderValue)>) -> Response {
    for (name, value) in headers {
        r = r.with_header(name, value);
    }
    r
}

/// Whether the entity-tag list `value` (`*`, or `"a", W/"b", …`) matches `etag` (`"…"`, with
/// quotes). Weak comparison ignores `W/`; strong comparison never matches a weak tag.
fn etag_list_matches(value: &[u8], etag: &str, strong: bool) -> bool {
    let etag = etag.as_bytes();
    let mut rest = value;
    loop {
        rest = trim_list_separators(rest);
        if rest.is_empty() {
            return false;
        }
        if rest[0] == b'*' {
            return !strong;
        }
        let weak = rest.starts_with(b"W/");
        if weak {
            rest = &rest[2..];
        }
        if rest.first() != Some(&b'"') {
            return false;
        }
        let Some(close) = rest[1..].iter().position(|&b| b == b'"') else {
            return false;
        };
        let tag = &rest[..close + 2];
        if tag == etag && !(strong && weak) {
            return true;
        }
        rest = &rest[close + 2..];
    }
}

fn trim_list_separators(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b','))
        .unwrap_or(v.len());
    &v[start..]
}

/// What a Range header asks of a representation of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ByteRange {
    /// No usable range: send everything (missing, malformed, another unit, several ranges).
    Full,
    /// Bytes `start..=end`.
    Part { start: u64, end: u64 },
    /// The one range asked for starts past the end (or the representation is empty).
    Unsatisfiable,
}

/// Parses `bytes=a-b`, `bytes=a-` or `bytes=-n` (RFC 9110 §14.1.2) against `size`.
fn parse_range(value: &[u8], size: u64) -> ByteRange {
    let value = value.trim_ascii();
    let Some(unit_end) = value.iter().position(|&b| b == b'=') else {
        return ByteRange::Full;
    };
    if !value[..unit_end]
        .trim_ascii()
        .eq_ignore_ascii_case(b"bytes")
    {
        return ByteRange::Full;
    }
    let mut specs = value[unit_end + 1..]
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        return ByteRange::Full;
    };
    let Some(dash) = spec.iter().position(|&b| b == b'-') else {
        return ByteRange::Full;
    };
    let (first, last) = (&spec[..dash], &spec[dash + 1..]);
    match (digits(first), digits(last)) {
        // -n: the last n bytes.
        (None, Some(n)) if first.is_empty() => {
            if n == 0 || size == 0 {
                ByteRange::Unsatisfiable
            } else {
                ByteRange::Part {
                    start: size - n.min(size),
                    end: size - 1,
                }
            }
        }
        // a-: from a to the end.
        (Some(start), None) if last.is_empty() => {
            if start >= size {
                ByteRange::Unsatisfiable
            } else {
                ByteRange::Part {
                    start,
                    end: size - 1,
                }
            }
        }
        (Some(start), Some(end)) if start <= end => {
            if start >= size {
                ByteRange::Unsatisfiable
            } else {
                ByteRange::Part {
                    start,
                    end: end.min(size - 1),
                }
            }
        }
        _ => ByteRange::Full,
    }
}

/// A non-empty run of ASCII digits as a number (saturating: a huge position is past any end).
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        use ByteRange::*;
        let cases: &[(&str, u64, ByteRange)] = &[
            ("bytes=0-0", 10, Part { start: 0, end: 0 }),
            ("bytes=0-9", 10, Part { start: 0, end: 9 }),
            ("bytes=2-100", 10, Part { start: 2, end: 9 }),
            ("bytes=9-", 10, Part { start: 9, end: 9 }),
            ("bytes=-3", 10, Part { start: 7, end: 9 }),
            ("bytes=-30", 10, Part { start: 0, end: 9 }),
            ("Bytes = 1-2", 10, Part { start: 1, end: 2 }),
            ("bytes= 1-2 ,", 10, Part { start: 1, end: 2 }),
            (
                "bytes=0-99999999999999999999999",
                10,
                Part { start: 0, end: 9 },
            ),
            ("bytes=10-", 10, Unsatisfiable),
            ("bytes=10-20", 10, Unsatisfiable),
            ("bytes=99999999999999999999999-", 10, Unsatisfiable),
            ("bytes=-0", 10, Unsatisfiable),
            ("bytes=0-", 0, Unsatisfiable),
            ("bytes=-1", 0, Unsatisfiable),
            ("bytes=5-4", 10, Full),
            ("bytes=0-1,3-4", 10, Full),
            ("bytes=-", 10, Full),
            ("bytes=a-b", 10, Full),
            ("bytes=1", 10, Full),
            ("bytes=", 10, Full),
            ("items=0-1", 10, Full),
            ("bytes=+1-2", 10, Full),
            ("bytes=1 -2", 10, Full),
        ];
        for (value, size, want) in cases {
            assert_eq!(
                parse_range(value.as_bytes(), *size),
                *want,
                "{value:?} of {size}"
            );
        }
    }

    #[test]
    fn etags_are_written_as_format_would() {
        for (size, ns) in [
            (0u64, 0u128),
            (1, 15),
            (100_000, 1_764_123_456_789_012_345),
            (u64::MAX, u128::MAX),
        ] {
            assert_eq!(etag(size, ns, None, false), format!("\"{size:x}-{ns:x}\""));
            assert_eq!(
                etag(size, ns, Some("br"), false),
                format!("\"{size:x}-{ns:x}-br\"")
            );
            assert_eq!(
                etag(size, ns, Some("gzip"), true),
                format!("W/\"{size:x}-{ns:x}-gzip\"")
            );
        }
    }

    #[test]
    fn etag_lists() {
        let tag = "\"a-1\"";
        let cases: &[(&str, bool, bool)] = &[
            ("\"a-1\"", false, true),
            ("\"a-1\"", true, true),
            ("W/\"a-1\"", false, true),
            ("W/\"a-1\"", true, false),
            ("*", false, true),
            ("*", true, false),
            ("\"x\", \"a-1\"", false, true),
            ("\"x\",W/\"a-1\"", false, true),
            ("\"x\" , \"y\"", false, false),
            ("\"a-1", false, false),
            ("a-1", false, false),
            ("", false, false),
            ("\"a,1\", \"a-1\"", false, true),
        ];
        for (value, strong, want) in cases {
            assert_eq!(
                etag_list_matches(value.as_bytes(), tag, *strong),
                *want,
                "{value:?} strong={strong}"
            );
        }
    }

    #[test]
    fn accept_encoding() {
        let q = |v: &str| {
            let a = AcceptEncoding::parse(std::iter::once(v.as_bytes())).unwrap_or_default();
            (
                a.weight(Encoding::Brotli.coding()),
                a.weight(Encoding::Gzip.coding()),
            )
        };
        assert_eq!(q("gzip, deflate, br"), (1000, 1000));
        assert_eq!(q("br;q=0, gzip;q=0.5"), (0, 500));
        assert_eq!(q("*;q=0.1, gzip;q=0"), (100, 0));
        assert_eq!(q("identity"), (0, 0));
        assert_eq!(q("BR ; Q=1.000 , x-gzip;q=0.001"), (1000, 1));
        assert_eq!(q("br;q=2, gzip;q=0.1234, *;q=abc"), (0, 0));
    }

    #[test]
    fn paths() {
        let ok = |p: &str| decode_path(p).map(|s| s.concat());
        assert_eq!(ok(""), Some(vec![]));
        assert_eq!(ok("a/b.txt"), Some(b"ab.txt".to_vec()));
        assert_eq!(ok("dir/"), Some(b"dir".to_vec()));
        assert_eq!(ok("a%20b"), Some(b"a b".to_vec()));
        assert_eq!(ok("%252e%252e"), Some(b"%2e%2e".to_vec()));
        assert_eq!(ok("..."), Some(b"...".to_vec()));
        for bad in [
            "..",
            "a/../b",
            "%2e%2e",
            "%2E%2e/x",
            ".",
            "a/./b",
            "%2e",
            "a%2fb",
            "a%2Fb",
            "a\\b",
            "a%5cb",
            "a%00b",
            "/etc/passwd",
            "a//b",
            "//",
        ] {
            assert_eq!(decode_path(bad), None, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod lookup_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Both ways of confining a lookup to the root agree: `openat2(RESOLVE_BENEATH)` and, where
    /// the kernel lacks it, canonicalizing and comparing prefixes.
    #[test]
    fn openat2_and_canonical_paths_agree() {
        use std::os::unix::fs::symlink;
        let base = std::env::temp_dir().join(format!("canter-lookup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(base.join("secret"), b"s").unwrap();
        symlink("a.txt", root.join("in")).unwrap();
        symlink("../secret", root.join("out")).unwrap();
        symlink(base.join("secret"), root.join("abs-out")).unwrap();
        let with_fd = ServeDir::new(&root);
        assert!(
            with_fd.inner.root_fd.is_some(),
            "openat2 is available on this kernel"
        );
        let mut without = ServeDir::new(&root);
        Arc::make_mut(&mut without.inner).root_fd = None;
        for (rel, want) in [
            ("a.txt", Some(true)),
            ("in", Some(true)),
            ("sub", Some(false)),
            ("", Some(false)),
            ("out", None),
            ("abs-out", None),
            ("../secret", None),
            ("sub/../../secret", None),
            ("missing", None),
        ] {
            for dir in [&with_fd, &without] {
                let got = dir
                    .lookup(Path::new(rel))
                    .map(|f| matches!(f, Found::File(..)));
                assert_eq!(
                    got,
                    want,
                    "{rel} (openat2: {})",
                    dir.inner.root_fd.is_some()
                );
            }
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
