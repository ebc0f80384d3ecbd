//! The run: validation, resume, the worker pool over one `Supervisor`
//! (SPEC BATCH-2, BATCH-3, BATCH-5, BATCH-6, ADM-8).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex as AsyncMutex, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate::config::{ControllerConfig, Limit, ScopeConfig};
use tollgate::lifecycle::{
    AttemptContext, AttemptPolicy, CallError, CallOptions, ErrorKind, Provider, ProviderError,
    Reply, Supervisor,
};
use tollgate::{
    AdmissionController, AdmissionError, Deadline, Dimension, Phase, Price, TokenEstimate,
};
use tollgate_openai::provider::ChunkStream;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{HttpProvider, UpstreamRequest};
use tollgate_redis::{RedisBackend, RedisSettings};

use crate::config::{BatchConfig, ErrorClass, Target};
use crate::input::{self, InputErrorCode, InputErrors, Item};
use crate::output::{self, ErrorRecord, Meta, OutputLine, OutputWriter, ResponseRecord};
use crate::progress::Progress;
use crate::stats::Stats;
use crate::summary::{Plan, SimFigures, Summary};
use crate::trace::{ItemTrace, Unfinished};
use crate::{BatchError, Outcome, Report, StopReason};
use tollgate_telemetry::{CallEnd, Telemetry, TraceHeaders};

/// How long a stopping run waits for the calls already at the provider.
pub const DRAIN_GRACE: Duration = Duration::from_secs(60);

/// One item as the supervisor sees it: the body, its estimate, and
/// whether an attempt is at the provider now.
#[derive(Debug, Clone)]
struct BatchRequest {
    upstream: UpstreamRequest,
    estimate: TokenEstimate,
    /// The price of its model (SPEC BUD-6), if known.
    price: Option<Price>,
    /// Set while an attempt is under way (from its start to its end or
    /// cancellation): only then is the item at the provider; between
    /// attempts (backoff, admission of a retry) it is not.
    at_provider: Arc<AtomicBool>,
    /// The item's trace, when tracing is on (SPEC OBS-5).
    trace: Option<ItemTrace>,
}

/// Marks an attempt as at the provider until it ends or is dropped.
struct AtProvider(Arc<AtomicBool>);

impl AtProvider {
    fn new(flag: &Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::Release);
        AtProvider(Arc::clone(flag))
    }
}

impl Drop for AtProvider {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// [`HttpProvider`] over [`BatchRequest`]s, counting attempts and their
/// failures by class.
struct BatchProvider {
    http: HttpProvider,
    stats: Arc<Stats>,
    epoch: Instant,
}

impl Provider for BatchProvider {
    type Request = BatchRequest;
    type Response = Bytes;
    type Chunk = Bytes;
    type Stream = ChunkStream;

