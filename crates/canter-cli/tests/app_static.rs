//! Static files over real sockets: `canter serve --static DIR` (the binary) for most cases, an
//! in-process server for the `ServeDir` route forms. Raw requests check every header and byte
//! (and the traversal attempts, which curl would normalize away); curl downloads a multi-MiB
//! file, resumes a range, follows the directory redirect and decodes a real gzip sibling.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use canter::{get, Router, ServeDir};
use common::{assert_imf_fixdate, curl, need, random_bytes, Client, InProcess, Response, Server};

const HELLO: &[u8] = b"hello, static\n";
const SECRET: &[u8] = b"top secret: outside the root\n";
const BIG: usize = 6 << 20;

/// A fresh directory for one use.
fn fresh_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "app_static-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tree with a served root `<base>/root` and things outside it:
///
/// ```text
/// base/secret.txt                      outside the root
/// base/outside/x.txt                   outside the root
/// base/root/index.html, hello.txt, empty.txt, big.bin (6 MiB), a b.txt, 100%.txt, logo.png,
///           data.unknownext, app.js (+ .br, .gz), style.css (+ .gz only),
///           evil.js (+ evil.js.br -> ../secret.txt), real.txt (+ a real gzip .gz if gzip exists),
///           sub/index.html, sub/page.html, noindex/file.txt,
///           link-in -> hello.txt, link-out -> ../secret.txt, dir-out -> ../outside,
///           fifo (a named pipe)
/// ```
struct Tree {
    base: PathBuf,
    root: PathBuf,
    big: Vec<u8>,
}

fn build_tree(name: &str) -> Tree {
    use std::os::unix::fs::symlink;
    let base = fresh_dir(name);
    let root = base.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("noindex")).unwrap();
    std::fs::create_dir_all(base.join("outside")).unwrap();
    std::fs::write(base.join("secret.txt"), SECRET).unwrap();
    std::fs::write(base.join("outside/x.txt"), SECRET).unwrap();
    let w = |p: &str, data: &[u8]| std::fs::write(root.join(p), data).unwrap();
    w("index.html", b"<h1>root index</h1>\n");
    w("hello.txt", HELLO);
    // An hour old, so that its Last-Modified is a strong validator (If-Range by date).
    std::fs::File::options()
        .write(true)
        .open(root.join("hello.txt"))
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    w("empty.txt", b"");
    let big = random_bytes(BIG, 77);
    w("big.bin", &big);
    w("a b.txt", b"space\n");
    w("100%.txt", b"percent\n");
    w("logo.png", b"\x89PNG fake");
    w("data.unknownext", b"?");
    w("app.js", b"console.log('identity');\n");
    w("app.js.br", b"BROTLI-BYTES-OF-APP-JS");
    w("app.js.gz", b"GZIP-BYTES-OF-APP-JS!!");
    w("style.css", b"body { color: red }\n");
    w("style.css.gz", b"GZIP-CSS");
    w("evil.js", b"evil identity\n");
    w("real.txt", &HELLO.repeat(100));
    w("sub/index.html", b"<h1>sub index</h1>\n");
    w("sub/page.html", b"<p>page</p>\n");
    w("noindex/file.txt", b"file\n");
    symlink("../secret.txt", root.join("evil.js.br")).unwrap();
    symlink("hello.txt", root.join("link-in")).unwrap();
    symlink("../secret.txt", root.join("link-out")).unwrap();
    symlink("../outside", root.join("dir-out")).unwrap();
    let made = Command::new("mkfifo").arg(root.join("fifo")).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    // A real gzip sibling when the tool is there (for curl --compressed).
    let _ = Command::new("gzip")
        .args(["-k", "-9"])
        .arg(root.join("real.txt"))
        .status();
    Tree { base, root, big }
}

/// The read-only tree shared by the tests that do not modify files.
fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| build_tree("shared"))
}

fn serve(tree: &Tree) -> Server {
    Server::start_with(&["--static", tree.root.to_str().unwrap()])
}

/// Sends `method target` with `headers` and reads the response.
fn request(c: &mut Client, method: &str, target: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: x\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    c.send(req);
    c.response_to(method == "HEAD")
}

fn get_with(c: &mut Client, target: &str, headers: &[(&str, &str)]) -> Response {
    request(c, "GET", target, headers)
}

fn etag_of(r: &Response) -> String {
    r.header("etag")
        .unwrap_or_else(|| panic!("no ETag: {r:?}"))
        .to_owned()
}

