//! The server against Python's http.client (tests/py/client.py); fails without python3.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::{run_py_checks, Server};

#[test]
fn python_http_client() {
    let server = Server::start();
    run_py_checks(
        "client.py",
        server.port,
        &[
            "ok keep-alive 50 requests on one connection",
            "ok POST /echo",
            "ok chunked upload",
            "ok HEAD",
            "ok 404 and 405",
            "ok response headers",
            "ALL OK",
        ],
        || format!("\nserver log:\n{}", server.log()),
    );
}
