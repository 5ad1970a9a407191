//! The Python package (`python/`): built with a plain `pip install ./python` into a virtual
//! environment under the target directory, then its pytest suite (`python/tests`), which runs
//! real servers in subprocesses; then Market Spread written in Python
//! (`python/examples/market_spread.py`) against the same independent reference as the Rust
//! pipeline. Fails, never skips, when Python, pip or the build fail.

#![allow(clippy::unwrap_used, missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::market_spread::{reference, unframe};
use common::receive;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `python -m pip install --quiet ARGS` with `envs` added to the environment.
fn pip_install(python: &Path, args: &[&std::ffi::OsStr], envs: &[(&str, &str)], what: &str) {
    run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args)
            .envs(envs.iter().copied()),
        what,
    );
}

#[test]
fn python_package_builds_and_passes_its_tests() {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "creating a virtual environment (python3 -m venv)",
        );
    }
    pip_install(
        &python,
        &[
            "-r".as_ref(),
            root().join("python/tests/requirements.txt").as_os_str(),
        ],
        &[],
        "installing the test requirements (python/tests/requirements.txt)",
    );
    // What the README tells users to run. The package's release profile links with fat LTO
    // in one codegen unit, for the users' speed; here that one link was most of the suite's
    // time on two cores, so the test build overrides those two settings (Cargo reads
    // CARGO_PROFILE_RELEASE_* from the environment pip passes to maturin): the same code at
    // the same optimization level, without cross-crate inlining. What the tests check does not
    // depend on it; the benchmarks build with the profile as it is.
    pip_install(
        &python,
        &[root().join("python").as_os_str()],
        &[
            ("CARGO_PROFILE_RELEASE_LTO", "off"),
            ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16"),
        ],
        "pip install ./python",
    );
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "."])
        // The load tests drive the servers with `canter load`.
        .env("CANTER_BIN", env!("CARGO_BIN_EXE_canter"))
        // From the tests' directory: `python -m` puts the working directory first on the
        // path, and from python/ the package's sources (without the built extension) would
        // shadow the installed package the tests import.
        .current_dir(root().join("python/tests"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the Python package's tests failed: {status}"
    );
    market_spread_in_python_gives_the_reference_results(&python);
}

/// The Python package's crate is a workspace of its own, outside `cargo test --workspace`: its
/// unit tests (the parts that need no interpreter) run here, in a target directory of their own
/// (the outer `cargo test` holds its own).
#[test]
fn python_crate_unit_tests_pass() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        Command::new(cargo)
            .args(["test", "--quiet", "--locked", "--lib", "--manifest-path"])
            .arg(root().join("python/Cargo.toml"))
            .env(
                "CARGO_TARGET_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-crate"),
            )
            // Built once per run: an incremental cache would only take disk.
            .env("CARGO_INCREMENTAL", "0"),
        "cargo test --manifest-path python/Cargo.toml --lib",
    );
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` and waits (20 s at most) for the first line of its stdout that `find` takes
/// something from; every line is echoed, and stderr goes to the test's.
fn spawn_until<T: Send + 'static>(
    mut cmd: Command,
    find: impl Fn(&str) -> Option<T> + Send + 'static,
) -> (Child, T) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(v) = find(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(v);
                }
            }
            eprintln!("{line}");
        }
    });
    let v = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    (child, v)
}

/// Market Spread with its steps in Python, on two worker threads, fed by `canter send
/// market-spread` and read by `canter receive`: exactly the results the independent reference
/// computes (timestamps aside, order aside: each worker has its own sink connection), each
/// with a plausible timestamp.
fn market_spread_in_python_gives_the_reference_results(python: &Path) {
    let canter = env!("CARGO_BIN_EXE_canter");
    let dir = std::env::temp_dir().join(format!("canter-py-ms-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let common = [
        "--symbols",
        "1000",
        "--reject-share",
        "0.1",
        "--count",
        "100000",
    ];
    let written = Command::new(canter)
        .args([
            "send",
            "market-spread",
            "--write-dir",
            dir.to_str().unwrap(),
        ])
        .args(common)
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    let expected_data = reference(&nbbo, &orders);
    let mut expected: Vec<&[u8]> = unframe(&expected_data)
        .into_iter()
        .map(|r| &r[..47])
        .collect();
    let n = expected.len();
    assert!((2_500..7_500).contains(&n), "{n} rejected of 50,000");
    let out = dir.join("results.bin");
    let n_arg = n.to_string();
    let (rx, rx_addr) = receive(&[
        "--expect",
        &n_arg,
        "--duration",
        "60s",
        "--out",
        out.to_str().unwrap(),
    ]);
    let mut py = Command::new(python);
    py.arg(root().join("python/examples/market_spread.py"))
        .args([
            "--nbbo",
            "127.0.0.1:0",
            "--orders",
            "127.0.0.1:0",
            "--workers",
            "2",
        ])
        .args(["--out", &rx_addr.to_string()]);
    let (py, (nbbo_addr, orders_addr)) = spawn_until(py, |l| {
        let rest = l.strip_prefix("listening nbbo=")?;
        let (a, b) = rest.split_once(" orders=")?;
        Some((a.to_owned(), b.trim().to_owned()))
    });
    let _py = Killed(py);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let sent = Command::new(canter)
        .args(["send", "market-spread"])
        .args(common)
        .args(["--nbbo", &nbbo_addr, "--orders", &orders_addr])
        .output()
        .unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let done = rx.wait_with_output().unwrap();
    assert!(done.status.success(), "canter receive: {done:?}");
    let got_data = std::fs::read(&out).unwrap();
    let got = unframe(&got_data);
    assert_eq!(got.len(), n, "results received");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for r in &got {
        let t = u64::from_be_bytes(r[47..55].try_into().unwrap());
        assert!(
            (started..=now).contains(&t),
            "timestamp {t} outside the run"
        );
    }
    let mut got: Vec<&[u8]> = got.iter().map(|r| &r[..47]).collect();
    got.sort();
    expected.sort();
    assert!(got == expected, "the results differ from the reference");
    let _ = std::fs::remove_dir_all(&dir);
}