// ---- files, types, validators ---------------------------------------------------------------

#[test]
fn file_with_type_length_and_validators() {
    let server = serve(tree());
    let mut c = server.client();
    let r = c.get("/static/hello.txt");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, HELLO);
    assert_eq!(r.header("content-type"), Some("text/plain"), "{r:?}");
    assert_eq!(r.header("content-length"), Some("14"), "{r:?}");
    assert_eq!(r.header("accept-ranges"), Some("bytes"), "{r:?}");
    assert!(r.header("vary").is_none(), "no sibling, no Vary: {r:?}");
    assert!(r.header("content-encoding").is_none(), "{r:?}");
    assert!(!r.closes(), "{r:?}");
    // "<size hex>-<mtime hex>", strong.
    let etag = etag_of(&r);
    let inner = etag.strip_prefix("\"e-").and_then(|t| t.strip_suffix('"'));
    assert!(
        inner.is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit())),
        "ETag {etag:?}"
    );
    assert_imf_fixdate(r.header("last-modified").unwrap());
    // The same file again: the same validators.
    let again = c.get("/static/hello.txt");
    assert_eq!(etag_of(&again), etag);
    for (path, ty) in [
        ("/static/index.html", "text/html"),
        ("/static/sub/page.html", "text/html"),
        ("/static/app.js", "text/javascript"),
        ("/static/style.css", "text/css"),
        ("/static/logo.png", "image/png"),
        ("/static/data.unknownext", "application/octet-stream"),
    ] {
        let r = c.get(path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}: {r:?}");
    }
    let r = c.get("/static/empty.txt");
    assert_eq!(
        (r.status, r.header("content-length")),
        (200, Some("0")),
        "{r:?}"
    );
}

#[test]
fn percent_encoded_names_are_decoded() {
    let server = serve(tree());
    let mut c = server.client();
    assert_eq!(c.get("/static/a%20b.txt").body, b"space\n");
    assert_eq!(c.get("/static/100%25.txt").body, b"percent\n");
    assert_eq!(c.get("/static/%68ello.txt").body, HELLO);
    // Decoded once only: `%2568` is the name `%68ello.txt`, which does not exist.
    assert_eq!(c.get("/static/%2568ello.txt").status, 404);
    // A symlink that stays inside the root is followed.
    assert_eq!(c.get("/static/link-in").body, HELLO);
}

#[test]
fn directories_serve_their_index_or_redirect() {
    let server = serve(tree());
    let mut c = server.client();
    let r = c.get("/static/");
    assert_eq!(
        (r.status, r.text()),
        (200, "<h1>root index</h1>\n"),
        "{r:?}"
    );
    assert_eq!(r.header("content-type"), Some("text/html"));
    let r = c.get("/static/sub/");
    assert_eq!(r.text(), "<h1>sub index</h1>\n", "{r:?}");
    let r = c.get("/static");
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some("/static/")),
        "{r:?}"
    );
    let r = c.get("/static/sub");
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some("/static/sub/")),
        "{r:?}"
    );
    let r = c.get("/static/sub?x=1");
    assert_eq!(r.header("location"), Some("/static/sub/?x=1"), "{r:?}");
    // No index.html: 404, not a listing.
    assert_eq!(c.get("/static/noindex/").status, 404);
    assert_eq!(c.get("/static/noindex/file.txt").status, 200);
    // A file asked for as a directory.
    assert_eq!(c.get("/static/hello.txt/").status, 404);
    assert!(!c.get("/static/").closes());
}

#[test]
fn head_gets_the_head_only() {
    let server = serve(tree());
    let mut c = server.client();
    let r = request(&mut c, "HEAD", "/static/big.bin", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-length"), Some(&*BIG.to_string()), "{r:?}");
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert!(r.header("etag").is_some());
    // Range is for GET only: HEAD gets the 200 head.
    let r = request(&mut c, "HEAD", "/static/big.bin", &[("Range", "bytes=0-9")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("content-range").is_none(), "{r:?}");
    let r = request(&mut c, "HEAD", "/static/", &[]);
    assert_eq!(
        (r.status, r.header("content-length")),
        (200, Some("20")),
        "{r:?}"
    );
    // Not one body byte went out: the next response follows directly.
    assert_eq!(c.get("/static/hello.txt").body, HELLO);
}

#[test]
fn other_methods_get_405() {
    let server = serve(tree());
    let mut c = server.client();
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in ["/static/hello.txt", "/static/", "/static"] {
            c.send(format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            ));
            let r = c.response();
            assert_eq!(r.status, 405, "{method} {path}: {r:?}");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{r:?}");
        }
    }
}

