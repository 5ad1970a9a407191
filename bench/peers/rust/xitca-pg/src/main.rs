//! xitca-web + xitca-postgres peer for the TechEmpower database tests, one worker.
//! `peer-xitca-pg PORT DB_URL [CONNECTIONS]`
//!
//! The worker opens its connections on its own thread (`with_async_state`), prepares the
//! statements once per connection and sends all of a request's queries before reading the first
//! answer (xitca-postgres queues each query as it is bound), as the TFB xitca entries do.
use std::cell::Cell;
use std::fmt::Write;
use std::future::IntoFuture;

use serde::Serialize;
use xitca_postgres::iter::AsyncLendingIterator;
use xitca_postgres::types::Type;
use xitca_postgres::{Client, Execute, Postgres, Statement};
use xitca_web::body::ResponseBody;
use xitca_web::handler::{handler_service, state::StateRef, uri::UriRef};
use xitca_web::http::header::{HeaderValue, CONTENT_TYPE, SERVER};
use xitca_web::http::{StatusCode, WebResponse};
use xitca_web::route::get;
use xitca_web::App;

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

type Error = xitca_postgres::Error;

impl Db {
    async fn connect(url: String, n: usize) -> Result<Db, Error> {
        let mut conns = Vec::new();
        for _ in 0..n {
            let (client, driver) = Postgres::new(url.clone()).connect().await?;
            tokio::task::spawn_local(driver.into_future());
            let world = Statement::named("SELECT id, randomnumber FROM world WHERE id = $1", &[Type::INT4])
                .execute(&client)
                .await?
                .leak();
            let fortunes = Statement::named("SELECT id, message FROM fortune", &[]).execute(&client).await?.leak();
            let update = Statement::named(
                "UPDATE world SET randomnumber = w.r \
                 FROM (SELECT unnest($1::int[]) AS id, unnest($2::int[]) AS r) AS w \
                 WHERE world.id = w.id",
                &[Type::INT4_ARRAY, Type::INT4_ARRAY],
            )
            .execute(&client)
            .await?
            .leak();
            conns.push(Conn { client, world, fortunes, update });
        }
        Ok(Db { conns, next: Cell::new(0), rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64) })
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

    async fn worlds(&self, ids: &[i32]) -> Result<Vec<World>, String> {
        let c = self.conn();
        let mut streams = Vec::with_capacity(ids.len());
        for id in ids {
            streams.push(c.world.bind([*id]).query(&c.client).await.map_err(|e| e.to_string())?);
        }
        let mut out = Vec::with_capacity(ids.len());
        for mut s in streams {
            match s.try_next().await.map_err(|e| e.to_string())? {
                Some(row) => out.push(World { id: row.get(0), random_number: row.get(1) }),
                None => return Err("no row".into()),
            }
        }
        Ok(out)
    }
}

fn count(uri: &xitca_web::http::Uri) -> usize {
    let n = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("queries="))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(1);
    n.clamp(1, 500) as usize
}

fn respond(body: Vec<u8>, content_type: &'static str) -> WebResponse {
    let mut r = WebResponse::new(ResponseBody::from(body));
    r.headers_mut().insert(SERVER, HeaderValue::from_static("xitca"));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn error(e: impl std::fmt::Display) -> WebResponse {
    eprintln!("database error: {e}");
    let mut r = WebResponse::new(ResponseBody::from("database error"));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

async fn db(StateRef(db): StateRef<'_, Db>) -> WebResponse {
    match db.worlds(&[db.random_id()]).await {
        Ok(w) => respond(serde_json::to_vec(&w[0]).unwrap(), "application/json"),
        Err(e) => error(e),
    }
}

async fn queries(StateRef(db): StateRef<'_, Db>, UriRef(uri): UriRef<'_>) -> WebResponse {
    let ids: Vec<i32> = (0..count(uri)).map(|_| db.random_id()).collect();
    match db.worlds(&ids).await {
        Ok(w) => respond(serde_json::to_vec(&w).unwrap(), "application/json"),
        Err(e) => error(e),
    }
}

async fn updates(StateRef(db): StateRef<'_, Db>, UriRef(uri): UriRef<'_>) -> WebResponse {
    let n = count(uri);
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
    match c.update.bind_dyn(&[&ids, &numbers]).execute(&c.client).await {
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

async fn fortunes(StateRef(db): StateRef<'_, Db>) -> WebResponse {
    let c = db.conn();
    let mut stream = match c.fortunes.query(&c.client).await {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let mut list: Vec<(i32, String)> = Vec::with_capacity(16);
    loop {
        match stream.try_next().await {
            Ok(Some(row)) => list.push((row.get(0), row.get::<String>(1))),
            Ok(None) => break,
            Err(e) => return error(e),
        }
    }
    list.push((0, "Additional fortune added at request time.".to_owned()));
    list.sort_unstable_by(|a, b| a.1.cmp(&b.1));
    let mut html = String::with_capacity(2048);
    html.push_str("<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table><tr><th>id</th><th>message</th></tr>");
    for (id, message) in &list {
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
    let url = args.next().expect("usage: peer-xitca-pg PORT DB_URL [CONNECTIONS]");
    let n: usize = args.next().map(|s| s.parse().expect("connections")).unwrap_or(2);
    eprintln!("xitca-pg listening on 127.0.0.1:{port}");
    App::new()
        .with_async_state(move || Db::connect(url.clone(), n))
        .at("/db", get(handler_service(db)))
        .at("/queries", get(handler_service(queries)))
        .at("/updates", get(handler_service(updates)))
        .at("/fortunes", get(handler_service(fortunes)))
        .serve()
        .worker_threads(1)
        .backlog(4096)
        .bind(("127.0.0.1", port))?
        .run()
        .wait()
}
