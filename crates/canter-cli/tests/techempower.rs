//! `canter serve --app techempower` against a real PostgreSQL (Debian's package, started by the
//! test): every endpoint checked against the TechEmpower rules, updates read back from the
//! database, the escaped `<script>` fortune, and the faults: a database that goes away (quick 503,
//! then served again after it restarts), one that stops answering (503 at the query timeout), and
//! a query error (500, with the connection still usable).

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{fetch, Postgres, Response, Server};
use serde_json::Value;

/// PostgreSQL with the TFB tables, and canter serving the TFB app from it.
fn start(extra: &[&str]) -> (Postgres, Server) {
    let pg = Postgres::start();
    db_setup(&pg);
    let url = pg.url();
    let mut args = vec!["--app", "techempower", "--db", url.as_str()];
    args.extend_from_slice(extra);
    let server = Server::start_with(&args);
    (pg, server)
}

fn db_setup(pg: &Postgres) {
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["db-setup", "--db", &pg.url()])
        .output()
        .expect("run canter db-setup");
    assert!(
        out.status.success(),
        "db-setup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn get(server: &Server, path: &str) -> Response {
    fetch(server.addr(), "GET", path, "")
}

/// GET `path` until it answers 200 (the workers' connections open in the background).
fn get_ok(server: &Server, path: &str, within: Duration) -> Response {
    let deadline = Instant::now() + within;
    loop {
        let r = get(server, path);
        if r.status == 200 || Instant::now() > deadline {
            assert_eq!(r.status, 200, "{path}: {r:?}\n{}", server.log());
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn json(r: &Response) -> Value {
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

/// A World object: exactly `id` and `randomNumber`, both in 1..=10,000.
fn world(v: &Value) -> (i64, i64) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 2, "{v}");
    let id = o["id"].as_i64().unwrap_or_else(|| panic!("id: {v}"));
    let n = o["randomNumber"]
        .as_i64()
        .unwrap_or_else(|| panic!("randomNumber: {v}"));
    assert!((1..=10_000).contains(&id), "{v}");
    assert!((1..=10_000).contains(&n), "{v}");
    (id, n)
}

fn worlds(r: &Response) -> Vec<(i64, i64)> {
    let v = json(r);
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(world)
        .collect()
}

/// The stored random number of each id, read with psql.
fn stored(pg: &Postgres, ids: &[i64]) -> Vec<(i64, i64)> {
    let list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    pg.psql(&format!(
        "SELECT id, randomnumber FROM world WHERE id IN ({list}) ORDER BY id"
    ))
    .lines()
    .map(|l| {
        let (a, b) = l.split_once('|').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    })
    .collect()
}

#[test]
fn every_test_type_follows_the_rules() {
    // With event coalescing on, as the benchmark suite runs the app (the other tests run
    // without it).
    let (pg, server) = start(&["--coalesce", "20"]);
    assert_eq!(pg.psql("SELECT count(*) FROM world"), "10000");
    assert_eq!(pg.psql("SELECT count(*) FROM fortune"), "12");

    let r = get_ok(&server, "/db", Duration::from_secs(10));
    common::assert_standard_headers(&r);
    let (id, n) = world(&json(&r));
    assert_eq!(
        stored(&pg, &[id]),
        vec![(id, n)],
        "/db answers the stored row"
    );

    let r = get(&server, "/plaintext");
    common::assert_standard_headers(&r);
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.body, b"Hello, World!");
    let r = get(&server, "/json");
    common::assert_standard_headers(&r);
    assert_eq!(json(&r), serde_json::json!({"message": "Hello, World!"}));

    // Multiple queries: clamped to 1..=500, a missing or bad value meaning 1.
    for (query, len) in [
        ("", 1),
        ("?queries=", 1),
        ("?queries=foo", 1),
        ("?queries=0", 1),
        ("?queries=-5", 1),
        ("?queries=1", 1),
        ("?queries=20", 20),
        ("?queries=500", 500),
        ("?queries=501", 500),
        ("?queries=99999999999999999999", 1),
    ] {
        for path in ["/queries", "/cached-queries"] {
            let query = match path {
                "/cached-queries" => query.replace("queries=", "count="),
                _ => query.to_owned(),
            };
            let r = get(&server, &format!("{path}{query}"));
            assert_eq!(r.status, 200, "{path}{query}: {r:?}");
            common::assert_standard_headers(&r);
            let rows = worlds(&r);
            assert_eq!(rows.len(), len, "{path}{query}");
            let mut ids: Vec<i64> = rows.iter().map(|&(id, _)| id).collect();
            ids.sort_unstable();
            ids.dedup();
            let mut expected: Vec<(i64, i64)> = rows.clone();
            expected.sort_unstable();
            expected.dedup();
            assert_eq!(stored(&pg, &ids), expected, "{path}{query}: rows as stored");
        }
    }
    // 20 rows are 20 random picks, not one row 20 times.
    let rows = worlds(&get(&server, "/queries?queries=20"));
    let mut ids: Vec<i64> = rows.iter().map(|&(id, _)| id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert!(ids.len() > 10, "{rows:?}");

    // Updates: the answer is what the database holds afterwards.
    for (query, len) in [
        ("?queries=20", 20),
        ("?queries=foo", 1),
        ("?queries=501", 500),
    ] {
        let r = get(&server, &format!("/updates{query}"));
        assert_eq!(r.status, 200, "/updates{query}: {r:?}");
        let rows = worlds(&r);
        assert_eq!(rows.len(), len);
        let mut ids: Vec<i64> = rows.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), len, "/updates{query}: distinct rows");
        let mut expected = rows.clone();
        expected.sort_unstable();
        assert_eq!(stored(&pg, &ids), expected, "/updates{query} persisted");
    }
    // ... and the numbers change.
    let before = worlds(&get(&server, "/queries?queries=500"));
    let after = worlds(&get(&server, "/updates?queries=500"));
    let changed = after
        .iter()
        .filter(|&&(id, n)| before.iter().any(|&(i, m)| i == id && m != n))
        .count();
    let common_ids = after
        .iter()
        .filter(|&&(id, _)| before.iter().any(|&(i, _)| i == id))
        .count();
    assert_eq!(changed, common_ids, "every updated row got a new number");

    // Fortunes: the table plus the added row, sorted by message, escaped.
    let r = get(&server, "/fortunes");
    assert_eq!(r.status, 200, "{r:?}");
    common::assert_standard_headers(&r);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let body = r.text();
    assert_eq!(body, expected_fortunes(&pg));
    assert!(!body.contains("<script>"), "{body}");
    assert!(body.contains(
        "&lt;script&gt;alert(&quot;This should not be displayed in a browser alert box.&quot;);&lt;/script&gt;"
    ));
    assert!(body.contains("フレームワークのベンチマーク"));
    // A fortune added to the table shows, escaped, in its place.
    pg.psql("INSERT INTO fortune VALUES (13, '<b>bold</b> & \"quoted\"')");
    let body = get(&server, "/fortunes").text().to_owned();
    assert_eq!(body, expected_fortunes(&pg));
    // '<b' sorts before '<s': the new row comes first.
    assert!(
        body.starts_with(
            "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table>\
             <tr><th>id</th><th>message</th></tr><tr><td>13</td>"
        ),
        "{body}"
    );
    assert!(body
        .contains("<tr><td>13</td><td>&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;</td></tr>"));
}