#[test]
fn fifo_and_special_files_are_not_opened() {
    let server = serve(tree());
    let mut c = server.client();
    let start = Instant::now();
    assert_eq!(c.get("/static/fifo").status, 404);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "blocked on the FIFO"
    );
    assert_eq!(c.get("/static/hello.txt").body, HELLO);
}

// ---- confinement -----------------------------------------------------------------------------

#[test]
fn no_escape_from_the_root() {
    let tree = tree();
    let server = serve(tree);
    let secret_abs = tree.base.join("secret.txt");
    let secret_abs = secret_abs.to_str().unwrap();
    let reference = server.client().get("/static/no-such-file");
    assert_eq!(reference.status, 404);
    let absolute = format!("/static/{secret_abs}");
    let absolute_encoded = format!("/static/{}", secret_abs.replace('/', "%2f"));
    let targets: Vec<&str> = vec![
        "/static/../secret.txt",
        "/static/../../secret.txt",
        "/static/sub/../../secret.txt",
        "/static/%2e%2e/secret.txt",
        "/static/%2E%2E/secret.txt",
        "/static/.%2e/secret.txt",
        "/static/%2e./secret.txt",
        "/static/sub/%2e%2e/%2e%2e/secret.txt",
        "/static/..%2fsecret.txt",
        "/static/%2e%2e%2fsecret.txt",
        "/static/sub%2f..%2f..%2fsecret.txt",
        "/static/..%5csecret.txt",
        "/static/..\\secret.txt",
        "/static/sub\\page.html",
        "/static/hello.txt%00",
        "/static/%00",
        "/static/hello.txt%00.png",
        "/static//secret.txt",
        "/static//etc/passwd",
        "/static/%2fetc%2fpasswd",
        &absolute,
        &absolute_encoded,
        "/static/./hello.txt",
        "/static/%2e/hello.txt",
        "/static/sub/./page.html",
        "/static/sub//page.html",
        "/static/link-out",
        "/static/dir-out/x.txt",
        "/static/dir-out/",
        "/static/dir-out",
        "http://x/static/../secret.txt",
        "http://x/static/%2e%2e/secret.txt",
        "/static/../no-such-file",
    ];
    for target in targets {
        let mut c = server.client();
        c.send(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes());
        let r = c.response();
        assert_eq!(r.status, 404, "{target}: {r:?}");
        assert_eq!(
            r.body, reference.body,
            "{target}: same 404 as a missing file"
        );
        assert_eq!(
            r.header("content-type"),
            reference.header("content-type"),
            "{target}"
        );
        assert!(!r.body.windows(6).any(|w| w == b"secret"), "{target}");
        // The connection goes on: nothing about the attempt differs from a miss.
        assert_eq!(c.get("/static/hello.txt").body, HELLO, "{target}");
    }
    // A precompressed sibling that is a symlink out of the root is ignored, and does not count
    // as a sibling (no Vary).
    let mut c = server.client();
    let r = get_with(
        &mut c,
        "/static/evil.js",
        &[("Accept-Encoding", "br, gzip")],
    );
    assert_eq!(r.body, b"evil identity\n", "{r:?}");
    assert!(r.header("content-encoding").is_none(), "{r:?}");
    assert!(r.header("vary").is_none(), "{r:?}");
    // The request's absolute form was not needed to reach the file: a plain GET works.
    assert_eq!(c.get("/static/hello.txt").body, HELLO);
}

// ---- conditional requests ---------------------------------------------------------------------

