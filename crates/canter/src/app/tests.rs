//! Router and extractor tests without sockets: requests are parsed heads (no body) handed to
//! [`Router::dispatch_head`].

#![allow(clippy::unwrap_used)]

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use canter_h1::Conn;
use canter_http::RequestHead;
use canter_http::{Limits, Timeouts};
use canter_rt::http::{Method, StatusCode};
use canter_rt::{Body, Reply, Response};
use serde::Deserialize;

use super::*;

fn head(method: &str, target: &str) -> (Method, RequestHead) {
    let mut conn = Conn::new(Limits::default(), Timeouts::default(), Instant::now());
    let mut buf = BytesMut::from(format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_str());
    let head = conn
        .poll_request(&mut buf, Instant::now())
        .unwrap()
        .unwrap();
    (Method::from_bytes(method.as_bytes()).unwrap(), head)
}

/// Dispatches and insists on the synchronous fast path.
fn ready(router: &Router, method: &str, target: &str) -> Response {
    let (m, h) = head(method, target);
    match router.dispatch_head(m, h) {
        Reply::Ready(r) => r,
        Reply::Pending(_) => panic!("{method} {target}: expected a ready reply"),
    }
}

fn text(r: &Response) -> String {
    match r.body() {
        Body::Full(b) => String::from_utf8(b.to_vec()).unwrap(),
        Body::Empty => String::new(),
        _ => panic!("streamed body"),
    }
}