#[test]
fn http2_clients_get_the_same_answers() {
    let (pg, server) = start(&[]);
    get_ok(&server, "/db", Duration::from_secs(10));
    let out = common::curl(&["--http2-prior-knowledge", &server.url("/fortunes")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected_fortunes(&pg));
    let out = common::curl(&[
        "--http2-prior-knowledge",
        "-w",
        "\n%{http_version}",
        &server.url("/updates?queries=7"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, version) = text.rsplit_once('\n').unwrap();
    assert_eq!(version, "2");
    let rows: Vec<Value> = serde_json::from_str(body).unwrap();
    let mut rows: Vec<(i64, i64)> = rows.iter().map(world).collect();
    rows.sort_unstable();
    let ids: Vec<i64> = rows.iter().map(|&(id, _)| id).collect();
    assert_eq!(stored(&pg, &ids), rows);
}

/// The fortunes page computed here from the table: rows sorted by message (bytewise, which
/// is the order of Unicode scalar values for UTF-8), the text escaped.
fn expected_fortunes(pg: &Postgres) -> String {
    let mut rows: Vec<(String, String)> = pg
        .psql("SELECT id, message FROM fortune")
        .lines()
        .map(|l| {
            let (id, m) = l.split_once('|').unwrap();
            (id.to_owned(), m.to_owned())
        })
        .collect();
    rows.push((
        "0".into(),
        "Additional fortune added at request time.".into(),
    ));
    rows.sort_by(|a, b| a.1.cmp(&b.1));
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let mut html = String::from(
        "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table>\
         <tr><th>id</th><th>message</th></tr>",
    );
    for (id, m) in rows {
        html.push_str(&format!("<tr><td>{id}</td><td>{}</td></tr>", escape(&m)));
    }
    html.push_str("</table></body></html>");
    html
}

/// What TechEmpower's verifier (toolset/databases/postgres) reads: the rows of every statement
/// that names `world` and says SELECT (rows read), or UPDATE (rows updated), from
/// pg_stat_statements; and both `"World"` and `world`, before and after the update test.
#[test]
fn the_tfb_verifiers_counts_and_tables_hold() {
    let pg = Postgres::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    db_setup(&pg);
    for table in ["\"World\"", "world"] {
        assert_eq!(pg.psql(&format!("SELECT count(*) FROM {table}")), "10000");
    }
    for table in ["\"Fortune\"", "fortune"] {
        assert_eq!(pg.psql(&format!("SELECT count(*) FROM {table}")), "12");
    }
    let url = pg.url();
    let server = Server::start_with(&["--app", "techempower", "--db", url.as_str()]);
    get_ok(&server, "/db", Duration::from_secs(10));
    pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    // The verifier's own reading of both tables (it fails on the first one missing).
    let both = || {
        pg.psql("SELECT (SELECT sum(randomnumber) FROM \"World\") || ' ' || (SELECT string_agg(randomnumber::text, ',' ORDER BY id) FROM world)")
    };
    let before = both();
    pg.psql("SELECT pg_stat_statements_reset()");
    let (requests, queries) = (10, 20);
    for _ in 0..requests {
        let r = get(&server, &format!("/updates?queries={queries}"));
        assert_eq!(r.status, 200, "{r:?}");
    }
    let sum = |rule: &str| {
        pg.psql(&format!(
            "SELECT coalesce(sum(rows), 0) FROM pg_stat_statements \
             WHERE query ~* '[[:<:]]world[[:>:]]' AND query ~* '{rule}' \
             AND query !~* 'pg_stat_statements'"
        ))
    };
    let expected = (requests * queries).to_string();
    assert_eq!(sum("select"), expected, "rows read");
    assert_eq!(sum("update"), expected, "rows updated");
    assert_ne!(both(), before, "the update test sees the rows change");
}

#[test]
fn db_setup_can_run_again() {
    let pg = Postgres::start();
    db_setup(&pg);
    pg.psql("UPDATE world SET randomnumber = 0");
    db_setup(&pg);
    assert_eq!(
        pg.psql("SELECT count(*) FROM world WHERE randomnumber BETWEEN 1 AND 10000"),
        "10000"
    );
    assert_eq!(pg.psql("SELECT count(*) FROM fortune"), "12");
}

#[test]
fn a_database_that_goes_away_gets_quick_503s_then_is_served_again() {
    let (pg, server) = start(&["--db-query-timeout", "2000"]);
    get_ok(&server, "/db", Duration::from_secs(10));
    pg.stop();
    // Every request is answered, 503, without waiting for the query timeout.
    for path in [
        "/db",
        "/queries?queries=20",
        "/fortunes",
        "/updates?queries=5",
        "/db",
    ] {
        let t = Instant::now();
        let r = get(&server, path);
        assert_eq!(r.status, 503, "{path} with the database down: {r:?}");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{path}: 503 took {:?}",
            t.elapsed()
        );
    }
    // Many failures, few log lines: at most one a second per worker and kind (the connection
    // cut mid-query, then none open).
    let t = Instant::now();
    for _ in 0..300 {
        assert_eq!(get(&server, "/db").status, 503);
    }
    let seconds = t.elapsed().as_secs() + 2;
    let lines = server.log().matches("database request failed").count() as u64;
    assert!(
        (1..=2 * 2 * seconds).contains(&lines),
        "{lines} error lines for 305 failures in {seconds} s on 2 workers:\n{}",
        server.log()
    );
    // Requests that need no database are unaffected.
    assert_eq!(get(&server, "/plaintext").status, 200);
    pg.restart();
    // Reconnected with backoff (at most 2 s apart), without restarting canter.
    let r = get_ok(&server, "/queries?queries=20", Duration::from_secs(15));
    assert_eq!(worlds(&r).len(), 20);
    // Every worker serves again: a run of requests over new connections all succeed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ok_in_a_row = 0;
    while ok_in_a_row < 20 {
        assert!(Instant::now() < deadline, "{}", server.log());
        match get(&server, "/db").status {
            200 => ok_in_a_row += 1,
            _ => ok_in_a_row = 0,
        }
    }
    let log = server.log();
    assert!(log.contains("database request failed"), "{log}");
    assert!(log.contains("reopened"), "{log}");
}

#[test]
fn a_database_that_stops_answering_gets_503_at_the_query_timeout() {
    let (pg, server) = start(&[
        "--db-query-timeout",
        "500",
        "--workers",
        "1",
        "--db-connections",
        "1",
    ]);
    get_ok(&server, "/db", Duration::from_secs(10));
    // Freeze the server and its backends (the connections stay open, nothing answers).
    let pids = pg.pids();
    signal(&pids, "STOP");
    let t = Instant::now();
    let r = get(&server, "/db");
    let took = t.elapsed();
    signal(&pids, "CONT");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        took >= Duration::from_millis(450),
        "answered before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // The late answer is discarded and the connection serves the next query.
    get_ok(&server, "/db", Duration::from_secs(5));
    assert!(
        server.log().contains("did not answer in time"),
        "{}",
        server.log()
    );
}

#[test]
fn a_query_error_is_a_500_and_the_connection_stays_usable() {
    let (pg, server) = start(&["--workers", "1", "--db-connections", "1"]);
    get_ok(&server, "/fortunes", Duration::from_secs(10));
    pg.psql("ALTER TABLE fortune RENAME TO fortune_away");
    let r = get(&server, "/fortunes");
    assert_eq!(r.status, 500, "{r:?}");
    // The same (only) connection still answers other queries, and this one once it can.
    assert_eq!(get(&server, "/db").status, 200);
    pg.psql("ALTER TABLE fortune_away RENAME TO fortune");
    get_ok(&server, "/fortunes", Duration::from_secs(5));
    let log = server.log();
    assert!(log.contains("query failed: 42P01"), "{log}");
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status();
    }
}
