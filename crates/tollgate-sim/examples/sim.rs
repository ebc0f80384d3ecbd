//! The simulated provider as a standalone process, with the same flags as
//! `tollgate sim`:
//!
//! ```text
//! cargo run --release -p tollgate-sim --example sim -- --rpm 60 --tpm 10000
//! ```

use clap::Parser;
use tollgate_sim::{SimArgs, SimError};

#[derive(Debug, Parser)]
#[command(name = "sim", about = "A strict simulated OpenAI-compatible provider")]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[tokio::main]
async fn main() -> Result<(), SimError> {
    let cli = Cli::parse();
    eprintln!(
        "simulated provider on http://{} (Ctrl-C to stop)",
        cli.sim.listen
    );
    tollgate_sim::run(&cli.sim, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