#[test]
fn path_params_single_tuple_struct_and_wildcard() {
    #[derive(Deserialize)]
    struct Ids {
        a: u32,
        b: String,
    }
    let app = Router::new()
        .route("/one/{x}", get(|Path(x): Path<String>| x))
        .route(
            "/two/{a}/{b}",
            get(|Path((a, b)): Path<(u32, bool)>| format!("{a} {b}")),
        )
        .route(
            "/s/{a}/{b}",
            get(|Path(ids): Path<Ids>| format!("{}-{}", ids.a, ids.b)),
        )
        .route("/files/{*rest}", get(|Path(rest): Path<String>| rest));
    assert_eq!(text(&ready(&app, "GET", "/one/a%20b")), "a b");
    assert_eq!(text(&ready(&app, "GET", "/two/7/true")), "7 true");
    assert_eq!(text(&ready(&app, "GET", "/s/3/x%2Fy")), "3-x/y");
    assert_eq!(text(&ready(&app, "GET", "/files/a/b/c.txt")), "a/b/c.txt");
    let r = ready(&app, "GET", "/two/x/true");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(text(&r).contains("`a`"), "{}", text(&r));
    let r = ready(&app, "GET", "/one/%FF");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn method_routing_head_and_allow() {
    let app = Router::new()
        .route("/r", get(|| "got").post(|| "posted"))
        .route("/r", delete(|| "deleted"));
    assert_eq!(text(&ready(&app, "GET", "/r")), "got");
    assert_eq!(text(&ready(&app, "HEAD", "/r")), "got");
    assert_eq!(text(&ready(&app, "POST", "/r")), "posted");
    assert_eq!(text(&ready(&app, "DELETE", "/r")), "deleted");
    let r = ready(&app, "PUT", "/r");
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let allow = r.headers().iter().find(|(n, _)| n == "allow").unwrap();
    assert_eq!(allow.1, "GET, HEAD, POST, DELETE");
}

#[test]
fn fallback_and_default_404() {
    let app = Router::new().route("/a", get(|| "a"));
    let r = ready(&app, "GET", "/b");
    assert_eq!(
        (r.status(), text(&r).as_str()),
        (StatusCode::NOT_FOUND, "not found\n")
    );
    let app = app.fallback(|m: Method| (StatusCode::NOT_FOUND, format!("no {m}\n")));
    let r = ready(&app, "POST", "/b");
    assert_eq!(
        (r.status(), text(&r).as_str()),
        (StatusCode::NOT_FOUND, "no POST\n")
    );
    // A path that exists with another method is 405, not the fallback.
    assert_eq!(
        ready(&app, "POST", "/a").status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[test]
fn nest_and_state() {
    let api = Router::new()
        .route("/", get(|| "api root"))
        .route(
            "/name",
            get(|State(n): State<Arc<str>>, State(c): State<Rc<u32>>| format!("{n} {c}")),
        )
        .with_state(Rc::new(7u32));
    let app = Router::new()
        .nest("/api", api)
        .with_state::<Arc<str>>(Arc::from("canter"));
    assert_eq!(text(&ready(&app, "GET", "/api")), "api root");
    assert_eq!(text(&ready(&app, "GET", "/api/name")), "canter 7");
    let missing = Router::new().route("/", get(|State(_): State<u8>| ""));
    assert_eq!(
        ready(&missing, "GET", "/").status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn query_and_headers() {
    #[derive(Deserialize)]
    struct Q {
        n: u32,
        s: Option<String>,
    }
    let app = Router::new().route(
        "/q",
        get(|Query(q): Query<Q>, h: Headers| format!("{} {:?} {:?}", q.n, q.s, h.get_str("host"))),
    );
    assert_eq!(
        text(&ready(&app, "GET", "/q?n=3&s=a+b")),
        "3 Some(\"a b\") Some(\"x\")"
    );
    let r = ready(&app, "GET", "/q?n=x");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.content_type().unwrap(), "application/json");
    assert!(
        text(&r).starts_with("{\"error\":\"invalid query:"),
        "{}",
        text(&r)
    );
    assert!(text(&r).ends_with(",\"status\":400}"), "{}", text(&r));
}

#[test]
fn async_handlers_return_futures() {
    async fn later() -> &'static str {
        "later"
    }
    let app = Router::new().route("/", get(later));
    let (m, h) = head("GET", "/");
    assert!(matches!(app.dispatch_head(m, h), Reply::Pending(_)));
}

#[test]
fn responders() {
    use canter_rt::http::header::{HeaderName, HeaderValue, CACHE_CONTROL};
    let app = Router::new()
        .route(
            "/h",
            get(|| {
                (
                    StatusCode::ACCEPTED,
                    [(CACHE_CONTROL, HeaderValue::from_static("no-store"))],
                    Json(vec![1, 2]),
                )
            }),
        )
        .route("/r", get(|| Redirect::to("/h")))
        .route("/m", get(|| maud::html! { p { ("<b>") } }))
        .route(
            "/e",
            get(|| -> Result<&'static str, (StatusCode, String)> {
                Err((StatusCode::CONFLICT, "taken".to_owned()))
            }),
        );
    let r = ready(&app, "GET", "/h");
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(r.content_type().unwrap(), "application/json");
    assert_eq!(
        r.headers(),
        &[(
            HeaderName::from_static("cache-control"),
            HeaderValue::from_static("no-store")
        )]
    );
    assert_eq!(text(&r), "[1,2]");
    let r = ready(&app, "GET", "/r");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[0].1, "/h");
    let r = ready(&app, "GET", "/m");
    assert_eq!(text(&r), "<p>&lt;b&gt;</p>");
    assert_eq!(r.content_type().unwrap(), "text/html; charset=utf-8");
    assert_eq!(ready(&app, "GET", "/e").status(), StatusCode::CONFLICT);
}

#[test]
#[should_panic(expected = "invalid route")]
fn conflicting_routes_panic_at_build_time() {
    let _ = Router::new()
        .route("/a/{x}", get(|| ""))
        .route("/a/{y}", get(|| ""));
}

#[test]
fn json_errors_by_category() {
    use super::extract::json_from_slice;
    use serde_json::Value;
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = json_from_slice::<Value>(deep.as_bytes()).unwrap_err();
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    assert!(e.message().contains("recursion limit"), "{e}");
    let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert!(json_from_slice::<Value>(ok.as_bytes()).is_ok());
    let e = json_from_slice::<Value>(b"{").unwrap_err();
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    let e = json_from_slice::<Vec<u8>>(b"[\"a\"]").unwrap_err();
    assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// The body limit the handler's extractors see.
struct Limit(usize);

impl FromParts for Limit {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        Ok(Limit(parts.body_limit()))
    }
}

#[test]
fn nested_fallback_and_body_limit() {
    let api = Router::new()
        .route("/items", get(|Limit(n): Limit| n.to_string()))
        .route(
            "/small",
            post(|Limit(n): Limit| n.to_string()).limits(RouteLimits {
                max_body: Some(10),
                ..RouteLimits::default()
            }),
        )
        .fallback(|| (StatusCode::NOT_FOUND, "no such API\n"))
        .body_limit(1000);
    let plain = Router::new().route("/x", get(|Limit(n): Limit| n.to_string()));
    let app = Router::new()
        .route("/top", get(|Limit(n): Limit| n.to_string()))
        .nest("/api", api)
        .nest("/plain", plain)
        .fallback(|| (StatusCode::NOT_FOUND, "top fallback\n"));
    // Each router's routes keep its body limit; the route's own limit is tighter still.
    assert_eq!(text(&ready(&app, "GET", "/api/items")), "1000");
    assert_eq!(text(&ready(&app, "POST", "/api/small")), "10");
    assert_eq!(
        text(&ready(&app, "GET", "/top")),
        DEFAULT_BODY_LIMIT.to_string()
    );
    assert_eq!(
        text(&ready(&app, "GET", "/plain/x")),
        DEFAULT_BODY_LIMIT.to_string()
    );
    // Unmatched paths under the prefix go to the nested fallback, for any method; the rest to
    // the top one. A matched path with another method is still 405.
    for (method, path) in [
        ("GET", "/api/nope"),
        ("DELETE", "/api/a/b/c"),
        ("GET", "/api"),
    ] {
        let r = ready(&app, method, path);
        assert_eq!(
            (r.status(), text(&r).as_str()),
            (StatusCode::NOT_FOUND, "no such API\n"),
            "{method} {path}"
        );
    }
    assert_eq!(text(&ready(&app, "GET", "/apix")), "top fallback\n");
    assert_eq!(text(&ready(&app, "GET", "/plain/y")), "top fallback\n");
    assert_eq!(
        ready(&app, "POST", "/api/items").status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[test]
fn any_method() {
    let app = Router::new()
        .route("/a", any(|m: Method| m.to_string()))
        .route("/b", get(|| "get").any(|| "other"));
    assert_eq!(text(&ready(&app, "PURGE", "/a")), "PURGE");
    assert_eq!(text(&ready(&app, "GET", "/a")), "GET");
    assert_eq!(text(&ready(&app, "GET", "/b")), "get");
    assert_eq!(text(&ready(&app, "HEAD", "/b")), "get");
    assert_eq!(text(&ready(&app, "DELETE", "/b")), "other");
}

#[test]
fn json_depth_is_checked_before_parsing() {
    use super::extract::check_json_depth;
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(check_json_depth(nested(64).as_bytes(), 64).is_ok());
    let e = check_json_depth(nested(65).as_bytes(), 64).unwrap_err();
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    assert!(e.message().contains("nested deeper than 64 levels"), "{e}");
    // Objects count as arrays do; closing brackets give levels back.
    let wide = format!("{{\"a\":{},\"b\":{}}}", nested(63), nested(63));
    assert!(check_json_depth(wide.as_bytes(), 64).is_ok());
    assert!(check_json_depth(br#"{"a":{"b":{"c":1}}}"#, 2).is_err());
    // Brackets inside strings, escaped quotes and escaped backslashes do not count.
    let quoted = format!(r#"["{}", "\"[[[", "\\", "x"]"#, "[".repeat(200));
    assert!(check_json_depth(quoted.as_bytes(), 1).is_ok());
    assert!(check_json_depth(br#"["\\", [[1]]]"#, 2).is_err());
    // Malformed input is left for the parser: an unterminated string ends the scan.
    assert!(check_json_depth(br#"["[[[[[[[[[["#, 1).is_ok());
    assert!(check_json_depth(b"\\", 0).is_ok());
}

#[test]
fn limits_survive_merging_routes() {
    let strict = RouteLimits {
        max_target: Some(8),
        ..RouteLimits::default()
    };
    let app = Router::new()
        .route("/x", get(|| "get"))
        .route("/x", post(|| "post").limits(strict));
    assert_eq!(
        ready(&app, "GET", "/x?long-query").status(),
        StatusCode::URI_TOO_LONG
    );
    assert_eq!(text(&ready(&app, "GET", "/x")), "get");
}

#[test]
fn static_paths_shared_lengths_and_long_paths() {
    // Six static paths of one length (more than are compared in turn), paths of 63, 64 and 100
    // bytes (either side of the by-length table's end), and a parameterized route they shadow.
    let long = |n: usize| format!("/{}", "x".repeat(n - 1));
    let mut app = Router::new().route("/{p}", get(|Path(p): Path<String>| format!("param {p}")));
    for name in ["/aa", "/bb", "/cc", "/dd", "/ee", "/ff"] {
        app = app.route(name, get(move || name));
    }
    for n in [63, 64, 100] {
        let path = long(n);
        app = app.route(&path, get(move || format!("long {n}")));
    }
    for name in ["/aa", "/bb", "/cc", "/dd", "/ee", "/ff"] {
        assert_eq!(text(&ready(&app, "GET", name)), name);
    }
    assert_eq!(text(&ready(&app, "GET", "/gg")), "param gg");
    for n in [63, 64, 100] {
        assert_eq!(text(&ready(&app, "GET", &long(n))), format!("long {n}"));
        // Same length, other bytes: not the static route.
        let other = format!("/y{}", "x".repeat(n - 2));
        assert_eq!(
            text(&ready(&app, "GET", &other)),
            format!("param {}", &other[1..])
        );
    }
}