#[test]
fn conditional_get_answers_304() {
    let server = serve(tree());
    let mut c = server.client();
    let r = c.get("/static/hello.txt");
    let etag = etag_of(&r);
    let last_modified = r.header("last-modified").unwrap().to_owned();
    let weak = format!("W/{etag}");
    let list = format!("\"nope\", {etag}");
    let old = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(10 * 86400 * 365));
    let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(86400));
    let not_modified: &[&[(&str, &str)]] = &[
        &[("If-None-Match", &etag)],
        &[("If-None-Match", &weak)],
        &[("If-None-Match", &list)],
        &[("If-None-Match", "*")],
        &[("If-None-Match", "\"nope\""), ("If-None-Match", &etag)],
        &[("If-Modified-Since", &last_modified)],
        &[("If-Modified-Since", &future)],
        // If-None-Match decides; If-Modified-Since is ignored with it.
        &[("If-None-Match", &etag), ("If-Modified-Since", &old)],
    ];
    for headers in not_modified {
        let r = get_with(&mut c, "/static/hello.txt", headers);
        assert_eq!(r.status, 304, "{headers:?}: {r:?}");
        assert!(r.header("content-length").is_none(), "{r:?}");
        assert!(r.header("transfer-encoding").is_none(), "{r:?}");
        assert_eq!(r.header("etag"), Some(&*etag), "{r:?}");
        assert_eq!(r.header("last-modified"), Some(&*last_modified), "{r:?}");
        assert!(!r.closes(), "{r:?}");
    }
    let modified: &[&[(&str, &str)]] = &[
        &[("If-None-Match", "\"nope\"")],
        &[
            ("If-None-Match", "\"nope\""),
            ("If-Modified-Since", &last_modified),
        ],
        &[("If-Modified-Since", &old)],
        &[("If-Modified-Since", "yesterday")],
        &[("If-None-Match", "garbage")],
    ];
    for headers in modified {
        let r = get_with(&mut c, "/static/hello.txt", headers);
        assert_eq!(r.status, 200, "{headers:?}: {r:?}");
        assert_eq!(r.body, HELLO);
    }
    // HEAD too.
    let r = request(
        &mut c,
        "HEAD",
        "/static/hello.txt",
        &[("If-None-Match", &etag)],
    );
    assert_eq!(r.status, 304, "{r:?}");
    // Directories answer for their index.
    let idx = c.get("/static/");
    let r = get_with(&mut c, "/static/", &[("If-None-Match", &etag_of(&idx))]);
    assert_eq!(r.status, 304, "{r:?}");
    assert_eq!(c.get("/static/hello.txt").body, HELLO);
}

#[test]
fn validators_change_with_the_file() {
    let tree = build_tree("change");
    let server = serve(&tree);
    let mut c = server.client();
    let path = tree.root.join("hello.txt");
    let before = c.get("/static/hello.txt");
    let etag = etag_of(&before);
    std::fs::write(&path, b"changed and longer\n").unwrap();
    let r = get_with(&mut c, "/static/hello.txt", &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"changed and longer\n");
    assert_ne!(etag_of(&r), etag);
    // Same size, later mtime: a new tag too.
    let etag2 = etag_of(&r);
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    drop(file);
    let r = get_with(&mut c, "/static/hello.txt", &[("If-None-Match", &etag2)]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_ne!(etag_of(&r), etag2);
    // A Last-Modified that is not a second old yet is no strong validator: If-Range with it
    // gets the whole file.
    let fresh = r.header("last-modified").unwrap().to_owned();
    let r = get_with(
        &mut c,
        "/static/hello.txt",
        &[("Range", "bytes=0-3"), ("If-Range", &fresh)],
    );
    assert_eq!(r.status, 200, "{r:?}");
    // If-Range with the old tag: the whole new file, not a piece of it.
    let r = get_with(
        &mut c,
        "/static/hello.txt",
        &[("Range", "bytes=0-3"), ("If-Range", &etag)],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"changed and longer\n");
}

// ---- ranges ------------------------------------------------------------------------------------

#[test]
fn byte_ranges() {
    let tree = tree();
    let server = serve(tree);
    let mut c = server.client();
    let size = BIG as u64;
    let big = &tree.big;
    let cases: &[(&str, u64, u64)] = &[
        ("bytes=0-9", 0, 9),
        ("bytes=10-", 10, size - 1),
        ("bytes=-5", size - 5, size - 1),
        ("bytes=-99999999999", 0, size - 1),
        ("bytes=5-99999999999", 5, size - 1),
        ("bytes=1048576-2097151", 1 << 20, (2 << 20) - 1),
        ("bytes=6291455-6291455", size - 1, size - 1),
    ];
    for (range, start, end) in cases {
        let r = get_with(&mut c, "/static/big.bin", &[("Range", range)]);
        assert_eq!(r.status, 206, "{range}: {r:?}");
        assert_eq!(
            r.header("content-range"),
            Some(&*format!("bytes {start}-{end}/{size}")),
            "{range}"
        );
        let len = end - start + 1;
        assert_eq!(
            r.header("content-length"),
            Some(&*len.to_string()),
            "{range}"
        );
        assert!(
            r.body == big[*start as usize..=*end as usize],
            "{range}: wrong bytes"
        );
        assert!(r.header("etag").is_some() && r.header("last-modified").is_some());
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    }
    for range in [
        "bytes=6291456-",
        "bytes=6291456-6291460",
        "bytes=99999999999-",
        "bytes=-0",
    ] {
        let r = get_with(&mut c, "/static/big.bin", &[("Range", range)]);
        assert_eq!(r.status, 416, "{range}: {r:?}");
        assert_eq!(
            r.header("content-range"),
            Some(&*format!("bytes */{size}")),
            "{range}"
        );
        assert!(!r.closes(), "{r:?}");
    }
    let r = get_with(&mut c, "/static/empty.txt", &[("Range", "bytes=0-")]);
    assert_eq!(r.status, 416, "{r:?}");
    assert_eq!(r.header("content-range"), Some("bytes */0"));
    // Several ranges, a malformed or backwards range, another unit: the whole file with 200.
    for range in [
        "bytes=0-1,5-9",
        "bytes=9-5",
        "bytes=x-y",
        "lines=1-2",
        "bytes 0-9",
    ] {
        let r = get_with(&mut c, "/static/hello.txt", &[("Range", range)]);
        assert_eq!(r.status, 200, "{range}: {r:?}");
        assert_eq!(r.body, HELLO, "{range}");
        assert_eq!(r.header("accept-ranges"), Some("bytes"));
        assert!(r.header("content-range").is_none());
    }
}

#[test]
fn if_range_keeps_or_drops_the_range() {
    let server = serve(tree());
    let mut c = server.client();
    let r = c.get("/static/hello.txt");
    let etag = etag_of(&r);
    let last_modified = r.header("last-modified").unwrap().to_owned();
    let weak = format!("W/{etag}");
    let earlier = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(86400 * 400));
    for (if_range, status) in [
        (etag.as_str(), 206),
        (last_modified.as_str(), 206),
        ("\"other\"", 200),
        (weak.as_str(), 200),
        (earlier.as_str(), 200),
        ("not a validator", 200),
    ] {
        let r = get_with(
            &mut c,
            "/static/hello.txt",
            &[("Range", "bytes=0-4"), ("If-Range", if_range)],
        );
        assert_eq!(r.status, status, "If-Range {if_range}: {r:?}");
        let want: &[u8] = if status == 206 { &HELLO[..5] } else { HELLO };
        assert_eq!(r.body, want, "If-Range {if_range}");
    }
}

