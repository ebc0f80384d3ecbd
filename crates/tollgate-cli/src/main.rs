//! `tollgate`: the gateway (`serve`), the simulated provider (`sim`), the
//! batch runner (`batch`) and a helper to hash API keys for the
//! configuration (`hash-key`).
#![forbid(unsafe_code)]

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// A gateway allocates and frees many small buffers per request; mimalloc
/// serves them faster than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Admission, deadlines and resilience for rate-limited LLM APIs.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    /// Runtime worker threads (default: one per CPU). On a machine shared
    /// with other busy processes, fewer workers cost less CPU per request
    /// (fewer wake-ups between threads) but cap throughput at that many
    /// cores; see docs/operations.md.
    #[arg(long, global = true, env = "TOLLGATE_WORKERS")]
    workers: Option<std::num::NonZeroUsize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the OpenAI-compatible gateway. Without --config it starts on a
    /// built-in default in front of an in-process simulated provider.
    Serve {
        /// The gateway's TOML configuration.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Listen on this address instead of the configured one.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Log as JSON lines (overrides server.log_format).
        #[arg(long)]
        json_logs: bool,
    },
    /// Run the strict simulated OpenAI provider.
    Sim(Box<tollgate_sim::SimArgs>),
    /// Run an OpenAI Batch JSONL file at the highest rate the quota allows,
    /// resumably (exit code 0: every item has a result; 2: invalid input,
    /// nothing sent; 3: stopped early, re-run to resume; 1: other errors).
    Batch(Box<tollgate_batch::BatchArgs>),
    /// Print the SHA-256 of an API key, as `keys_sha256` in the
    /// configuration expects it. Reads the key from stdin when omitted.
    HashKey {
        /// The key (prefer stdin: arguments can end up in shell history).
        key: Option<String>,
    },
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(workers) = cli.workers {
        builder.worker_threads(workers.get());
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // The message names the file, field and reason; no backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            json_logs,
        } => {
            let json = json_logs
                || config
                    .as_ref()
                    .and_then(|p| tollgate_gateway::config::GatewayConfig::load(p).ok())
                    .is_some_and(|c| {
                        c.server.log_format == tollgate_gateway::config::LogFormat::Json
                    });
            init_logs(json);
            tollgate_gateway::run(
                config.as_deref(),
                listen,
                tollgate_gateway::server::signal(),
            )
            .await?;
        }
        Command::Sim(args) => {
            init_logs(false);
            tollgate_sim::run(&args, tollgate_gateway::server::signal())
                .await
                .context("simulator failed")?;
        }
        Command::HashKey { key } => {
            let key = match key {
                Some(k) => k,
                None => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .context("reading the key from stdin")?;
                    s.trim_end_matches(['\n', '\r']).to_owned()
                }
            };
            println!("{}", tollgate_gateway::auth::hash_key_for_config(&key)?);
        }
        Command::Batch(args) => return Ok(batch(&args).await),
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Whether log lines are coloured: only on a terminal, so that a log
/// piped to a file or a collector holds no escape codes.
fn colours() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal()
}

/// Ctrl-C and SIGTERM, heard together from the moment it is made (each
/// held as a stream, so none arriving between two waits is lost).
struct StopSignals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Listens to both; one that cannot be listened to is left to its
    /// default action, the other still heard.
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            StopSignals {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// The next of either; the exit code a process killed by it would
    /// have (130 for Ctrl-C, 143 for SIGTERM). Never returns when neither
    /// can be heard.
    async fn next(&mut self) -> i32 {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.int) => 130,
                () = recv(&mut self.term) => 143,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            130
        }
    }
}

/// A second signal this soon after the first is taken as the same
/// request (a terminal's Ctrl-C and a wrapper forwarding it as SIGTERM),
/// not as the one that quits at once.
const SAME_STOP: std::time::Duration = std::time::Duration::from_secs(1);

/// `tollgate batch`: the summary on stdout, problems on stderr, the
/// outcome in the exit code.
async fn batch(args: &tollgate_batch::BatchArgs) -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours())
        .init();
    let result = match args.to_config() {
        Ok(config) => {
            // Ctrl-C and SIGTERM (what service managers send) are heard
            // for the whole run, on a task of its own: the first asks the
            // run to stop, the second quits at once, even while the run
            // drains after a stop of another kind (a job deadline, a spent
            // budget), when it no longer listens.
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let mut signals = StopSignals::new();
            tokio::spawn(async move {
                signals.next().await;
                let first = std::time::Instant::now();
                eprintln!(
                    "stopping: finishing the calls already sent (Ctrl-C or SIGTERM again to quit at once; the output stays consistent)"
                );
                let _ = stop.send(());
                loop {
                    let code = signals.next().await;
                    if first.elapsed() >= SAME_STOP {
                        std::process::exit(code);
                    }
                }
            });
            let interrupt = async {
                if stopped.await.is_err() {
                    // No Ctrl-C handler could be installed: never interrupted.
                    std::future::pending::<()>().await;
                }
            };
            tollgate_batch::run(config, interrupt).await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(report) => {
            println!("{}", report.summary);
            for e in &report.report_errors {
                eprintln!("error: report not written: {e}");
            }
            std::process::ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, tollgate_batch::BatchError::Input(_)) {
                eprintln!("nothing was sent");
            }
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
