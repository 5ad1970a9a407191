//! A throwaway PostgreSQL server from Debian's `postgresql` package: `initdb` in a temporary
//! directory, its own port on 127.0.0.1, `fsync` off, stopped and removed on drop. Installed with
//! apt-get when missing; a test that needs it fails (never skips) when it cannot start.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::apt_install;

/// A running PostgreSQL server; stopped (immediately) and its directory removed on drop.
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    /// Server settings beyond the defaults, as `-c name=value` options.
    settings: Vec<String>,
}

impl Postgres {
    /// Starts a new server with a `canter` superuser (trust authentication on loopback).
    pub fn start() -> Postgres {
        Postgres::start_with(&[])
    }

    /// As [`Postgres::start`], with server settings (`name=value`, passed as `-c` options).
    pub fn start_with(settings: &[&str]) -> Postgres {
        Postgres::start_inner(settings, None)
    }

    /// As [`Postgres::start`], with TLS on (`ssl=on`) with this certificate chain and key (PEM),
    /// copied where the server reads them as its own.
    #[allow(dead_code)]
    pub fn start_tls(cert: &Path, key: &Path) -> Postgres {
        Postgres::start_inner(&[], Some((cert, key)))
    }

    fn start_inner(settings: &[&str], tls: Option<(&Path, &Path)>) -> Postgres {
        let bin = postgres_bin();
        let dir = std::env::temp_dir().join(format!(
            "canter-pg-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut settings: Vec<String> = settings.iter().map(|s| format!(" -c {s}")).collect();
        if let Some((cert, key)) = tls {
            // The server reads a key only if it is private (and, as root, its own: chowned
            // with the directory below).
            use std::os::unix::fs::PermissionsExt;
            let (crt, pem) = (dir.join("server.crt"), dir.join("server.key"));
            fs::copy(cert, &crt).unwrap();
            fs::copy(key, &pem).unwrap();
            fs::set_permissions(&pem, fs::Permissions::from_mode(0o600)).unwrap();
            settings.push(" -c ssl=on".to_owned());
            settings.push(format!(" -c ssl_cert_file={}", crt.display()));
            settings.push(format!(" -c ssl_key_file={}", pem.display()));
        }
        let pg = Postgres {
            bin,
            dir,
            port: free_port(),
            settings,
        };
        // PostgreSQL refuses to run as root: as root, run it as the package's `postgres` user.
        if is_root() {
            let out = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&pg.dir)
                .output()
                .unwrap();
            assert!(out.status.success(), "chown for postgres: {out:?}");
        }
        let data = pg.data();
        let out = pg.run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "canter",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        );
        assert!(out.status.success(), "initdb failed: {}", text(&out));
        pg.pg_ctl_start();
        pg
    }

    /// A connection string for database `postgres` as user `canter`.
    pub fn url(&self) -> String {
        format!(
            "postgres://canter@127.0.0.1:{}/postgres?connect_timeout=3",
            self.port
        )
    }

    /// Stops the server at once (`-m immediate`: connections are cut as in a crash).
    pub fn stop(&self) {
        let out = self.stop_now();
        assert!(out.status.success(), "pg_ctl stop failed: {}", text(&out));
    }

    fn stop_now(&self) -> Output {
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    /// Starts the server again after [`Postgres::stop`], on the same port.
    pub fn restart(&self) {
        self.pg_ctl_start();
    }

    /// Runs SQL with `psql`, returning its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let port = self.port.to_string();
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "canter",
                "-d",
                "postgres",
            ])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(out.status.success(), "psql {sql:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.<port>`).
    #[allow(dead_code)]
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `user` log in over TCP with `method` (`md5`, `scram-sha-256`, `password`) instead
    /// of trust: a line ahead of the others in `pg_hba.conf`, then a reload (which takes effect
    /// a moment later).
    #[allow(dead_code)]
    pub fn require_password(&self, user: &str, method: &str) {
        let hba = self.data().join("pg_hba.conf");
        let old = fs::read_to_string(&hba).unwrap();
        fs::write(
            &hba,
            format!("host all {user} 127.0.0.1/32 {method}\n{old}"),
        )
        .unwrap();
        let out = self.run("pg_ctl", &["-D", path_str(&self.data()), "reload"]);
        assert!(out.status.success(), "pg_ctl reload: {}", text(&out));
        // The postmaster rereads the file on SIGHUP, a moment after pg_ctl returns: wait until
        // a login as `user` without a password is refused.
        let port = self.port.to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = Command::new(self.bin.join("psql"))
                .args(["-h", "127.0.0.1", "-p", &port, "-U", user, "-d", "postgres"])
                .args(["-w", "-X", "-q", "-c", "SELECT 1"])
                .stdin(Stdio::null())
                .output()
                .expect("run psql");
            if !out.status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{user} still logs in without a password after the reload");
    }

    /// The server's processes: the postmaster and its children (backends and helpers).
    pub fn pids(&self) -> Vec<u32> {
        let pid_file = fs::read_to_string(self.data().join("postmaster.pid")).unwrap();
        let main: u32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
        let mut pids = vec![main];
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // Fields after the command name (in parentheses): state, then the parent's pid.
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent == Some(main) {
                pids.push(pid);
            }
        }
        pids
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200{}",
            self.port,
            self.dir.display(),
            self.settings.concat()
        );
        let log = self.dir.join("log");
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-o",
                &options,
                "-l",
                path_str(&log),
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        if out.status.success() {
            while Instant::now() < deadline {
                if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!(
            "PostgreSQL did not start: {}\nlog:\n{}",
            text(&out),
            fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Runs a PostgreSQL program, as the `postgres` user when the tests run as root.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let program = self.bin.join(program);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run a PostgreSQL program")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.stop_now();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The directory of the newest installed PostgreSQL's programs, installing the package first
/// when there is none.
fn postgres_bin() -> PathBuf {
    if let Some(bin) = newest_bin() {
        return bin;
    }
    apt_install("postgresql");
    newest_bin().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is needed by this test and could not be installed \
             (apt-get install postgresql); no /usr/lib/postgresql/*/bin/initdb"
        )
    })
}

fn newest_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