// ---- precompressed siblings ---------------------------------------------------------------------

#[test]
fn precompressed_siblings() {
    let server = serve(tree());
    let mut c = server.client();
    let identity = c.get("/static/app.js");
    assert_eq!(identity.body, b"console.log('identity');\n");
    assert_eq!(
        identity.header("vary"),
        Some("accept-encoding"),
        "{identity:?}"
    );
    assert!(identity.header("content-encoding").is_none());
    let cases: &[(&str, Option<&str>)] = &[
        ("gzip, deflate, br", Some("br")),
        ("br", Some("br")),
        ("gzip", Some("gzip")),
        ("GZIP", Some("gzip")),
        ("x-gzip", Some("gzip")),
        ("br;q=0, gzip", Some("gzip")),
        ("gzip;q=1, br;q=0.5", Some("gzip")),
        ("gzip;q=0.5, br;q=0.5", Some("br")),
        ("*", Some("br")),
        ("*;q=0", None),
        ("br;q=0, gzip;q=0", None),
        ("identity", None),
        ("deflate, zstd", None),
        ("", None),
    ];
    let mut tags = std::collections::HashSet::new();
    for (accept, chosen) in cases {
        let r = get_with(&mut c, "/static/app.js", &[("Accept-Encoding", accept)]);
        assert_eq!(r.status, 200, "{accept}: {r:?}");
        assert_eq!(r.header("content-encoding"), *chosen, "{accept}: {r:?}");
        assert_eq!(r.header("vary"), Some("accept-encoding"), "{accept}");
        assert_eq!(
            r.header("content-type"),
            Some("text/javascript"),
            "{accept}"
        );
        let body: &[u8] = match chosen {
            Some("br") => b"BROTLI-BYTES-OF-APP-JS",
            Some(_) => b"GZIP-BYTES-OF-APP-JS!!",
            None => b"console.log('identity');\n",
        };
        assert_eq!(r.body, body, "{accept}");
        tags.insert(etag_of(&r));
    }
    assert_eq!(tags.len(), 3, "one ETag per representation: {tags:?}");
    // Only a .gz sibling.
    let r = get_with(&mut c, "/static/style.css", &[("Accept-Encoding", "br")]);
    assert_eq!(r.body, b"body { color: red }\n");
    assert!(r.header("content-encoding").is_none());
    assert_eq!(r.header("vary"), Some("accept-encoding"));
    let r = get_with(
        &mut c,
        "/static/style.css",
        &[("Accept-Encoding", "br, gzip")],
    );
    assert_eq!(
        (r.header("content-encoding"), &*r.body),
        (Some("gzip"), &b"GZIP-CSS"[..])
    );
    assert_eq!(r.header("content-type"), Some("text/css"));
    // No sibling: no Vary.
    let r = get_with(
        &mut c,
        "/static/hello.txt",
        &[("Accept-Encoding", "br, gzip")],
    );
    assert!(r.header("vary").is_none() && r.header("content-encoding").is_none());
}