    fn call(
        &self,
        request: &BatchRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Bytes>, ProviderError>> + Send {
        self.stats.attempt(attempt.attempt);
        let at_provider = AtProvider::new(&request.at_provider);
        let stats = Arc::clone(&self.stats);
        let at = self.epoch.elapsed();
        let estimate = request.estimate.total();
        let (span, headers) = match &request.trace {
            Some(trace) => {
                let (span, headers) = trace.attempt(&attempt);
                (Some(span), headers)
            }
            None => (None, TraceHeaders::default()),
        };
        async move {
            let _at_provider = at_provider;
            let result = self
                .http
                .call_with(&request.upstream, &headers, attempt)
                .await;
            let usage = match &result {
                Ok(reply) => reply.usage,
                Err(e) => {
                    stats.attempt_failed(e.kind);
                    e.usage
                }
            };
            if let Some(span) = span {
                span.end(&result, Some(usage));
            }
            stats.started(at, usage.total().unwrap_or(estimate));
            result
        }
    }

    fn stream(
        &self,
        request: &BatchRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<ChunkStream, ProviderError>> + Send {
        Provider::stream(&self.http, &request.upstream, attempt)
    }
}

/// How the run estimates its items: the configured profile and output
/// allowance.
fn estimator(config: &BatchConfig) -> TokenEstimator {
    TokenEstimator::new()
        .with_profile(config.profile)
        .with_default_output(config.default_output)
}

/// Loads and validates the input: every line (BATCH-1) and every estimate
/// against the token limits (BATCH-5, Q-3). Input that is not a regular
/// file (a pipe, a FIFO, `/dev/stdin`) cannot be read twice: it is copied
/// to a spool as it is read, returned to read the items' bodies from
/// (`spool.rs`).
fn load(config: &BatchConfig) -> Result<(Vec<Item>, Option<std::fs::File>), BatchError> {
    let io = |source| BatchError::Io {
        path: config.input.clone(),
        source,
    };
    let file = std::fs::File::open(&config.input).map_err(io)?;
    let estimator = estimator(config);
    let regular = file.metadata().map_err(io)?.is_file();
    let (items, spooled) = if regular {
        let items = input::read(std::io::BufReader::with_capacity(1 << 16, file), &estimator)
            .map_err(io)?;
        (items, None)
    } else {
        let dir = std::env::temp_dir();
        let spool_err = |source: std::io::Error| BatchError::Io {
            path: dir.clone(),
            source: std::io::Error::new(
                source.kind(),
                format!(
                    "copying the input {} to a temporary file in this directory (input that \
                     is not a regular file, a pipe, is read once and its lines read back from \
                     that copy; set TMPDIR to use another directory): {source}",
                    config.input.display()
                ),
            ),
        };
        let mut spool = crate::spool::Spool::create(&dir).map_err(spool_err)?;
        let reader = std::io::BufReader::with_capacity(1 << 16, spool.tee(file));
        let items = input::read(reader, &estimator).map_err(io)?;
        (items, Some(spool.finish().map_err(spool_err)?))
    };
    let items = items.map_err(BatchError::Input)?;
    let mut errors = InputErrors::new();
    for item in &items {
        for limit in config.limits.iter().filter(|l| l.dimension.is_tokens()) {
            let total = item.estimate.total();
            let asked = match limit.dimension {
                Dimension::InputTokens => item.estimate.input,
                Dimension::OutputTokens => item.estimate.output,
                _ => total,
            };
            if asked > limit.amount {
                errors.push(
                    Some(item.line),
                    InputErrorCode::EstimateExceedsLimit,
                    format!(
                        "custom_id `{}`: estimate of {total} tokens ({} input + {} output) is larger than the whole limit of {} {} per {}",
                        input::printable(&item.custom_id),
                        item.estimate.input,
                        item.estimate.output,
                        limit.amount,
                        limit.dimension.as_str(),
                        limit.window_label()
                    ),
                );
                break;
            }
        }
    }
    if errors.is_empty() {
        Ok((items, spooled))
    } else {
        Err(BatchError::Input(errors))
    }
}

/// Which items still need a run, after reading (and repairing) the output.
struct Resume {
    pending: Vec<Item>,
    already_done: u64,
    torn_bytes: u64,
    rerun: usize,
}

fn resume(config: &BatchConfig, items: Vec<Item>, repair: bool) -> Result<Resume, BatchError> {
    let Some(path) = config.output.as_deref() else {
        return Ok(Resume {
            pending: items,
            already_done: 0,
            torn_bytes: 0,
            rerun: 0,
        });
    };
    let existing = output::scan(path, repair)?;
    let mut changed = InputErrors::new();
    let mut drop = HashSet::new();
    let mut pending = Vec::with_capacity(items.len());
    let mut already_done = 0;
    for item in items {
        let Some(rec) = existing.records.get(&item.custom_id) else {
            pending.push(item);
            continue;
        };
        let is_changed = rec.input_hash.as_deref().is_some_and(|h| h != item.hash);
        if is_changed && !config.rerun_changed {
            changed.push(
                Some(item.line),
                InputErrorCode::ChangedInput,
                format!(
                    "custom_id `{}` has a result on output line {} made from a different request (method, url or body changed); use --rerun-changed to run it again, or restore the line",
                    input::printable(&item.custom_id),
                    rec.line
                ),
            );
            continue;
        }
        if is_changed || (rec.failed && config.retry_failed) {
            drop.insert(item.custom_id.clone());
            pending.push(item);
        } else {
            already_done += 1;
        }
    }
    if !changed.is_empty() {
        return Err(BatchError::Input(changed));
    }
    let rerun = drop.len();
    if repair && !drop.is_empty() {
        output::remove_records(path, &drop)?;
    }
    Ok(Resume {
        pending,
        already_done,
        torn_bytes: existing.torn_bytes,
        rerun,
    })
}

/// The run's one scope: its limits, learned limits and budget.
fn scope_config(config: &BatchConfig) -> ScopeConfig {
    let mut scope = ScopeConfig::new(config.scope.clone());
    for l in &config.limits {
        scope = scope.limit(*l);
    }
    if let Some(w) = config.learn_limits {
        scope = scope.learn_limits(w);
    }
    if let Some(budget) = config.budget {
        // The run's budget (SPEC BUD-6): each item reserves its worst case.
        scope = scope.cost(budget, crate::config::BUDGET_WINDOW);
    }
    scope
}

/// The limits `--state-dir` keeps from run to run: the long windows of
/// `--limit`, never the run's `--budget` (a cost limit; it belongs to one
/// run, and a re-run is given what is left for the rest).
fn kept_across_runs(limit: &tollgate::config::Limit) -> bool {
    !limit.dimension.is_cost() && tollgate_state::keep(limit)
}

/// Runs a batch (or, with `dry_run`, plans it).
///
/// `interrupt` resolving (e.g. Ctrl-C) stops the run cleanly: no new item
/// or attempt starts; items not at the provider (not sent yet, or between
/// two attempts) are dropped unrecorded and run again on resume; attempts
/// at the provider finish and are recorded, within [`DRAIN_GRACE`]; the
/// output stays consistent.
///
/// A report (`summary_json`, `plot`) that cannot be written is an error
/// before anything is sent; one that still fails at the end is listed in
/// [`Report::report_errors`], and [`Report::exit_code`] (not the
/// outcome's alone) tells it.
///
/// # Errors
/// Invalid input (nothing is sent), an unusable output file or report
/// path, a configuration the engine refuses, or a provider that cannot be
/// built.
pub async fn run(
    config: BatchConfig,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<Report, BatchError> {
    let started = Instant::now();
    if config.output.is_none() && !config.dry_run {
        return Err(BatchError::Config(
            "an output file is required (-o OUTPUT.jsonl)".to_owned(),
        ));
    }
    if config.concurrency == 0 {
        return Err(BatchError::Config(
            "--concurrency must be at least 1".into(),
        ));
    }
    if config.max_attempts == 0 {
        return Err(BatchError::Config(
            "--max-attempts must be at least 1".into(),
        ));
    }
    // The engine's own check of the limits, before they are used to plan
    // (a zero limit is refused here, not divided by: BATCH-5).
    let scope = scope_config(&config);
    scope
        .validate()
        .map_err(|e| BatchError::Config(e.to_string()))?;
    let (items, spooled) = load(&config)?;
    let items_total = items.len() as u64;
    // A report that could not be written is found before anything is sent,
    // not after every item was paid for (invalid input is told first). A
    // dry run draws no plot.
    let plot = config.plot.as_ref().filter(|_| !config.dry_run);
    for path in [config.summary_json.as_ref(), plot].into_iter().flatten() {
        writable(path)?;
    }
    // One run per output, from before the resume scan to the end (a dry
    // run only reads it).
    let _lock = match (&config.output, config.dry_run) {
        (Some(path), false) => Some(output::OutputLock::take(path)?),
        _ => None,
    };
    let resumed = resume(&config, items, !config.dry_run)?;
    let plan = Plan::of(&resumed.pending, &config.limits, &config.prices);
    if config.budget.is_some() && !plan.unpriced_models.is_empty() {
        // A budget never counts an item as free (SPEC BUD-1).
        return Err(BatchError::Config(format!(
            "--budget needs a price for every item, and these models have none: {}; add them \
             with --prices FILE",
            plan.unpriced_models.join(", ")
        )));
    }

    if config.dry_run {
        let summary = Summary::dry_run(&config, items_total, resumed.already_done, plan);
        let report_errors = summary
            .write_json(config.summary_json.as_deref())
            .err()
            .map(|e| e.to_string())
            .into_iter()
            .collect();
        return Ok(Report {
            summary,
            outcome: Outcome::DryRun,
            report_errors,
        });
    }
    let Some(out_path) = config.output.clone() else {
        return Err(BatchError::Config("an output file is required".into()));
    };
    if resumed.torn_bytes > 0 {
        tracing::warn!(
            bytes = resumed.torn_bytes,
            "cut a torn last line off the output (an item in flight at a crash)"
        );
    }

    // Traces (SPEC OBS-5): off unless an endpoint is configured.
    let telemetry = Telemetry::start(&config.telemetry, "tollgate-batch")
        .map_err(|e| BatchError::Config(e.to_string()))?;

    // The provider: an in-process simulator or an HTTP upstream.
    let (sim, base_url, api_key) = match &config.target {
        Target::Sim(sim_config) => {
            let server = tollgate_sim::Simulator::spawn((**sim_config).clone(), "127.0.0.1:0")
                .await
                .map_err(|e| BatchError::Config(format!("simulator: {e}")))?;
            let url = server.openai_base_url();
            (Some(server), url, None)
        }
        Target::Http { base_url, api_key } => (None, base_url.clone(), api_key.clone()),
    };
    let mut builder = HttpProvider::builder(base_url.clone());
    if let Some(key) = api_key {
        builder = builder.api_key(key);
    }
    let http = builder.build().map_err(BatchError::Provider)?;

    let stats = Arc::new(Stats::default());
    stats
        .pending
        .store(resumed.pending.len() as u64, Ordering::Relaxed);

    // One controller, one scope, one supervisor: the same engine as the
    // gateway, no second limiter (BATCH-2).
    let engine = |e: tollgate::config::ConfigError| BatchError::Config(e.to_string());
    let mut builder = AdmissionController::builder().config(ControllerConfig {
        scopes: vec![scope],
        queue_capacity: usize::try_from(config.concurrency).unwrap_or(usize::MAX),
        concurrency: Some(config.concurrency),
        ..ControllerConfig::default()
    });
    if let Some(shared) = &config.shared {
        let mut settings = RedisSettings::new(shared.url.clone())
            .cluster(shared.cluster)
            .prefix(shared.prefix.clone())
            .timeout(shared.timeout)
            .on_unavailable(shared.on_unavailable);
        if let Some(ca) = &shared.ca_file {
            settings = settings.ca_file(ca);
        }
        let backend =
            RedisBackend::new(settings).map_err(|e| BatchError::Config(format!("--redis: {e}")))?;
        builder = builder.shared_store(Arc::new(backend));
    }
    let controller = builder.build().map_err(engine)?;
    // Long windows kept across runs (SPEC DQ-8): restored before any call.
    let state = match &config.state_dir {
        Some(dir) => {
            let file = tollgate_state::StateFile::open(dir, config.on_unreadable_state)
                .map_err(|e| BatchError::Config(format!("--state-dir: {e}")))?
                .keeping(kept_across_runs);
            file.restore(STATE_OWNER, &controller);
            Some(Arc::new(file))
        }
        None => None,
    };
    let saver = state.as_ref().map(|file| {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(save_every(Arc::clone(file), controller.clone(), stopped));
        (stop, task)
    });
    let policy = AttemptPolicy {
        max_attempts: config.max_attempts,
        ..AttemptPolicy::default()
    };
    let mut sb = Supervisor::builder(
        controller.clone(),
        BatchProvider {
            http,
            stats: Arc::clone(&stats),
            epoch: started,
        },
    )
    .policy(policy)
    .estimator(|r: &BatchRequest| Ok::<TokenEstimate, tollgate::EstimateError>(r.estimate))
    .pricer(|r: &BatchRequest| r.price);
    if let Some(t) = config.attempt_timeout {
        sb = sb.transport_timeout(t);
    }
    let supervisor = sb.build().map_err(engine)?;
    let writer = Arc::new(OutputWriter::open(&out_path, config.fsync)?);

    // The job's one deadline, fixed once at its start (DL-1).
    let job_deadline = match config.deadline {
        Some(d) => Deadline::after(d),
        None => Deadline::NONE,
    };
    let shared = Arc::new(Shared {
        source: InputSource::open(&config.input, spooled, estimator(&config).output_cap())?,
        supervisor: supervisor.clone(),
        flow: config.flow,
        writer: Arc::clone(&writer),
        stats: Arc::clone(&stats),
        job_deadline,
        item_timeout: config.item_timeout,
        abort_on: config.abort_on.clone(),
        stop: CancellationToken::new(),
        reason: AsyncMutex::new(None),
        prices: config.prices.clone(),
        budget: config.budget,
        calling: std::sync::atomic::AtomicU64::new(0),
        settled: tokio::sync::Notify::new(),
        settles: std::sync::atomic::AtomicU64::new(0),
        telemetry: telemetry.clone(),
        base_url,
    });
    let progress = Progress::start(
        config.progress,
        config.progress_interval,
        Arc::clone(&stats),
        resumed.already_done,
        items_total,
    );

    // The dispatcher (ADM-8): a worker slot is taken before the next item
    // is, so at most `concurrency` items are ever in progress and the rest
    // stay plain data, not futures.
    let slots = Arc::new(Semaphore::new(
        usize::try_from(config.concurrency).unwrap_or(usize::MAX >> 4),
    ));
    let mut tasks = JoinSet::new();
    let mut queue = resumed.pending.into_iter();
    let job_end = async {
        match job_deadline.instant() {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(job_end);
    tokio::pin!(interrupt);
    let mut warm_up = true;
    'dispatch: loop {
        while tasks.try_join_next().is_some() {}
        let permit = tokio::select! {
            biased;
            () = shared.stop.cancelled() => break,
            () = &mut interrupt => { shared.stop_with(StopReason::Interrupted).await; break }
            () = &mut job_end => { shared.stop_with(StopReason::Deadline).await; break }
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let Some(item) = queue.next() else { break };
        let worker = Arc::clone(&shared);
        tasks.spawn(async move {
            let _slot = permit;
            worker.process(item).await;
        });
        if warm_up {
            // The first item goes alone: its response's rate-limit headers
            // tell the engine what the provider has already counted (an
            // earlier run, another client: Q-14) before the rest start.
            warm_up = false;
            loop {
                tokio::select! {
                    biased;
                    () = shared.stop.cancelled() => break 'dispatch,
                    () = &mut interrupt => {
                        shared.stop_with(StopReason::Interrupted).await;
                        break 'dispatch
                    }
                    () = &mut job_end => {
                        shared.stop_with(StopReason::Deadline).await;
                        break 'dispatch
                    }
                    next = tasks.join_next() => if next.is_none() { break },
                }
            }
        }
    }
    // Let the items in progress finish unless the run is stopping.
    if !shared.stop.is_cancelled() {
        loop {
            tokio::select! {
                biased;
                () = shared.stop.cancelled() => break,
                () = &mut interrupt => { shared.stop_with(StopReason::Interrupted).await; break }
                () = &mut job_end => { shared.stop_with(StopReason::Deadline).await; break }
                next = tasks.join_next() => if next.is_none() { break },
            }
        }
    }
    // Stopping: items not sent yet return at once, unrecorded; calls
    // already at the provider (paid for) finish and are recorded, within
    // a grace period; after it they are cancelled. A line is written
    // whole or not at all (the write is not an await point).
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    supervisor.close().await;
    progress.finish();
    // The spans of the last items, sent within the export timeout (an
    // unreachable collector drops them, counted).
    let _ = tokio::time::timeout(config.telemetry.export_timeout, telemetry.flush()).await;

    let mut reason = shared.reason.lock().await.take();
    // Lines written to a file that is no longer the output are not
    // results: the run has not completed.
    if reason.is_none()
        && let Err(e) = writer.verify()
    {
        reason = Some(StopReason::Output(e.to_string()));
    }
    let not_run = stats.pending.load(Ordering::Relaxed) - stats.done();
    let outcome = match reason {
        Some(r) => Outcome::Stopped(r),
        None if not_run > 0 => Outcome::Stopped(StopReason::Interrupted),
        None => Outcome::Complete,
    };
    let sim_figures = match sim {
        Some(server) => {
            let s = server.stats();
            let _ = server.shutdown().await;
            Some(SimFigures {
                requests: s.requests_total,
                rejected_429: s.rejected_429.total(),
                tokens_charged: s.tokens_charged,
                max_requests_in_window: s.max_requests_in_window,
                max_tokens_in_window: s.max_tokens_in_window,
            })
        }
        None => None,
    };
    if let (Some((stop, saver)), Some(file)) = (saver, state) {
        // Stopped, not aborted: a save in progress finishes and lets go
        // of the file, so the directory's lock is free when the run
        // returns (a next run in this process opens it at once).
        let _ = stop.send(());
        let _ = saver.await;
        let c = controller.clone();
        match tokio::task::spawn_blocking(move || file.save(&[(STATE_OWNER, &c)])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "quota state not saved"),
            Err(e) => tracing::error!(error = %e, "quota state not saved"),
        }
    }
    let snapshot = controller.snapshot();
    let counters = snapshot
        .scopes
        .first()
        .map(|s| s.counters)
        .unwrap_or_default();
    let summary = Summary::finished(
        &config,
        items_total,
        resumed.already_done,
        resumed.rerun as u64,
        plan,
        &stats,
        &counters,
        started.elapsed(),
        sim_figures,
        &outcome,
    );
    // The results are recorded whatever happens to the reports: each is
    // written on its own, and one that fails is told apart from the run's
    // outcome.
    let mut report_errors = Vec::new();
    if let Err(e) = summary.write_json(config.summary_json.as_deref()) {
        report_errors.push(e.to_string());
    }
    if let Some(path) = &config.plot {
        let drawn = crate::plot::write(path, &stats.starts(), &config.limits, started.elapsed());
        if let Err(e) = drawn {
            report_errors.push(format!("{}: {e}", path.display()));
        }
    }
    Ok(Report {
        summary,
        outcome,
        report_errors,
    })
}

/// Fails unless a report can be written at `path`: a file that exists is
/// opened for writing (not changed), a new one's folder takes a probe file
/// of its own (made and removed).
fn writable(path: &std::path::Path) -> Result<(), BatchError> {
    let io = |source: std::io::Error| BatchError::Io {
        path: path.to_owned(),
        source,
    };
    if path.is_dir() {
        return Err(io(std::io::Error::other("is a directory, not a file")));
    }
    if path.exists() {
        return std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(io);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    // A short name of its own in the report's folder: never the report's,
    // never too long, and another process's probe (a container's PID 1
    // too) is passed over rather than mistaken for a refusal.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0..8_u32 {
        let probe = dir.join(format!(
            ".tollgate-probe-{}-{nanos}-{attempt}",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// The input file, read again for each item's body when a worker takes
/// it (the queue holds only offsets, estimates and hashes); or, for input
/// that cannot be read twice, the spool it was copied to.
struct InputSource {
    file: std::sync::Mutex<std::fs::File>,
    /// The cap a body without one is sent with (see
    /// [`input::request_from_line`]).
    output_cap: Option<u64>,
}

impl InputSource {
    fn open(
        path: &std::path::Path,
        spooled: Option<std::fs::File>,
        output_cap: Option<u64>,
    ) -> Result<Self, BatchError> {
        let file = match spooled {
            Some(file) => file,
            None => std::fs::File::open(path).map_err(|source| BatchError::Io {
                path: path.to_owned(),
                source,
            })?,
        };
        Ok(InputSource {
            file: std::sync::Mutex::new(file),
            output_cap,
        })
    }

    fn request(&self, item: &Item) -> Result<UpstreamRequest, String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut raw = vec![0; item.len];
        {
            let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
            file.seek(SeekFrom::Start(item.offset))
                .and_then(|_| file.read_exact(&mut raw))
                .map_err(|e| format!("reading input line {}: {e}", item.line))?;
        }
        input::request_from_line(item, &raw, self.output_cap)
    }
}

/// What every item task shares.
struct Shared {
    source: InputSource,
    supervisor: Supervisor<BatchProvider>,
    /// The flow every call waits in (SPEC FAIR-7).
    flow: tollgate::Flow,
    writer: Arc<OutputWriter>,
    stats: Arc<Stats>,
    job_deadline: Deadline,
    item_timeout: Option<Duration>,
    abort_on: Vec<ErrorClass>,
    stop: CancellationToken,
    reason: AsyncMutex<Option<StopReason>>,
    /// The items' prices.
    prices: tollgate_openai::prices::PriceTable,
    /// `--budget`, in micro-dollars.
    budget: Option<u64>,
    /// Items whose call is under way (they may hold part of the budget).
    calling: std::sync::atomic::AtomicU64,
    /// Notified whenever an admitted item's call ends (its budget settled).
    settled: tokio::sync::Notify,
    /// How many admitted calls have ended (to tell whether one ended
    /// while another was being refused).
    settles: std::sync::atomic::AtomicU64,
    /// The run's tracer (off unless configured).
    telemetry: Telemetry,
    /// The upstream's base URL (the attempt spans' `server.*`).
    base_url: String,
}

/// An item's call under way, counted in `calling` until it ends; the end
/// of a call that may have held part of the budget wakes the items
/// waiting for room (dropped without [`Calling::end`], as when the run
/// stops, it counts as such an end).
struct Calling<'a> {
    shared: &'a Shared,
    gave_back: bool,
}

impl<'a> Calling<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.calling.fetch_add(1, Ordering::AcqRel);
        Calling {
            shared,
            gave_back: true,
        }
    }

    /// Ends the call; `gave_back`: it was admitted, so its settlement may
    /// have freed part of the budget.
    fn end(mut self, gave_back: bool) {
        self.gave_back = gave_back;
    }
}

impl Drop for Calling<'_> {
    fn drop(&mut self) {
        self.shared.calling.fetch_sub(1, Ordering::AcqRel);
        if self.gave_back {
            self.shared.settles.fetch_add(1, Ordering::AcqRel);
            self.shared.settled.notify_waiters();
        }
    }
}

/// Whether `error` is the run's budget refusing an item (SPEC BUD-6).
fn over_budget(error: &CallError) -> bool {
    match error {
        CallError::Admission(AdmissionError::BudgetExceeded { .. }) => true,
        CallError::Admission(AdmissionError::EstimateExceedsLimit(e)) => {
            e.dimension == Dimension::Cost
        }
        _ => false,
    }
}

impl Shared {
    async fn stop_with(&self, reason: StopReason) {
        let mut r = self.reason.lock().await;
        if r.is_none() {
            *r = Some(reason);
        }
        self.stop.cancel();
    }

    async fn process(&self, item: Item) {
        let now_in_flight = self.stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.stats
            .max_in_flight
            .fetch_max(now_in_flight, Ordering::Relaxed);
        let _in_flight = InFlight(&self.stats);
        // The item's deadline is fixed once, when it is taken (DL-1), and
        // never later than the job's.
        let deadline = match self.item_timeout {
            Some(t) => Deadline::after(t).min(self.job_deadline),
            None => self.job_deadline,
        };
        let upstream = match self.source.request(&item) {
            Ok(r) => r,
            Err(e) => {
                self.stop_with(StopReason::InputChanged(e)).await;
                return;
            }
        };
        // Ends the item's span as `not_recorded` on every early return.
        let mut trace = Unfinished::new(ItemTrace::start(&self.telemetry, &item, &self.base_url));
        let request = BatchRequest {
            upstream,
            estimate: item.estimate,
            price: self.prices.price(&item.model),
            at_provider: Arc::new(AtomicBool::new(false)),
            trace: trace.get(),
        };
        let options = CallOptions {
            id: None,
            deadline,
            idempotent: true,
        };
        let result = loop {
            // Registered before the call, so that an item that settles
            // while this one is being refused is not missed.
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let generation = self.settles.load(Ordering::Acquire);
            let calling = Calling::new(self);
            let call = self
                .supervisor
                .invoke_with_flow(&request, options, self.flow);
            tokio::pin!(call);
            let result = tokio::select! {
                r = &mut call => r,
                () = self.stop.cancelled() => {
                    // Stopping: an attempt at the provider (paid for) is
                    // let finish and its result kept; no new attempt
                    // starts. The flag changes only while `call` is polled
                    // (the attempt runs inside it), so reading it after a
                    // poll that stays pending is exact: the item is not
                    // sent yet, or waits in a backoff or for a retry's
                    // admission. Then it is dropped unrecorded and runs
                    // again on resume.
                    let finished = std::future::poll_fn(|cx| {
                        match call.as_mut().poll(cx) {
                            std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
                            std::task::Poll::Pending
                                if request.at_provider.load(Ordering::Acquire) =>
                            {
                                std::task::Poll::Pending
                            }
                            std::task::Poll::Pending => std::task::Poll::Ready(None),
                        }
                    })
                    .await;
                    match finished {
                        Some(r) => r,
                        None => return,
                    }
                }
            };
            let Err(error) = &result else {
                calling.end(true);
                break result;
            };
            if !over_budget(error) {
                calling.end(true);
                break result;
            }
            // Refused by the budget: it held nothing, so it wakes no one.
            calling.end(false);
            // The budget cannot take this item's worst case now. Items in
            // flight hold theirs until they settle, usually for less: wait
            // for one to end and try again; when none settled since this
            // call began and none is in flight, the budget is spent (SPEC
            // BUD-6).
            if self.settles.load(Ordering::Acquire) != generation {
                continue;
            }
            if self.calling.load(Ordering::Acquire) == 0 {
                self.stop_with(StopReason::Budget {
                    budget: self.budget.unwrap_or(0),
                    custom_id: item.custom_id.clone(),
                })
                .await;
                return;
            }
            tokio::select! {
                () = &mut settled => {}
                () = self.stop.cancelled() => return,
            }
        };
        let (line, recorded, ended) = match result {
            Ok(done) => {
                let body = parse_body(&done.response);
                let reported = done.settlement.and_then(|s| s.reported);
                let line = OutputLine {
                    id: result_id(&item.custom_id),
                    custom_id: item.custom_id.clone(),
                    response: Some(ResponseRecord {
                        status_code: 200,
                        request_id: done.request_id.clone(),
                        body,
                    }),
                    error: None,
                    tollgate: Some(Meta {
                        input_hash: item.hash.clone(),
                        attempts: done.attempts,
                    }),
                };
                let ended = Ended {
                    status: Some(200),
                    attempts: done.attempts,
                    admission: Some(done.admission),
                    cost: request.price.and(done.settlement.map(|s| s.cost.charged())),
                    error: None,
                };
                (
                    line,
                    Recorded::Succeeded(done.admission.quota_wait, reported),
                    ended,
                )
            }
            Err(CallError::Admission(AdmissionError::EstimateExceedsLimit(e))) => {
                // The input was checked against every configured limit
                // before the run (`load`): this one was learned from the
                // provider and confirmed. No item of this size can ever
                // go: stop, unrecorded, rather than fail each of them.
                self.stop_with(StopReason::ExceedsLearnedLimit {
                    custom_id: item.custom_id.clone(),
                    message: e.to_string(),
                })
                .await;
                return;
            }
            Err(error) => {
                let Some(failure) = self.classify(&error, deadline == self.job_deadline).await
                else {
                    return;
                };
                let line = OutputLine {
                    id: result_id(&item.custom_id),
                    custom_id: item.custom_id.clone(),
                    response: failure.status.map(|status_code| ResponseRecord {
                        status_code,
                        request_id: None,
                        body: json!({"error": {
                            "message": failure.message,
                            "type": failure.class.as_str(),
                            "code": Value::Null,
                        }}),
                    }),
                    error: Some(ErrorRecord {
                        code: failure.class.as_str().to_owned(),
                        message: failure.message.clone(),
                    }),
                    tollgate: Some(Meta {
                        input_hash: item.hash.clone(),
                        attempts: failure.attempts,
                    }),
                };
                let ended = Ended {
                    status: failure.status,
                    attempts: failure.attempts,
                    admission: None,
                    cost: None,
                    error: Some(failure.class.as_str()),
                };
                (line, Recorded::Failed(failure.class), ended)
            }
        };
        if let Err(e) = self.writer.append(&line) {
            // The line is not in the file (a failed append is cut back off
            // and the writer takes no more): the item runs again on resume,
            // and the first failure is the run's reason to stop.
            self.stop_with(StopReason::Output(e.to_string())).await;
            return;
        }
        match recorded {
            Recorded::Succeeded(wait, reported) => self.stats.succeeded(wait, reported),
            Recorded::Failed(class) => self.stats.failed(class),
        }
        if let Some(t) = trace.take() {
            t.finish(CallEnd {
                status: ended.status,
                attempts: ended.attempts,
                queue: ended.admission.map(|a| a.total_wait()),
                class: Some(self.flow.priority().as_str()),
                limited_by: ended.admission.map(|a| a.limited_by.as_str()),
                admission: ended.admission.as_ref(),
                tokens_estimated: Some(item.estimate.total()),
                cost: ended.cost,
                error: ended.error,
                ..CallEnd::default()
            });
        }
        if let Some(err) = &line.error
            && let Some(class) = self.abort_on.iter().find(|c| c.as_str() == err.code)
        {
            self.stop_with(StopReason::AbortOn {
                class: *class,
                custom_id: item.custom_id,
            })
            .await;
        }
    }

    /// The recorded failure for `error`, or `None` when the item is not the
    /// one at fault and stays unrecorded (it runs again on resume).
    /// `job_bound`: the item's deadline is the job's (`--deadline` comes
    /// before `--item-timeout` would).
    async fn classify(&self, error: &CallError, job_bound: bool) -> Option<Failure> {
        let now = Instant::now();
        let simple = |class: ErrorClass, attempts: u32| Failure {
            class,
            status: None,
            message: error.to_string(),
            attempts,
        };
        match error {
            CallError::Provider {
                error: e, attempts, ..
            } => {
                let class = match e.kind {
                    ErrorKind::Auth => ErrorClass::Authentication,
                    ErrorKind::Client => ErrorClass::InvalidRequest,
                    ErrorKind::RateLimited => ErrorClass::RateLimited,
                    ErrorKind::Server => ErrorClass::Server,
                    ErrorKind::Timeout => ErrorClass::Timeout,
                    ErrorKind::Connect => ErrorClass::Connection,
                    _ => ErrorClass::Protocol,
                };
                Some(Failure {
                    class,
                    status: e.status,
                    message: e.message.clone(),
                    attempts: *attempts,
                })
            }
            CallError::Stream { .. } => Some(simple(ErrorClass::Protocol, 1)),
            CallError::Admission(AdmissionError::QuotaStoreUnavailable { .. }) => {
                // Not the item's fault: every item would meet the same
                // store. Stop; a re-run resumes (SPEC DQ-3).
                self.stop_with(StopReason::QuotaStoreUnavailable).await;
                None
            }
            CallError::Admission(_) | CallError::Hook { .. } => {
                Some(simple(ErrorClass::Configuration, 0))
            }
            CallError::CircuitOpen(_) => Some(simple(ErrorClass::Connection, 0)),
            CallError::Deadline { phase, .. } => {
                if job_bound || self.job_deadline.is_expired(now) {
                    // The run's deadline passed, or (an early verdict) will
                    // pass before this item can be admitted.
                    self.stop_with(StopReason::Deadline).await;
                    return None;
                }
                if matches!(
                    phase,
                    Phase::Queue | Phase::Cooldown | Phase::Rate | Phase::Concurrency
                ) {
                    // Waiting for quota is not the item's fault: every item
                    // behind it in the FIFO would wait as long.
                    self.stop_with(StopReason::QuotaWait { phase: *phase })
                        .await;
                    return None;
                }
                Some(simple(ErrorClass::Deadline, 0))
            }
            CallError::Closed => None,
            _ => Some(simple(ErrorClass::Configuration, 0)),
        }
    }
}

/// What an item's line, once written, adds to the counters.
enum Recorded {
    Succeeded(Duration, Option<u64>),
    Failed(ErrorClass),
}

/// What an item's span says of its recorded line.
struct Ended {
    status: Option<u16>,
    attempts: u32,
    admission: Option<tollgate::Admission>,
    cost: Option<u64>,
    error: Option<&'static str>,
}

struct Failure {
    class: ErrorClass,
    status: Option<u16>,
    message: String,
    attempts: u32,
}

struct InFlight<'a>(&'a Stats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The response body as JSON (a body that is not JSON is kept as a
/// string).
fn parse_body(body: &Bytes) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// `batch_req_` and 24 hex digits of the `custom_id`'s SHA-256: stable
/// across resumes.
fn result_id(custom_id: &str) -> String {
    let digest = Sha256::digest(custom_id.as_bytes());
    let mut id = String::from("batch_req_");
    for b in digest.iter().take(12) {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// The limits of a run as text, e.g. `requests 500/1m`.
pub(crate) fn describe(limit: &Limit) -> String {
    format!(
        "{} {}/{}",
        limit.dimension.as_str(),
        limit.amount,
        limit.window_label()
    )
}

/// The owner of the batch runner's scope in the state file.
const STATE_OWNER: &str = "batch";

/// How often changed counts are written (what a crash can lose; the
/// gateway's `state_save_interval` default).
const STATE_SAVE_INTERVAL: Duration = Duration::from_millis(200);

/// Saves the scope's long windows every [`STATE_SAVE_INTERVAL`] until
/// `stop` (SPEC DQ-8), ending between two saves; a failed save is logged
/// and retried.
async fn save_every(
    file: Arc<tollgate_state::StateFile>,
    controller: AdmissionController,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut ticks = tokio::time::interval(STATE_SAVE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let (f, c) = (Arc::clone(&file), controller.clone());
        match tokio::task::spawn_blocking(move || f.save(&[(STATE_OWNER, &c)])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "quota state not saved; retrying"),
            Err(e) => tracing::error!(error = %e, "quota state saver failed; retrying"),
        }
    }
}
