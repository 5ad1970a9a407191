//! `canter::db`, the worker's own PostgreSQL client, against a real PostgreSQL (Debian's
//! package, started by the test): logins with md5 and SCRAM-SHA-256 passwords and a wrong one,
//! a Unix socket, values and NULLs converted to Rust types (and the errors when they do not),
//! affected-row counts, a query error that leaves the connection usable, and many queries
//! pipelined on one connection coming back in order.

#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use canter::db::{Db, DbConfig, DbError};
use common::Postgres;

/// Runs `f` as a worker would: a current-thread runtime with local tasks.
fn on_worker<F: Future>(f: impl FnOnce() -> F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move { f().await })
}

/// Waits until every connection of `db` is open (at most 10 s).
async fn opened(db: &Db, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.open_connections() < n {
        assert!(Instant::now() < deadline, "{db:?} did not open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Squares 1..=`n` through `square`, each in a task of its own (so that all are queued before
/// any is answered), and checks every answer.
async fn square_each_in_a_task<F, Fut>(n: i32, square: F)
where
    F: Fn(i32) -> Fut,
    Fut: Future<Output = canter::db::Row> + 'static,
{
    let tasks: Vec<_> = (1..=n)
        .map(|v| {
            let answer = square(v);
            tokio::task::spawn_local(async move { (v, answer.await.get::<i32>(0)) })
        })
        .collect();
    for task in tasks {
        let (v, sq) = task.await.unwrap();
        assert_eq!(sq, v * v);
    }
}

#[test]
fn passwords_md5_and_scram_log_in_and_a_wrong_one_does_not() {
    let pg = Postgres::start();
    pg.psql("SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN PASSWORD 'md5-secret'");
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE scramuser LOGIN PASSWORD 'scram-secret'",
    );
    pg.require_password("md5user", "md5");
    pg.require_password("scramuser", "scram-sha-256");
    for (user, password) in [("md5user", "md5-secret"), ("scramuser", "scram-secret")] {
        let url = format!(
            "postgres://{user}:{password}@127.0.0.1:{}/postgres",
            pg.port
        );
        let mut config = DbConfig::new(&url).unwrap().connections(1);
        let who = config.prepare("SELECT current_user::text");
        let config = Arc::new(config);
        let name: String = on_worker(|| async move {
            let db = Db::start(config);
            opened(&db, 1).await;
            let row = db.query_one(who, &[]).await.unwrap();
            row.get::<&str>(0).to_owned()
        });
        assert_eq!(name, user);
    }
    // A wrong password: the connection never opens, and queries fail at once with 503.
    let url = format!("postgres://scramuser:wrong@127.0.0.1:{}/postgres", pg.port);
    let mut config = DbConfig::new(&url).unwrap().connections(1);
    let one = config.prepare("SELECT 1");
    let config = Arc::new(config);
    let (open, error) = on_worker(|| async move {
        let db = Db::start(config);
        tokio::time::sleep(Duration::from_millis(500)).await;
        (db.open_connections(), db.query(one, &[]).await.unwrap_err())
    });
    assert_eq!(open, 0);
    assert!(matches!(error, DbError::Unavailable), "{error:?}");
    assert_eq!(error.status(), 503);
}

#[test]
fn values_nulls_and_conversions_over_a_unix_socket() {
    let pg = Postgres::start();
    pg.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2), (3)");
    let url = format!(
        "host={} port={} user=canter dbname=postgres",
        pg.socket_dir().display(),
        pg.port
    );
    let mut config = DbConfig::new(&url).unwrap().connections(1);
    let values =
        config.prepare("SELECT $1::int8 + 1, NULL::text, 'héllo'::text, 2.5::float8, true");
    let bump = config.prepare("UPDATE t SET x = x + 1");
    let none = config.prepare("SELECT x FROM t WHERE x < 0");
    let divide = config.prepare("SELECT 10 / $1::int");
    let config = Arc::new(config);
    on_worker(|| async move {
        let db = Db::start(config);
        opened(&db, 1).await;

        let row = db.query_one(values, &[&41_i64]).await.unwrap();
        assert_eq!(row.len(), 5);
        assert_eq!(row.get::<i64>(0), 42);
        assert_eq!(row.get::<Option<&str>>(1), None);
        assert_eq!(row.get::<&str>(2), "héllo");
        assert_eq!(row.get::<f64>(3), 2.5);
        assert!(row.get::<bool>(4));
        // A NULL is not a &str, an int8 is not an i32, and there is no column 5.
        assert!(row.try_get::<&str>(1).is_err());
        let wrong_type = row.try_get::<i32>(0).unwrap_err();
        assert!(wrong_type.to_string().contains("int8"), "{wrong_type}");
        assert!(row.try_get::<i64>(5).is_err());

        // A parameter of the wrong type or number is refused before anything is sent.
        let e = db.query(values, &[&"41"]).await.unwrap_err();
        assert!(matches!(e, DbError::Query(_)), "{e:?}");
        assert_eq!(e.status(), 500);
        let e = db.query(values, &[]).await.unwrap_err();
        assert!(e.to_string().contains("parameters"), "{e}");

        assert_eq!(db.execute(bump, &[]).await.unwrap(), 3);
        assert!(db.query(none, &[]).await.unwrap().is_empty());
        let e = db.query_one(none, &[]).await.unwrap_err();
        assert!(e.to_string().contains("one row"), "{e}");

        // An error from the database is a 500 with its SQLSTATE, and the connection (the only
        // one) answers the next query.
        let e = db.query_one(divide, &[&0_i32]).await.unwrap_err();
        assert_eq!(e.status(), 500);
        assert!(e.to_string().contains("22012"), "{e}");
        let row = db.query_one(divide, &[&5_i32]).await.unwrap();
        assert_eq!(row.get::<i32>(0), 2);
        assert_eq!(db.open_connections(), 1);
    });
}

#[test]
fn many_queries_pipelined_on_one_connection_come_back_in_order() {
    let pg = Postgres::start();
    let mut config = DbConfig::new(&pg.url()).unwrap().connections(1);
    let square = config.prepare("SELECT $1::int * $1::int");
    let config = Arc::new(config);
    on_worker(|| async move {
        let db = Db::start(config);
        opened(&db, 1).await;
        // One request's batch, and many requests at once on the same connection.
        let values: Vec<i32> = (1..=500).collect();
        let rows = db.query_each(square, &values).await.unwrap();
        let squares: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(squares, values.iter().map(|v| v * v).collect::<Vec<_>>());
        square_each_in_a_task(200, |v| {
            let db = db.clone();
            async move { db.query_one(square, &[&v]).await.unwrap() }
        })
        .await;
    });
}

#[test]
fn the_shortest_answers_and_errors_among_many_in_flight_all_arrive_before_the_timeout() {
    // Over TCP the driver asks the kernel not to wake it until the least its answers can come
    // to has arrived: the next answer when a task waits for it, else everything in flight.
    // An empty statement's answer is the shortest there is (16 bytes); if that least were
    // counted too high, a batch of them would never wake the driver and the queries would end
    // in the timeout.
    let pg = Postgres::start();
    let mut config = DbConfig::new(&pg.url())
        .unwrap()
        .connections(1)
        .query_timeout(Duration::from_secs(5));
    let empty = config.prepare("");
    let divide = config.prepare("SELECT 10 / $1::int");
    let config = Arc::new(config);
    on_worker(|| async move {
        let db = Db::start(config);
        opened(&db, 1).await;
        let conn = db.connection().unwrap();
        let spawn_300 = |errors: bool| {
            (0..300)
                .map(|i: i32| {
                    let conn = conn.clone();
                    tokio::task::spawn_local(async move {
                        if errors && i % 3 == 1 {
                            let divisor = i % 2;
                            let result = conn.query_one(divide, &[&divisor]).await;
                            (i, result.map(|row| i64::from(row.get::<i32>(0))))
                        } else {
                            (i, conn.execute(empty, &[]).await.map(|n| n as i64))
                        }
                    })
                })
                .collect::<Vec<_>>()
        };
        // Empty statements only, then errors and rows among them; every task waits for its
        // own answer.
        for errors in [false, true] {
            for task in spawn_300(errors) {
                match task.await.unwrap() {
                    (i, Ok(n)) if errors && i % 3 == 1 => assert_eq!(n, 10, "query {i}"),
                    (i, Ok(n)) => assert_eq!(n, 0, "query {i}"),
                    (i, Err(DbError::Query(e))) if errors && i % 6 == 4 => {
                        assert_eq!(e.code(), Some("22012"), "query {i}: {e}")
                    }
                    (i, other) => panic!("errors {errors}, query {i}: {other:?}"),
                }
            }
        }
        // Empty statements whose tasks give up once they are sent: no one waits for them, so
        // the mark covers every one in flight, and the next query waits behind them.
        let tasks = spawn_300(false);
        tokio::task::yield_now().await;
        for task in &tasks {
            task.abort();
        }
        let after = conn.execute(empty, &[]).await;
        assert!(matches!(after, Ok(0)), "{after:?}");
    });
}

#[test]
fn queries_behind_a_slow_one_wait_and_all_come_back_and_a_db_conn_keeps_one_connection() {
    let pg = Postgres::start();
    let mut config = DbConfig::new(&pg.url()).unwrap().connections(2);
    let square = config.prepare("SELECT $1::int * $1::int");
    let slow = config.prepare("SELECT pg_sleep(0.3)::text");
    let backend = config.prepare("SELECT pg_backend_pid()");
    let config = Arc::new(config);
    on_worker(|| async move {
        let db = Db::start(config);
        opened(&db, 2).await;
        // A connection taken from the Db keeps its queries on one database session; the Db's
        // own methods go round the connections.
        let conn = db.connection().unwrap();
        let pid = |row: canter::db::Row| row.get::<i32>(0);
        let a = pid(conn.query_one(backend, &[]).await.unwrap());
        let b = pid(conn.query_one(backend, &[]).await.unwrap());
        assert_eq!(a, b);
        let x = pid(db.query_one(backend, &[]).await.unwrap());
        let y = pid(db.query_one(backend, &[]).await.unwrap());
        assert_ne!(x, y);

        // While the slow query is in flight, the queries after it wait in the connection's
        // buffer (more of them than may wait there, so some go out early); every one is
        // answered, after the slow one, with its own value.
        let t = Instant::now();
        let first = {
            let conn = conn.clone();
            tokio::task::spawn_local(async move { conn.query_one(slow, &[]).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        square_each_in_a_task(150, |v| {
            let conn = conn.clone();
            async move { conn.query_one(square, &[&v]).await.unwrap() }
        })
        .await;
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "{:?}",
            t.elapsed()
        );
        first.await.unwrap().unwrap();
        // And the connection goes on answering at once once nothing is in flight.
        let row = conn.query_one(square, &[&12_i32]).await.unwrap();
        assert_eq!(row.get::<i32>(0), 144);
    });
}

#[test]
fn a_stalled_database_fails_every_waiting_query_at_the_timeout_and_late_answers_are_dropped() {
    let pg = Postgres::start();
    let mut config = DbConfig::new(&pg.url())
        .unwrap()
        .connections(1)
        .query_timeout(Duration::from_millis(300));
    let square = config.prepare("SELECT $1::int * $1::int");
    let config = Arc::new(config);
    let pg = &pg;
    on_worker(|| async move {
        let db = Db::start(config);
        opened(&db, 1).await;
        // The server's processes, the connection's backend among them (it exists now).
        let pids = pg.pids();
        assert_eq!(
            db.query_one(square, &[&3_i32]).await.unwrap().get::<i32>(0),
            9
        );
        // The server and its backends stop answering; the connection stays open.
        signal(&pids, "STOP");
        let t = Instant::now();
        let values: Vec<i32> = (1..=5).collect();
        let all = async {
            tokio::join!(
                db.query_each(square, &values),
                db.query_one(square, &[&7_i32]),
                db.query_one(square, &[&8_i32]),
            )
        };
        let (batch, one, two) = tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("the queries were not failed at the query timeout");
        let took = t.elapsed();
        for e in [batch.unwrap_err(), one.unwrap_err(), two.unwrap_err()] {
            assert!(matches!(e, DbError::Timeout), "{e:?}");
            assert_eq!(e.status(), 503);
        }
        assert!(took >= Duration::from_millis(290), "failed after {took:?}");
        assert!(took < Duration::from_secs(3), "failed after {took:?}");
        // A query sent after those failed gets a whole timeout of its own.
        let t = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(5), db.query_one(square, &[&9_i32]))
            .await
            .expect("the query was not failed at the query timeout")
            .unwrap_err();
        assert!(matches!(e, DbError::Timeout), "{e:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "{:?}",
            t.elapsed()
        );
        signal(&pids, "CONT");
        // The late answers are dropped in order: the next query gets its own.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match db.query_one(square, &[&11_i32]).await {
                Ok(row) => {
                    assert_eq!(row.get::<i32>(0), 121);
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "{e:?}"),
            }
        }
        let rows = db.query_each(square, &values).await.unwrap();
        let squares: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(squares, vec![1, 4, 9, 16, 25]);
    });
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status();
    }
}