#[test]
fn precompressed_ranges_heads_and_validators() {
    let server = serve(tree());
    let mut c = server.client();
    let br = [("Accept-Encoding", "br")];
    let r = get_with(&mut c, "/static/app.js", &br);
    let br_tag = etag_of(&r);
    // The range applies to the selected representation.
    let r = get_with(&mut c, "/static/app.js", &[br[0], ("Range", "bytes=0-5")]);
    assert_eq!(r.status, 206, "{r:?}");
    assert_eq!(r.body, b"BROTLI");
    assert_eq!(r.header("content-range"), Some("bytes 0-5/22"));
    assert_eq!(r.header("content-encoding"), Some("br"));
    // If-Range with the brotli tag, asked without br: another representation, so all of it.
    let r = get_with(
        &mut c,
        "/static/app.js",
        &[("Range", "bytes=0-5"), ("If-Range", &br_tag)],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"console.log('identity');\n");
    // 304 for the brotli tag only when brotli would be served, with Vary.
    let r = get_with(
        &mut c,
        "/static/app.js",
        &[br[0], ("If-None-Match", &br_tag)],
    );
    assert_eq!(r.status, 304, "{r:?}");
    assert_eq!(r.header("vary"), Some("accept-encoding"));
    let r = get_with(&mut c, "/static/app.js", &[("If-None-Match", &br_tag)]);
    assert_eq!(r.status, 200, "{r:?}");
    let r = request(&mut c, "HEAD", "/static/app.js", &br);
    assert_eq!(r.header("content-length"), Some("22"), "{r:?}");
    assert_eq!(r.header("content-encoding"), Some("br"), "{r:?}");
}

// ---- pipelining, the flag, the route forms ------------------------------------------------------

#[test]
fn pipelined_file_responses_stay_in_order() {
    let tree = tree();
    let server = serve(tree);
    let mut c = server.client();
    let etag = etag_of(&c.get("/static/hello.txt"));
    let mut batch = String::new();
    for (path, extra) in [
        ("/static/hello.txt", String::new()),
        ("/static/big.bin", "Range: bytes=-3\r\n".to_owned()),
        ("/static/hello.txt", format!("If-None-Match: {etag}\r\n")),
        ("/plaintext", String::new()),
        ("/static/big.bin", String::new()),
        ("/static/missing", String::new()),
        ("/static/hello.txt", String::new()),
    ] {
        batch.push_str(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"));
    }
    c.send(batch);
    assert_eq!(c.response().body, HELLO);
    let r = c.response();
    assert_eq!((r.status, &r.body[..]), (206, &tree.big[BIG - 3..]));
    assert_eq!(c.response().status, 304);
    assert_eq!(c.response().body, b"Hello, World!");
    assert!(c.response().body == tree.big, "big file differs");
    assert_eq!(c.response().status, 404);
    assert_eq!(c.response().body, HELLO);
}

#[test]
fn static_flag_mounts_and_absence_leaves_no_route() {
    let tree = tree();
    let server = Server::start();
    let r = server.client().get("/static/hello.txt");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.text(), "no such endpoint\n");
    drop(server);
    let server = serve(tree);
    assert!(server.log().contains("at /static/"), "{}", server.log());
    assert_eq!(server.client().get("/static/hello.txt").body, HELLO);
    // The rest of the demo is still there.
    assert_eq!(server.client().get("/plaintext").body, b"Hello, World!");
    // A --static that is not a directory is refused at startup.
    let file = tree.root.join("hello.txt");
    let args = ["serve", "--addr", "127.0.0.1:0", "--static"].map(std::ffi::OsStr::new);
    let (status, err) = common::canter_exits(&[&args[..], &[file.as_os_str()]].concat());
    assert!(!status.success());
    assert!(err.contains("not a directory"), "{err}");
}

