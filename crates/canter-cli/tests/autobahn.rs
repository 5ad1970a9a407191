//! The original Autobahn|Testsuite (`autobahntestsuite` from PyPI, its fuzzing client) against
//! the demo's `/ws/echo`: framing, pings, reserved bits, opcodes, fragmentation, UTF-8, close
//! handling, misc (sections 1-7 and 10) and permessage-deflate (12 and 13). Every case must be
//! OK or INFORMATIONAL (the suite's strict verdicts; NON-STRICT fails here).
//!
//! The suite runs on Python 2.7 only: the machine image's pyenv 2.7.18
//! (`~/.pyenv/versions/2.7.18/bin/python`, or `python2.7` on the path). The test installs the
//! suite with that Python's pip into the target directory on first use, and fails, never
//! skips, when Python 2.7 or the install is missing.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;

/// Python 2.7: the pyenv one of the machine image, else `python2.7` on the path.
fn python27() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let pyenv = Path::new(&home).join(".pyenv/versions/2.7.18/bin/python");
    if pyenv.exists() {
        return pyenv;
    }
    let found = Command::new("python2.7").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "Autobahn|Testsuite needs Python 2.7: neither {} nor python2.7 on the path",
        pyenv.display()
    );
    PathBuf::from("python2.7")
}

/// Runs `wstest ARGS` with the suite from `lib` (its packages' .pth files processed, which a
/// plain PYTHONPATH would not do for zope's namespace package).
fn wstest(python: &Path, lib: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(format!(
        "import site, sys; site.addsitedir({:?}); sys.argv = ['wstest'] + sys.argv[1:]; \
         from autobahntestsuite.wstest import run; sys.exit(run())",
        lib.display().to_string()
    ));
    cmd
}

/// The suite, installed once into the target directory.
fn autobahn(python: &Path) -> PathBuf {
    let lib = Path::new(env!("CARGO_TARGET_TMPDIR")).join("autobahntestsuite");
    let ready = |lib: &Path| {
        wstest(python, lib)
            .arg("--help")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ready(&lib) {
        let out = Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-warn-script-location", "--target"])
            .arg(&lib)
            .arg("autobahntestsuite==0.8.2")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "installing autobahntestsuite with Python 2.7's pip failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            ready(&lib),
            "autobahntestsuite does not run after its install"
        );
    }
    lib
}

/// Runs the fuzzing client on `cases` into `dir`; the verdicts by case.
fn fuzz(python: &Path, lib: &Path, port: u16, dir: &Path, cases: &[&str]) -> std::process::Child {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "outdir": dir.join("reports"),
        "servers": [{"agent": "canter", "url": format!("ws://127.0.0.1:{port}/ws/echo")}],
        "cases": cases,
        "exclude-cases": [],
        "exclude-agent-cases": {},
    });
    let spec = dir.join("fuzzingclient.json");
    std::fs::write(&spec, config.to_string()).unwrap();
    wstest(python, lib)
        .args(["-m", "fuzzingclient", "-s"])
        .arg(&spec)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn autobahn_testsuite_fuzzing_client_passes_strictly() {
    let python = python27();
    let lib = autobahn(&python);
    let server = Server::start_with(&["--workers", "2"]);
    // Two clients at once (the suite's Python 2 client, compressing in pure Python, takes most
    // of the time): the compression cases of section 13 beside all the others.
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("autobahn-{}", server.port));
    let parts = [
        (
            base.join("a"),
            &[
                "1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "10.*", "12.*",
            ][..],
        ),
        (base.join("b"), &["13.*"][..]),
    ];
    let runs: Vec<_> = parts
        .iter()
        .map(|(dir, cases)| fuzz(&python, &lib, server.port, dir, cases))
        .collect();
    let mut verdicts = std::collections::BTreeMap::<String, usize>::new();
    let (mut total, mut bad) = (0, Vec::new());
    for ((dir, _), run) in parts.iter().zip(runs) {
        let out = run.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "wstest failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let index = std::fs::read(dir.join("reports/index.json")).unwrap();
        let index: serde_json::Value = serde_json::from_slice(&index).unwrap();
        let cases = index["canter"].as_object().unwrap();
        total += cases.len();
        for (id, case) in cases {
            let behavior = case["behavior"].as_str().unwrap_or("?").to_owned();
            let close = case["behaviorClose"].as_str().unwrap_or("?");
            let strict = |v: &str| matches!(v, "OK" | "INFORMATIONAL");
            if !strict(&behavior) || !strict(close) {
                bad.push(format!("{id}: {behavior} (close {close})"));
            }
            *verdicts.entry(behavior).or_default() += 1;
        }
    }
    eprintln!("Autobahn|Testsuite: {total} cases, {verdicts:?}");
    // Sections 1-7 and 10 hold 247 cases, 12 and 13 hold 216.
    assert!(total >= 463, "only {total} cases ran: {verdicts:?}");
    assert!(
        bad.is_empty(),
        "cases not OK:\n{}\n{}",
        bad.join("\n"),
        server.log()
    );
}
