//! may-minihttp + may_postgres peer for the TechEmpower database tests, one worker.
//! `peer-may-pg PORT DB_URL [CONNECTIONS]`
//!
//! Written like TFB's may-minihttp entry: every HTTP connection is a coroutine that takes one
//! of the worker's database connections round robin, prepares nothing itself (statements are
//! prepared once per database connection at start) and sends all of a request's queries before
//! reading the first answer (`query_raw` writes the query and returns the row stream). The SQL
//! and the answers are the same as the other peers' and canter's `--app techempower`.
use std::fmt::Write;
use std::io;
use std::sync::Mutex;

use may_minihttp::{HttpService, HttpServiceFactory, Request, Response};
use may_postgres::{Client, Statement};
use serde::Serialize;

#[derive(Serialize, Clone, Copy)]
struct World {
    id: i32,
    #[serde(rename = "randomNumber")]
    random_number: i32,
}

#[derive(Clone)]
struct Conn {
    client: Client,
    world: Statement,
    fortunes: Statement,
    update: Statement,
}

type Error = may_postgres::Error;

impl Conn {
    fn open(url: &str) -> Result<Conn, Error> {
        let client = may_postgres::connect(url)?;
        let world = client.prepare("SELECT id, randomnumber FROM world WHERE id = $1")?;
        let fortunes = client.prepare("SELECT id, message FROM fortune")?;
        let update = client.prepare(
            "UPDATE world SET randomnumber = w.r \
             FROM (SELECT unnest($1::int[]) AS id, unnest($2::int[]) AS r) AS w \
             WHERE world.id = w.id",
        )?;
        Ok(Conn { client, world, fortunes, update })
    }

    fn worlds(&self, ids: &[i32]) -> Result<Vec<World>, Error> {
        // every query is written before the first answer is read
        let mut streams = Vec::with_capacity(ids.len());
        for id in ids {
            streams.push(self.client.query_raw(&self.world, &[id])?);
        }
        let mut out = Vec::with_capacity(ids.len());
        for mut s in streams {
            if let Some(row) = s.next().transpose()? {
                out.push(World { id: row.get(0), random_number: row.get(1) });
            }
        }
        Ok(out)
    }
}

struct Service {
    db: Conn,
    rng: u64,
}

impl Service {
    fn random_id(&mut self) -> i32 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 10_000) as i32 + 1
    }

    fn updates(&mut self, n: usize) -> Result<Vec<World>, Error> {
        let mut ids: Vec<i32> = Vec::with_capacity(n);
        while ids.len() < n {
            let id = self.random_id();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        let mut worlds = self.db.worlds(&ids)?;
        let mut numbers = Vec::with_capacity(n);
        for w in &mut worlds {
            let mut r = self.random_id();
            if r == w.random_number {
                r = r % 10_000 + 1;
            }
            w.random_number = r;
            numbers.push(r);
        }
        self.db.client.execute(&self.db.update, &[&ids, &numbers])?;
        Ok(worlds)
    }

    fn fortunes(&self) -> Result<Vec<u8>, Error> {
        let mut list: Vec<(i32, String)> = Vec::with_capacity(16);
        for row in self.db.client.query_raw(&self.db.fortunes, &[])? {
            let row = row?;
            list.push((row.get(0), row.get(1)));
        }
        list.push((0, "Additional fortune added at request time.".to_owned()));
        list.sort_unstable_by(|a, b| a.1.cmp(&b.1));
        let mut html = String::with_capacity(2048);
        html.push_str(
            "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table><tr><th>id</th><th>message</th></tr>",
        );
        for (id, message) in &list {
            let _ = write!(html, "<tr><td>{id}</td><td>");
            escape(&mut html, message);
            html.push_str("</td></tr>");
        }
        html.push_str("</table></body></html>");
        Ok(html.into_bytes())
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

fn count(path: &str) -> usize {
    let n = path
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("queries="))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(1);
    n.clamp(1, 500) as usize
}

fn json<T: Serialize>(rsp: &mut Response, value: &T) {
    rsp.header("Content-Type: application/json");
    let body = serde_json::to_vec(value).unwrap_or_default();
    rsp.body_vec(body);
}

fn failed(rsp: &mut Response, e: Error) {
    eprintln!("database error: {e}");
    rsp.status_code(500, "Internal Server Error");
    rsp.body("database error");
}

impl HttpService for Service {
    fn call(&mut self, req: Request, rsp: &mut Response) -> io::Result<()> {
        let path = req.path();
        if path == "/db" {
            let id = self.random_id();
            match self.db.worlds(&[id]) {
                Ok(w) => json(rsp, &w[0]),
                Err(e) => failed(rsp, e),
            }
        } else if path.starts_with("/queries") {
            let ids: Vec<i32> = (0..count(path)).map(|_| self.random_id()).collect();
            match self.db.worlds(&ids) {
                Ok(w) => json(rsp, &w),
                Err(e) => failed(rsp, e),
            }
        } else if path.starts_with("/updates") {
            match self.updates(count(path)) {
                Ok(w) => json(rsp, &w),
                Err(e) => failed(rsp, e),
            }
        } else if path == "/fortunes" {
            match self.fortunes() {
                Ok(html) => {
                    rsp.header("Content-Type: text/html; charset=utf-8");
                    rsp.body_vec(html);
                }
                Err(e) => failed(rsp, e),
            }
        } else if path == "/plaintext" {
            rsp.header("Content-Type: text/plain").body("Hello, World!");
        } else {
            rsp.status_code(404, "Not Found");
        }
        Ok(())
    }
}

/// The worker's database connections. A `Client` is `Send` but not `Sync`: each HTTP
/// connection gets a clone (its own reply channel on the same database connection).
struct Server {
    conns: Mutex<(Vec<Conn>, usize)>,
}

impl HttpServiceFactory for Server {
    type Service = Service;

    fn new_service(&self, id: usize) -> Service {
        let mut guard = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let (conns, next) = &mut *guard;
        *next += 1;
        let db = conns[*next % conns.len()].clone();
        let seed = (*next as u64) << 40 ^ (id as u64) << 20 ^ std::process::id() as u64;
        let rng = 0x9e37_79b9_7f4a_7c15 ^ seed;
        Service { db, rng: rng | 1 }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().unwrap_or_else(|| "8080".into()).parse().expect("port");
    let url = args.next().expect("usage: peer-may-pg PORT DB_URL [CONNECTIONS]");
    let n: usize = args.next().map(|s| s.parse().expect("connections")).unwrap_or(2);
    may::config().set_workers(1).set_pool_capacity(1000).set_stack_size(0x4000);
    let conns = (0..n).map(|_| Conn::open(&url).expect("database connection")).collect();
    let server = Server { conns: Mutex::new((conns, 0)) }.start(("127.0.0.1", port)).expect("listen");
    eprintln!("may-pg listening on 127.0.0.1:{port}");
    let _ = server.join();
}