/// PostgreSQL over TLS: a server with `ssl=on` and a certificate from a throwaway CA, reached
/// with `sslmode=require` (encrypted, certificate not checked) and `verify-full` (checked
/// against `sslrootcert` and the host name); a wrong CA or host name, or `require` against a
/// server without TLS, never opens a connection.
#[test]
fn tls_with_sslmode_require_and_verify_full() {
    let pki = canter_testkit::Pki::new();
    let cert = pki.server("pg", &["localhost", "127.0.0.1"]);
    let other = canter_testkit::Pki::new();
    let pg = Postgres::start_tls(&cert.cert, &cert.key);
    let plain = Postgres::start();
    let connect = |url: String| -> Result<bool, DbError> {
        let mut config = DbConfig::new(&url)?.connections(1);
        let ssl = config.prepare("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
        let config = Arc::new(config);
        on_worker(|| async move {
            let db = Db::start(config);
            // Loopback connections open in milliseconds; a refused one never does.
            let deadline = Instant::now() + Duration::from_millis(1500);
            while db.open_connections() < 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let row = db.query_one(ssl, &[]).await?;
            Ok(row.get::<bool>(0))
        })
    };
    let ca = pki.ca().display().to_string();
    let wrong_ca = other.ca().display().to_string();
    let url = |port: u16, host: &str, query: &str| {
        format!("postgres://canter@{host}:{port}/postgres?{query}")
    };
    // Encrypted, whether checked or not; by IP address and by name.
    for query in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-full&sslrootcert={ca}"),
    ] {
        for host in ["127.0.0.1", "localhost"] {
            let got = connect(url(pg.port, host, &query));
            assert!(matches!(got, Ok(true)), "{host} {query}: {got:?}");
        }
    }
    // The key=value form too.
    let kv = format!(
        "host=127.0.0.1 port={} user=canter dbname=postgres sslmode=verify-full sslrootcert={ca}",
        pg.port
    );
    assert!(matches!(connect(kv), Ok(true)));
    // The default (prefer) takes TLS where offered, plaintext elsewhere.
    assert!(matches!(connect(url(pg.port, "127.0.0.1", "")), Ok(true)));
    assert!(matches!(
        connect(url(plain.port, "127.0.0.1", "")),
        Ok(false)
    ));
    // Refused: a certificate from another CA, one without the name connected to, and
    // require or verify-full against a server without TLS.
    let by_name_only = pki.server("pg-localhost", &["localhost"]);
    let named = Postgres::start_tls(&by_name_only.cert, &by_name_only.key);
    let verified = format!("sslmode=verify-full&sslrootcert={ca}");
    assert!(matches!(
        connect(url(named.port, "localhost", &verified)),
        Ok(true)
    ));
    for (port, query) in [
        (
            pg.port,
            format!("sslmode=verify-full&sslrootcert={wrong_ca}"),
        ),
        (named.port, verified.clone()),
        (plain.port, "sslmode=require".to_owned()),
        (plain.port, format!("sslmode=verify-full&sslrootcert={ca}")),
    ] {
        let got = connect(url(port, "127.0.0.1", &query));
        assert!(matches!(got, Err(DbError::Unavailable)), "{query}: {got:?}");
    }
    // Settings that cannot work are refused at once.
    for query in [
        "sslmode=verify-ca",
        "sslmode=sometimes",
        "sslmode=verify-full&sslrootcert=/nonexistent.pem",
    ] {
        let got = DbConfig::new(&url(pg.port, "127.0.0.1", query));
        assert!(matches!(got, Err(DbError::Tls(_))), "{query}: {got:?}");
    }
}
