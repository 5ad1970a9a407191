//! Event coalescing (`Config::coalesce`): checked settings, and a busy worker that sleeps
//! before it waits for events while still answering every request, with park hooks still run.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use canter_rt::{Reply, Request, Response};
use common::{counting_park_hooks, test_builder, TestServer};

#[test]
fn the_delay_must_be_above_zero_and_at_most_a_millisecond() {
    for bad in [Duration::ZERO, Duration::from_micros(1001)] {
        let err = test_builder().coalesce(Some(bad)).build().unwrap_err();
        assert!(err.to_string().contains("coalesce"), "{err}");
    }
    let ok = test_builder()
        .coalesce(Some(Duration::from_micros(20)))
        .build()
        .unwrap();
    assert_eq!(ok.coalesce(), Some(Duration::from_micros(20)));
    assert_eq!(test_builder().build().unwrap().coalesce(), None);
}

fn echo_target(req: Request) -> Reply {
    Response::text(req.path().to_owned()).into()
}

#[test]
fn a_busy_worker_sleeps_before_each_wait_and_answers_everything() {
    let (hooks, parked, unparked) = counting_park_hooks();
    let config = test_builder()
        .coalesce(Some(Duration::from_millis(1)))
        .park_hooks(Some(hooks))
        .build()
        .unwrap();
    let server = TestServer::start(config, |_| echo_target);
    let mut client = server.client();
    // One request at a time on one connection: after the first few, each finds the worker
    // busy (its last wait was short), so each waits out the worker's 1 ms sleep.
    let n = 200;
    let start = Instant::now();
    for i in 0..n {
        let res = client.get(&format!("/r{i}"));
        assert_eq!(res.status, 200);
        assert_eq!(res.body, format!("/r{i}").as_bytes());
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(150),
        "{n} requests in turn took {took:?}: the worker did not sleep before its waits"
    );
    // The user's hooks run in the same park callback as the sleep, so they ran about as often
    // as the worker slept. Not once per request without fail: a client woken by the response
    // can send its next request before the worker's task reads again (it may run on the
    // worker's core and preempt it), and that request is then taken without a wait.
    let (parked, unparked) = (
        parked.load(Ordering::SeqCst),
        unparked.load(Ordering::SeqCst),
    );
    assert!(
        parked >= n / 2,
        "park hook ran {parked} times for {n} requests"
    );
    assert!(
        unparked >= n / 2,
        "unpark hook ran {unparked} times for {n} requests"
    );
    server.stop();
}
