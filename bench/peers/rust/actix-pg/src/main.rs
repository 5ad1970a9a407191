//! actix-web 4 + tokio-postgres peer for the TechEmpower database tests, one worker.
//! `peer-actix-pg PORT DB_URL [CONNECTIONS]`
//!
//! The worker opens its connections on its own thread (`data_factory`), prepares the statements
//! once per connection and pipelines a request's queries on one connection (`try_join_all`), as
//! the TFB actix entries do. Answers match canter's `--app techempower` byte for byte in shape.
use std::cell::Cell;
use std::fmt::Write;

use actix_web::http::header::{HeaderValue, CONTENT_TYPE, SERVER};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures_util::future::try_join_all;
use serde::Serialize;
use tokio_postgres::{Client, NoTls, Statement};

#[derive(Serialize, Clone, Copy)]
struct World {
    id: i32,
    #[serde(rename = "randomNumber")]
    random_number: i32,
}

struct Conn {
    client: Client,
    world: Statement,
    fortunes: Statement,
    update: Statement,
}

struct Db {
    conns: Vec<Conn>,
    next: Cell<usize>,
    rng: Cell<u64>,
}

impl Db {
    async fn connect(url: String, n: usize) -> Db {
        let mut conns = Vec::new();
        for _ in 0..n {
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
            actix_web::rt::spawn(async move {
                let _ = connection.await;
            });
            let world = client
                .prepare("SELECT id, randomnumber FROM world WHERE id = $1")
                .await
                .expect("prepare");
            let fortunes = client.prepare("SELECT id, message FROM fortune").await.expect("prepare");
            let update = client
                .prepare(
                    "UPDATE world SET randomnumber = w.r \
                     FROM (SELECT unnest($1::int[]) AS id, unnest($2::int[]) AS r) AS w \
                     WHERE world.id = w.id",
                )
                .await
                .expect("prepare");
            conns.push(Conn { client, world, fortunes, update });
        }
        Db { conns, next: Cell::new(0), rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64) }
    }

    fn conn(&self) -> &Conn {
        let i = self.next.get();
        self.next.set((i + 1) % self.conns.len());
        &self.conns[i]
    }

    fn random_id(&self) -> i32 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 10_000) as i32 + 1
    }

    async fn worlds(&self, ids: &[i32]) -> Result<Vec<World>, tokio_postgres::Error> {
        let c = self.conn();
        let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 1]> =
            ids.iter().map(|id| [id as _]).collect();
        let rows = try_join_all(params.iter().map(|p| c.client.query_one(&c.world, p))).await?;
        Ok(rows.iter().map(|r| World { id: r.get(0), random_number: r.get(1) }).collect())
    }
}

fn count(req: &HttpRequest) -> usize {
    let n = req
        .query_string()
        .split('&')
        .find_map(|p| p.strip_prefix("queries="))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(1);
    n.clamp(1, 500) as usize
}

fn respond(body: Vec<u8>, content_type: &'static str) -> HttpResponse {
    let mut r = HttpResponse::Ok().body(body);
    r.headers_mut().insert(SERVER, HeaderValue::from_static("actix"));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn error(e: tokio_postgres::Error) -> HttpResponse {
    eprintln!("database error: {e}");
    HttpResponse::InternalServerError().finish()
}

async fn db(db: web::Data<Db>) -> HttpResponse {
    match db.worlds(&[db.random_id()]).await {
        Ok(w) => respond(serde_json::to_vec(&w[0]).unwrap(), "application/json"),
        Err(e) => error(e),
    }
}

async fn queries(db: web::Data<Db>, req: HttpRequest) -> HttpResponse {
    let ids: Vec<i32> = (0..count(&req)).map(|_| db.random_id()).collect();
    match db.worlds(&ids).await {
        Ok(w) => respond(serde_json::to_vec(&w).unwrap(), "application/json"),
        Err(e) => error(e),
    }
}

async fn updates(db: web::Data<Db>, req: HttpRequest) -> HttpResponse {
    let n = count(&req);
    let mut ids: Vec<i32> = Vec::with_capacity(n);
    while ids.len() < n {
        let id = db.random_id();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let mut worlds = match db.worlds(&ids).await {
        Ok(w) => w,
        Err(e) => return error(e),
    };
    let mut numbers = Vec::with_capacity(n);
    for w in &mut worlds {
        let mut r = db.random_id();
        if r == w.random_number {
            r = r % 10_000 + 1;
        }
        w.random_number = r;
        numbers.push(r);
    }
    let c = db.conn();
    match c.client.execute(&c.update, &[&ids, &numbers]).await {
        Ok(_) => respond(serde_json::to_vec(&worlds).unwrap(), "application/json"),
        Err(e) => error(e),
    }
}

fn escape(out: &mut String, s: &str) {
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

async fn fortunes(db: web::Data<Db>) -> HttpResponse {
    let c = db.conn();
    let rows = match c.client.query(&c.fortunes, &[]).await {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let mut list: Vec<(i32, &str)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    list.push((0, "Additional fortune added at request time."));
    list.sort_unstable_by(|a, b| a.1.cmp(b.1));
    let mut html = String::with_capacity(2048);
    html.push_str("<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table><tr><th>id</th><th>message</th></tr>");
    for (id, message) in list {
        let _ = write!(html, "<tr><td>{id}</td><td>");
        escape(&mut html, message);
        html.push_str("</td></tr>");
    }
    html.push_str("</table></body></html>");
    respond(html.into_bytes(), "text/html; charset=utf-8")
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().unwrap_or_else(|| "8080".into()).parse().expect("port");
    let url = args.next().expect("usage: peer-actix-pg PORT DB_URL [CONNECTIONS]");
    let n: usize = args.next().map(|s| s.parse().expect("connections")).unwrap_or(2);
    actix_web::rt::System::new().block_on(async move {
        eprintln!("actix-pg listening on 127.0.0.1:{port}");
        HttpServer::new(move || {
            let url = url.clone();
            App::new()
                .data_factory(move || {
                    let url = url.clone();
                    async move { Ok::<_, ()>(Db::connect(url, n).await) }
                })
                .route("/db", web::get().to(db))
                .route("/queries", web::get().to(queries))
                .route("/updates", web::get().to(updates))
                .route("/fortunes", web::get().to(fortunes))
        })
        .workers(1)
        .backlog(4096)
        .max_connection_rate(4096)
        .bind(("127.0.0.1", port))?
        .run()
        .await
    })
}
