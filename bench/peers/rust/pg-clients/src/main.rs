//! The PostgreSQL client crates side by side, without HTTP: on one current-thread tokio runtime
//! (as a canter worker), CONCURRENCY tasks each run batches of BATCH pipelined
//! `SELECT id, randomnumber FROM world WHERE id = $1` over CONNECTIONS connections, for SECONDS.
//! Prints queries/s and this process's CPU (user + system) per query.
//!
//!     pg-clients tokio-postgres|xitca-postgres URL [CONCURRENCY] [BATCH] [CONNECTIONS] [SECONDS]
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;

const SQL: &str = "SELECT id, randomnumber FROM world WHERE id = $1";

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

struct Rng(Cell<u64>);

impl Rng {
    fn id(&self) -> i32 {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 10_000) as i32 + 1
    }
}

async fn tokio_postgres_run(url: &str, conc: usize, batch: usize, conns: usize, secs: u64) -> u64 {
    let mut clients = Vec::new();
    for _ in 0..conns {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::task::spawn_local(connection);
        let stmt = client.prepare(SQL).await.expect("prepare");
        clients.push((client, stmt));
    }
    let clients = Rc::new(clients);
    let done = Rc::new(Cell::new(0u64));
    let rng = Rc::new(Rng(Cell::new(0x9e37_79b9_7f4a_7c15)));
    let end = Instant::now() + Duration::from_secs(secs);
    let next = Rc::new(Cell::new(0usize));
    let tasks: Vec<_> = (0..conc)
        .map(|_| {
            let (clients, done, rng, next) = (clients.clone(), done.clone(), rng.clone(), next.clone());
            tokio::task::spawn_local(async move {
                while Instant::now() < end {
                    let i = next.get();
                    next.set((i + 1) % clients.len());
                    let (client, stmt) = &clients[i];
                    let ids: Vec<i32> = (0..batch).map(|_| rng.id()).collect();
                    let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 1]> =
                        ids.iter().map(|id| [id as _]).collect();
                    let rows = try_join_all(params.iter().map(|p| client.query_one(stmt, p))).await.expect("query");
                    let sum: i64 = rows.iter().map(|r| r.get::<_, i32>(1) as i64).sum();
                    std::hint::black_box(sum);
                    done.set(done.get() + batch as u64);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    done.get()
}

async fn xitca_postgres_run(url: &str, conc: usize, batch: usize, conns: usize, secs: u64) -> u64 {
    use std::future::IntoFuture;
    use xitca_postgres::iter::AsyncLendingIterator;
    use xitca_postgres::types::Type;
    use xitca_postgres::{Execute, Postgres, Statement};
    let mut clients = Vec::new();
    for _ in 0..conns {
        let (client, driver) = Postgres::new(url.to_owned()).connect().await.expect("connect");
        tokio::task::spawn_local(driver.into_future());
        let stmt = Statement::named(SQL, &[Type::INT4]).execute(&client).await.expect("prepare").leak();
        clients.push((client, stmt));
    }
    let clients = Rc::new(clients);
    let done = Rc::new(Cell::new(0u64));
    let rng = Rc::new(Rng(Cell::new(0x9e37_79b9_7f4a_7c15)));
    let end = Instant::now() + Duration::from_secs(secs);
    let next = Rc::new(Cell::new(0usize));
    let tasks: Vec<_> = (0..conc)
        .map(|_| {
            let (clients, done, rng, next) = (clients.clone(), done.clone(), rng.clone(), next.clone());
            tokio::task::spawn_local(async move {
                while Instant::now() < end {
                    let i = next.get();
                    next.set((i + 1) % clients.len());
                    let (client, stmt) = &clients[i];
                    // Every query is sent (queued to the driver) before the first answer is read.
                    let mut streams = Vec::with_capacity(batch);
                    for _ in 0..batch {
                        streams.push(stmt.bind([rng.id()]).query(client).await.expect("query"));
                    }
                    let mut sum = 0i64;
                    for mut s in streams {
                        let row = s.try_next().await.expect("row").expect("one row");
                        sum += row.get::<i32>(1) as i64;
                    }
                    std::hint::black_box(sum);
                    done.set(done.get() + batch as u64);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    done.get()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "pg-clients tokio-postgres|xitca-postgres URL [CONCURRENCY] [BATCH] [CONNECTIONS] [SECONDS]";
    let which = args.first().expect(usage).clone();
    let url = args.get(1).expect(usage).clone();
    let num = |i: usize, d: usize| args.get(i).map(|s| s.parse().expect(usage)).unwrap_or(d);
    let (conc, batch, conns, secs) = (num(2, 64), num(3, 20), num(4, 2), num(5, 5) as u64);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let local = tokio::task::LocalSet::new();
    let (queries, cpu, wall) = local.block_on(&rt, async {
        // Warm-up (connections, statements, caches), then the measured run.
        let _ = match which.as_str() {
            "tokio-postgres" => tokio_postgres_run(&url, conc, batch, conns, 1).await,
            "xitca-postgres" => xitca_postgres_run(&url, conc, batch, conns, 1).await,
            _ => panic!("{usage}"),
        };
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let q = match which.as_str() {
            "tokio-postgres" => tokio_postgres_run(&url, conc, batch, conns, secs).await,
            _ => xitca_postgres_run(&url, conc, batch, conns, secs).await,
        };
        (q, cpu_seconds() - c0, t0.elapsed().as_secs_f64())
    });
    println!(
        "{which} concurrency={conc} batch={batch} connections={conns}: {:.0} queries/s, {:.2} us CPU/query",
        queries as f64 / wall,
        cpu * 1e6 / queries as f64
    );
}