/// `make()` served in this process on one worker, with a 2 s drain on shutdown.
fn in_process(make: impl Fn() -> Router + Send + Sync + 'static) -> InProcess {
    let config = InProcess::config(1)
        .drain_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    InProcess::start_with(config, move |_| make())
}

#[test]
fn serve_dir_as_a_route_handler_and_at_the_root() {
    let root = tree().root.clone();
    let files = ServeDir::new(root);
    let server = in_process(move || {
        Router::new()
            .route("/files/{*path}", get(files.clone()))
            .route("/one", get(files.clone()))
            .route("/one/", get(files.clone()))
    });
    let mut c = server.client();
    assert_eq!(c.get("/files/hello.txt").body, HELLO);
    assert_eq!(c.get("/files/sub/page.html").body, b"<p>page</p>\n");
    assert_eq!(c.get("/files/../secret.txt").status, 404);
    assert_eq!(c.get("/files/%2e%2e/secret.txt").status, 404);
    // A route without parameters serves the root's index, after the slash redirect.
    let r = c.get("/one");
    assert_eq!(r.header("location"), Some("/one/"), "{r:?}");
    assert_eq!(c.get("/one/").body, b"<h1>root index</h1>\n");
    drop(c);
    drop(server);

    let root = tree().root.clone();
    let files = ServeDir::new(root);
    let server = in_process(move || {
        Router::new()
            .route("/api/ping", get(|| "pong\n"))
            .serve_dir("/", files.clone())
    });
    let mut c = server.client();
    assert_eq!(c.get("/").body, b"<h1>root index</h1>\n");
    assert_eq!(c.get("/hello.txt").body, HELLO);
    assert_eq!(c.get("/sub").header("location"), Some("/sub/"));
    assert_eq!(c.get("/api/ping").body, b"pong\n");
    assert_eq!(c.get("/../secret.txt").status, 404);
    assert_eq!(c.get("//secret.txt").status, 404);
    // `//host`-looking paths are never redirected off-site.
    let r = c.get("//sub");
    assert_eq!(r.status, 404, "{r:?}");
}

#[test]
fn hidden_files_only_when_asked() {
    let base = fresh_dir("hidden");
    std::fs::create_dir_all(base.join(".git")).unwrap();
    std::fs::create_dir_all(base.join(".well-known")).unwrap();
    std::fs::create_dir_all(base.join("sub")).unwrap();
    std::fs::write(base.join(".git/config"), b"[core]\n").unwrap();
    std::fs::write(base.join(".env"), b"KEY=1\n").unwrap();
    std::fs::write(base.join("sub/.htpasswd"), b"u:p\n").unwrap();
    std::fs::write(base.join(".well-known/security.txt"), b"Contact: x\n").unwrap();
    let (a, b) = (
        ServeDir::new(&base),
        ServeDir::new(&base).serve_hidden(true),
    );
    let server = in_process(move || {
        Router::new()
            .serve_dir("/a", a.clone())
            .serve_dir("/b", b.clone())
    });
    let mut c = server.client();
    for path in ["/a/.git/config", "/a/.env", "/a/sub/.htpasswd", "/a/%2eenv"] {
        assert_eq!(c.get(path).status, 404, "{path}");
    }
    assert_eq!(c.get("/a/.well-known/security.txt").body, b"Contact: x\n");
    assert_eq!(c.get("/b/.git/config").body, b"[core]\n");
    assert_eq!(c.get("/b/sub/.htpasswd").body, b"u:p\n");
}

#[test]
fn missing_root_answers_404_until_it_exists() {
    let dir = fresh_dir("late").join("later");
    let files = ServeDir::new(dir.clone());
    let server = in_process(move || Router::new().serve_dir("/s", files.clone()));
    let mut c = server.client();
    assert_eq!(c.get("/s/a.txt").status, 404);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), b"late\n").unwrap();
    assert_eq!(c.get("/s/a.txt").body, b"late\n");
}

// ---- curl ----------------------------------------------------------------------------------------

