//! The Python package (`python/`): built with a plain `pip install ./python` into a virtual
//! environment under the target directory, then its pytest suite (`python/tests`), which runs
//! real servers in subprocesses. Fails, never skips, when Python, pip or the build fail.

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// `python -m pip install --quiet ARGS`.
fn pip_install(python: &Path, args: &[&std::ffi::OsStr], what: &str) {
    run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args),
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
        "installing the test requirements (python/tests/requirements.txt)",
    );
    // Exactly what the README tells users to run.
    pip_install(
        &python,
        &[root().join("python").as_os_str()],
        "pip install ./python",
    );
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        // The load tests drive the servers with `canter load`.
        .env("CANTER_BIN", env!("CARGO_BIN_EXE_canter"))
        .current_dir(root().join("python"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the Python package's tests failed: {status}"
    );
}
