//! Cookies: [`Cookies`] reads the request's `Cookie` fields and, returned with a response as
//! `(cookies, body)`, writes the cookies added or removed as `Set-Cookie` fields.
//!
//! Cookies are parsed and built with the [`cookie`] crate (re-exported as `canter::cookie`).

use std::fmt;

use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::Response;
use cookie::{Cookie, CookieJar};

use super::extract::{FromParts, Parts, Rejection};
use super::response::IntoResponse;

/// The request's cookies, and the changes to send back.
///
/// As an extractor it reads every `Cookie` field of the request (never a rejection): pairs
/// are split on `;`, and a malformed pair (no `=`, an empty name, bytes that are not UTF-8) is
/// skipped, as browsers and other servers do, instead of failing the request. When a name
/// appears twice, the first pair wins (user agents send the most specific cookie first).
/// Values are returned as sent: no percent-decoding, quotes kept.
///
/// [`Cookies::set`] and [`Cookies::remove`] record changes; return the jar with a response,
/// `(cookies, body)`, to send each change as a `Set-Cookie` field (in name order). A cookie
/// whose name is not a token, whose value has characters outside RFC 6265's cookie-octets
/// (space, `"`, `,`, `;`, `\`, controls, non-ASCII; a value may be wrapped in one pair of
/// quotes), or whose Path or Domain holds `;` or a control character is a programming error:
/// the response becomes a 500 instead of a corrupt header. Encode such values yourself (for
/// example base64url).
///
/// ```
/// use canter::cookie::Cookie;
/// use canter::{get, Cookies, Router};
///
/// fn visit(cookies: Cookies) -> (Cookies, String) {
///     let n: u32 = cookies.get("visits").and_then(|v| v.parse().ok()).unwrap_or(0) + 1;
///     let cookie = Cookie::build(("visits", n.to_string())).path("/").http_only(true);
///     (cookies.set(cookie), format!("visit number {n}\n"))
/// }
/// let app = Router::new().route("/", get(visit));
/// # let _ = app;
/// ```
#[derive(Clone, Default)]
pub struct Cookies {
    jar: CookieJar,
}

impl Cookies {
    /// An empty jar, for a response that sets cookies without reading any.
    ///
    /// ```
    /// use canter::cookie::Cookie;
    /// use canter::{Cookies, IntoResponse};
    ///
    /// let r = (Cookies::new().set(Cookie::new("theme", "dark")), "ok\n").into_response();
    /// assert_eq!(r.headers()[0].1, "theme=dark");
    /// ```
    pub fn new() -> Cookies {
        Cookies::default()
    }

    /// The value of cookie `name`: the one set last, else the one the request sent; `None`
    /// if there is none or it was removed.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.jar.get(name).map(Cookie::value)
    }

    /// Every cookie as `(name, value)`: the request's, with the changes applied.
    ///
    /// ```
    /// use canter::Cookies;
    ///
    /// fn list(cookies: Cookies) -> String {
    ///     cookies.iter().map(|(n, v)| format!("{n}={v}\n")).collect()
    /// }
    /// # let _ = list;
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.jar.iter().map(|c| (c.name(), c.value()))
    }

    /// Sets (adds or replaces) a cookie, sent as a `Set-Cookie` field.
    pub fn set(mut self, cookie: impl Into<Cookie<'static>>) -> Cookies {
        self.jar.add(cookie);
        self
    }

    /// Removes a cookie the request sent: the client is told to drop it (empty value,
    /// `Max-Age=0` and an expiry date in the past). Give the same Path and Domain it was set
    /// with, or the client keeps it. A cookie set in this jar is simply forgotten.
    ///
    /// ```
    /// use canter::cookie::Cookie;
    /// use canter::Cookies;
    ///
    /// fn logout(cookies: Cookies) -> (Cookies, &'static str) {
    ///     (cookies.remove(Cookie::build("session").path("/")), "bye\n")
    /// }
    /// # let _ = logout;
    /// ```
    pub fn remove(mut self, cookie: impl Into<Cookie<'static>>) -> Cookies {
        self.jar.remove(cookie);
        self
    }

    /// Parses one `Cookie` field value into the jar, skipping malformed pairs.
    fn read_field(&mut self, value: &[u8]) {
        for pair in value.split(|&b| b == b';') {
            let Ok(pair) = std::str::from_utf8(pair) else {
                continue;
            };
            let pair = pair.trim_matches([' ', '\t']);
            if pair.is_empty() {
                continue;
            }
            // A pair alone (no `;`) parses as a name and a value, without attributes.
            let Ok(cookie) = Cookie::parse(pair.to_owned()) else {
                continue;
            };
            if self.jar.get(cookie.name()).is_none() {
                self.jar.add_original(cookie);
            }
        }
    }
}

impl fmt::Debug for Cookies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: values are often secrets.
        f.debug_list()
            .entries(self.jar.iter().map(Cookie::name))
            .finish()
    }
}