#[test]
fn curl_downloads_resumes_and_follows() {
    need("curl");
    let tree = tree();
    let server = serve(tree);
    // A 6 MiB download, compared byte for byte.
    let out = curl(&[&server.url("/static/big.bin")]);
    assert_eq!(out.stdout.len(), BIG);
    assert!(out.stdout == tree.big, "downloaded bytes differ");
    // Resume a partial download with a range (curl -C).
    let part = fresh_dir("curl").join("big.part");
    std::fs::write(&part, &tree.big[..BIG / 3]).unwrap();
    let part_arg = part.to_str().unwrap();
    curl(&["-C", "-", "-o", part_arg, &server.url("/static/big.bin")]);
    assert!(
        std::fs::read(&part).unwrap() == tree.big,
        "resumed file differs"
    );
    // A range to stdout.
    let out = curl(&["-r", "100-199", &server.url("/static/big.bin")]);
    assert!(out.stdout == tree.big[100..200]);
    // The directory redirect, followed.
    let out = curl(&["-L", &server.url("/static/sub")]);
    assert_eq!(out.stdout, b"<h1>sub index</h1>\n");
    // HEAD.
    let out = curl(&["-I", &server.url("/static/big.bin")]);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\ncontent-length: {BIG}\r\n")),
        "{head}"
    );
    // A conditional request with the ETag curl saved.
    let etags = fresh_dir("etag").join("etag.txt");
    let etags = etags.to_str().unwrap();
    curl(&[
        "--etag-save",
        etags,
        "-o",
        "/dev/null",
        &server.url("/static/hello.txt"),
    ]);
    let out = curl(&[
        "--etag-compare",
        etags,
        "-w",
        "%{http_code}",
        &server.url("/static/hello.txt"),
    ]);
    assert_eq!(out.stdout, b"304");
    // A real gzip sibling, decoded by curl.
    if tree.root.join("real.txt.gz").exists() {
        let out = curl(&["--compressed", "-D", "-", &server.url("/static/real.txt")]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.to_ascii_lowercase().contains("content-encoding: "),
            "{text}"
        );
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert_eq!(body.as_bytes(), HELLO.repeat(100), "decoded body differs");
    }
}

// ---- freshness -------------------------------------------------------------------------------

/// Every file carries an explicit freshness, on its 200 and its 304 alike: `no-cache` by
/// default (`--static-max-age 0`), `max-age=N` when set, and a year with `immutable` for names
/// that carry a content hash, whatever the max-age.
#[test]
fn cache_control_on_every_file() {
    let dir = fresh_dir("cache");
    for name in [
        "plain.js",
        "app.3f9a2c1e.js",
        "chunk-5XDBKMQS.css",
        "report-20261125.txt",
    ] {
        std::fs::write(dir.join(name), b"x\n").unwrap();
    }
    let hashed = |name: &str| name.contains("3f9a") || name.contains("5XDB");
    for (args, plain) in [
        (vec![], "no-cache"),
        (vec!["--static-max-age", "600"], "public, max-age=600"),
    ] {
        let mut argv = vec!["--static", dir.to_str().unwrap()];
        argv.extend(args);
        let server = Server::start_with(&argv);
        let mut c = server.client();
        for name in [
            "plain.js",
            "app.3f9a2c1e.js",
            "chunk-5XDBKMQS.css",
            "report-20261125.txt",
        ] {
            let want = if hashed(name) {
                "public, max-age=31536000, immutable"
            } else {
                plain
            };
            let r = c.get(&format!("/static/{name}"));
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(r.header("cache-control"), Some(want), "{name}: {r:?}");
            let etag = etag_of(&r);
            let r = get_with(
                &mut c,
                &format!("/static/{name}"),
                &[("If-None-Match", &etag)],
            );
            assert_eq!(r.status, 304, "{r:?}");
            assert_eq!(r.header("cache-control"), Some(want), "{name}: {r:?}");
        }
    }
    // The Rust API: a custom rule, and one that turns immutability off.
    let (d1, d2) = (dir.clone(), dir.clone());
    let server = in_process(move || {
        Router::new()
            .serve_dir(
                "/a",
                ServeDir::new(&d1)
                    .max_age(Duration::from_secs(60))
                    .immutable_if(|name| name.starts_with("plain")),
            )
            .serve_dir("/b", ServeDir::new(&d2).immutable_if(|_| false))
    });
    let mut c = server.client();
    let cc = |c: &mut Client, path: &str| c.get(path).header("cache-control").map(str::to_owned);
    assert_eq!(
        cc(&mut c, "/a/plain.js").as_deref(),
        Some("public, max-age=31536000, immutable")
    );
    assert_eq!(
        cc(&mut c, "/a/app.3f9a2c1e.js").as_deref(),
        Some("public, max-age=60")
    );
    assert_eq!(
        cc(&mut c, "/b/app.3f9a2c1e.js").as_deref(),
        Some("no-cache")
    );
}
