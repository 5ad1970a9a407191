//! Standalone driver for the load generator:
//! `cargo run --release -p canter-load --example load -- -c 50 -d 5s http://127.0.0.1:8080/`.

use clap::Parser;

/// `canter load` without the rest of the `canter` binary.
#[derive(Parser, Debug)]
#[command(name = "canter-load", about = "HTTP load generator")]
struct Cli {
    #[command(flatten)]
    load: canter_load::LoadArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = canter_load::run(cli.load) {
        eprintln!("canter-load: {e}");
        std::process::exit(1);
    }
}
