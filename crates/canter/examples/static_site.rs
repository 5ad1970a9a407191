//! A static site: every file under the directory given on the command line, at the root, with
//! ETags, ranges and precompressed `.br`/`.gz` siblings, sent with sendfile(2).
//!
//! ```sh
//! cargo run --release -p canter --example static_site -- ./public [127.0.0.1:8080]
//! curl -i http://127.0.0.1:8080/
//! curl -i -r 0-99 http://127.0.0.1:8080/some/file.bin
//! curl -i --compressed http://127.0.0.1:8080/app.js   # app.js.br or app.js.gz if present
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use canter::rt::{Config, Server};
use canter::{get, Router, ServeDir};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: static_site DIR [ADDR]");
        return ExitCode::FAILURE;
    };
    if !dir.is_dir() {
        eprintln!("static_site: {} is not a directory", dir.display());
        return ExitCode::FAILURE;
    }
    let addr = match args
        .next()
        .map(|a| a.to_string_lossy().parse::<SocketAddr>())
    {
        None => SocketAddr::from(([127, 0, 0, 1], 8080)),
        Some(Ok(addr)) => addr,
        Some(Err(e)) => {
            eprintln!("static_site: bad address: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(dir, addr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("static_site: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: PathBuf, addr: SocketAddr) -> std::io::Result<()> {
    let server = Server::bind(Config::builder().addr(addr).build()?)?;
    canter::rt::shutdown_on_signals(server.shutdown_handle())?;
    println!(
        "serving {} on http://{}/",
        dir.display(),
        server.local_addr()
    );
    // One ServeDir for the process (it is an Arc inside), one router per worker.
    let files = ServeDir::new(dir);
    server.serve(move |_worker| {
        Router::new()
            .route("/healthz", get(|| "ok\n"))
            .serve_dir("/", files.clone())
    })
}
