//! may_minihttp peer: the crate's canonical techempower_no_db example, one worker.
//! `peer-may-minihttp PORT`
use std::io;

use may_minihttp::{HttpService, HttpServiceFactory, Request, Response};
use yarte::Serialize;

#[derive(Serialize)]
struct HelloMessage {
    message: &'static str,
}

struct Techempower {}

impl HttpService for Techempower {
    fn call(&mut self, req: Request, rsp: &mut Response) -> io::Result<()> {
        // Bare-bones router (may_minihttp writes Server, Date and Content-Length).
        match req.path() {
            "/json" => {
                rsp.header("Content-Type: application/json");
                HelloMessage { message: "Hello, World!" }.to_bytes_mut(rsp.body_mut());
            }
            "/plaintext" => {
                rsp.header("Content-Type: text/plain").body("Hello, World!");
            }
            _ => {
                rsp.status_code(404, "Not Found");
            }
        }
        Ok(())
    }
}

struct HttpServer {}

impl HttpServiceFactory for HttpServer {
    type Service = Techempower;

    fn new_service(&self, _: usize) -> Self::Service {
        Techempower {}
    }
}

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PORT").ok())
        .unwrap_or_else(|| "8080".into())
        .parse()
        .expect("port");
    may::config().set_workers(1).set_pool_capacity(500).set_stack_size(0x1000);
    let server = HttpServer {}.start(("127.0.0.1", port)).unwrap();
    eprintln!("may-minihttp listening on 127.0.0.1:{port}");
    server.join().unwrap();
}
