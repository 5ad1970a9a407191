//! actix-web 4 peer, one worker. `peer-actix PORT`
use actix_web::http::header::{HeaderValue, CONTENT_TYPE, SERVER};
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Serialize;

#[derive(Serialize)]
struct Message {
    message: &'static str,
}

async fn plaintext() -> HttpResponse {
    let mut r = HttpResponse::Ok().body("Hello, World!");
    r.headers_mut().insert(SERVER, HeaderValue::from_static("actix"));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

async fn json() -> HttpResponse {
    let body = serde_json::to_vec(&Message { message: "Hello, World!" }).unwrap();
    let mut r = HttpResponse::Ok().body(body);
    r.headers_mut().insert(SERVER, HeaderValue::from_static("actix"));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PORT").ok())
        .unwrap_or_else(|| "8080".into())
        .parse()
        .expect("port");
    // actix adds Date and Content-Length itself.
    actix_web::rt::System::new().block_on(async move {
        eprintln!("actix listening on 127.0.0.1:{port}");
        HttpServer::new(|| {
            App::new()
                .route("/plaintext", web::get().to(plaintext))
                .route("/json", web::get().to(json))
        })
        .workers(1)
        .backlog(4096)
        .max_connection_rate(4096)
        .bind(("127.0.0.1", port))?
        .run()
        .await
    })
}
