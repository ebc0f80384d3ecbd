//! Progress on stderr (SPEC BATCH-4): an `indicatif` bar on a terminal,
//! plain periodic lines otherwise.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ProgressMode;
use crate::stats::Stats;

/// A running progress display; [`Progress::finish`] ends it.
pub(crate) struct Progress {
    task: Option<JoinHandle<()>>,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn start(
        mode: ProgressMode,
        interval: Duration,
        stats: Arc<Stats>,
        already_done: u64,
        total: u64,
    ) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        match mode {
            ProgressMode::Off => Progress {
                task: None,
                bar: None,
            },
            ProgressMode::Auto if terminal => {
                let bar = ProgressBar::with_draw_target(
                    Some(total),
                    ProgressDrawTarget::stderr_with_hz(5),
                );
                if let Ok(style) =
                    ProgressStyle::with_template("{bar:30} {pos}/{len} items  ETA {eta}  {msg}")
                {
                    bar.set_style(style);
                }
                bar.set_position(already_done);
                let b = bar.clone();
                let started = Instant::now();
                let task = tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(200));
                    loop {
                        tick.tick().await;
                        let done = stats.done();
                        let secs = started.elapsed().as_secs_f64();
                        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
                        b.set_position(already_done + done);
                        b.set_message(format!("{rate:.1} items/s, {}", status(&stats)));
                    }
                });
                Progress {
                    task: Some(task),
                    bar: Some(bar),
                }
            }
            ProgressMode::Auto | ProgressMode::Plain => {
                let started = Instant::now();
                let task = tokio::spawn(async move {
                    let mut tick = tokio::time::interval_at(started + interval, interval);
                    loop {
                        tick.tick().await;
                        let done = stats.done();
                        let secs = started.elapsed().as_secs_f64();
                        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
                        let left = stats.pending.load(Ordering::Relaxed).saturating_sub(done);
                        let eta = if rate > 0.0 {
                            format!("{:.0} s", left as f64 / rate)
                        } else {
                            "?".to_owned()
                        };
                        eprintln!(
                            "progress: {}/{total} items, {rate:.1} items/s, ETA {eta}, {}",
                            already_done + done,
                            status(&stats)
                        );
                    }
                });
                Progress {
                    task: Some(task),
                    bar: None,
                }
            }
        }
    }

    pub(crate) fn finish(self) {
        if let Some(t) = self.task {
            t.abort();
        }
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

fn status(stats: &Stats) -> String {
    format!(
        "{} failed, {} in flight, {} tokens reported, {} 429s, {} retries",
        stats.failed.load(Ordering::Relaxed),
        stats.in_flight.load(Ordering::Relaxed),
        stats.tokens_reported.load(Ordering::Relaxed),
        stats.rate_limited.load(Ordering::Relaxed),
        stats.retries.load(Ordering::Relaxed),
    )
}