impl FromParts for Cookies {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        let mut cookies = Cookies::new();
        for (name, value) in parts.head().headers() {
            if name.eq_ignore_ascii_case("cookie") {
                cookies.read_field(value);
            }
        }
        Ok(cookies)
    }
}

impl<T: IntoResponse> IntoResponse for (Cookies, T) {
    /// `T`'s response with one `Set-Cookie` field per change, or 500 if a cookie cannot be
    /// written as a valid field.
    fn into_response(self) -> Response {
        let mut response = self.1.into_response();
        let mut changes: Vec<&Cookie<'static>> = self.0.jar.delta().collect();
        changes.sort_by(|a, b| a.name().cmp(b.name()));
        for cookie in changes {
            match set_cookie(cookie) {
                Ok(value) => response = response.with_header(header::SET_COOKIE, value),
                Err(e) => return e.into_response(),
            }
        }
        response
    }
}

/// The `Set-Cookie` value for `cookie`, if it is a valid one (RFC 6265 section 4.1.1).
fn set_cookie(cookie: &Cookie<'_>) -> Result<HeaderValue, Rejection> {
    let name = cookie.name();
    let invalid = |what: &str| {
        Rejection::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "cannot set cookie `{}`: invalid {what}",
                name.escape_debug()
            ),
        )
    };
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(invalid("name"));
    }
    let value = cookie.value();
    let bare = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    if !bare.bytes().all(is_cookie_octet) {
        return Err(invalid("value"));
    }
    // `av-octet`: ASCII but controls and `;`.
    let attribute_ok = |v: Option<&str>| {
        v.is_none_or(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b';'))
    };
    if !attribute_ok(cookie.path()) {
        return Err(invalid("Path"));
    }
    if !attribute_ok(cookie.domain()) {
        return Err(invalid("Domain"));
    }
    HeaderValue::from_str(&cookie.to_string()).map_err(|_| invalid("attribute"))
}

/// `tchar` of RFC 9110: the characters of a token.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `cookie-octet` of RFC 6265: visible ASCII but `"`, `,`, `;` and `\`.
fn is_cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(fields: &[&[u8]]) -> Cookies {
        let mut c = Cookies::new();
        for f in fields {
            c.read_field(f);
        }
        c
    }

    #[test]
    fn malformed_pairs_are_skipped() {
        let c = parse(&[
            b"a=1; novalue; =anon; ;; b = 2 ;c=x=y",
            b"d=\"q\"; e=\xff; \xfe=1; f=",
        ]);
        let mut all: Vec<_> = c.iter().collect();
        all.sort();
        // `e` and the pair after it are not UTF-8; `b`'s spaces around `=` are trimmed.
        assert_eq!(
            all,
            [
                ("a", "1"),
                ("b", "2"),
                ("c", "x=y"),
                ("d", "\"q\""),
                ("f", "")
            ]
        );
    }

    #[test]
    fn first_pair_of_a_name_wins() {
        let c = parse(&[b"id=first; id=second", b"id=third"]);
        assert_eq!(c.get("id"), Some("first"));
    }

    #[test]
    fn set_cookie_fields_are_validated() {
        let ok = Cookie::build(("s", "a-b_c.1")).path("/app").http_only(true);
        assert_eq!(
            set_cookie(&ok.into()).unwrap(),
            "s=a-b_c.1; HttpOnly; Path=/app"
        );
        assert!(set_cookie(&Cookie::new("q", "\"quoted\"")).is_ok());
        for bad in [
            Cookie::new("a b", "1"),
            Cookie::new("", "1"),
            Cookie::new("a", "x y"),
            Cookie::new("a", "x;y"),
            Cookie::new("a", "x,y"),
            Cookie::new("a", "\"x"),
            Cookie::new("a", "é"),
            Cookie::build(("a", "1")).path("/;x").into(),
            Cookie::build(("a", "1")).domain("ex\nample.com").into(),
        ] {
            let e = set_cookie(&bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR, "{bad}");
        }
    }

    #[test]
    fn changes_become_set_cookie_fields_in_name_order() {
        let jar = parse(&[b"old=1; keep=2"])
            .set(Cookie::new("z", "1"))
            .set(Cookie::new("a", "2"))
            .remove(Cookie::from("old"));
        assert_eq!(jar.get("old"), None);
        assert_eq!(jar.get("keep"), Some("2"));
        let r = (jar, "ok").into_response();
        let set: Vec<_> = r
            .headers()
            .iter()
            .filter(|(n, _)| n == header::SET_COOKIE)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(set.len(), 3, "{set:?}");
        assert_eq!(set[0], "a=2");
        assert!(set[1].starts_with("old=; Max-Age=0; Expires="), "{set:?}");
        assert_eq!(set[2], "z=1");
        let bad = (Cookies::new().set(Cookie::new("a", "x y")), "ok").into_response();
        assert_eq!(bad.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(bad.headers().iter().all(|(n, _)| n != header::SET_COOKIE));
    }
}
