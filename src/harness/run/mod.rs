//! One run, start to finish: resolve the infrastructure, create the run's
//! schema and topic, start relays, notifiers and the retention purger, drive
//! the workload, wait for the pipeline to drain, verify, report.

mod declared;
mod drive;
mod history;
mod infra;
mod phases;
mod reference;
mod series;
mod system;
pub use system::shown_of_saved;

use crate::context::{Named, ShutdownTrigger};
use crate::error::{Error, Result};
use crate::faults::FaultPoint;
use crate::nemesis::acting::Acting;
use crate::nemesis::proxy::Lanes;
use crate::report::progress::{Phase, Progress};
use crate::report::{assemble, Report, Timings};
use crate::scenario::Components;
use crate::scenario::{self, Scenario};
use drive::{Ran, Stopped};
use infra::Infra;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use system::SystemUnderTest;
use tracing::{info, warn};

/// What `chaos run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub scenario: PathBuf,
    pub seed: Option<u64>,
    pub database_url: Option<String>,
    pub brokers: Option<String>,
    pub reports_dir: PathBuf,
    /// Overrides the scenario's `[run] components`.
    pub components: Option<Components>,
    /// Overrides the scenario's `workload.payments`.
    pub payments: Option<u64>,
    /// Overrides `[faults]` probabilities, in order.
    pub faults: Vec<(FaultPoint, f64)>,
    /// Pins the firings by occurrence.
    pub schedule: Option<crate::faults::Schedule>,
    /// Keep a passing embedded run's SQLite file.
    pub keep: bool,
}

impl RunOptions {
    /// Loads the scenario file and applies the command line's changes, each
    /// checked as the file's keys are. A file whose aimed rates may count
    /// windows is warned of here, once for a run or a sweep's seeds.
    pub fn scenario(&self) -> Result<Scenario> {
        let mut sc = scenario::load(&self.scenario)?;
        if let Some(seed) = self.seed {
            sc = sc.with_seed(seed);
        }
        if let Some(c) = self.components {
            sc = sc.with_components(c);
        }
        if let Some(n) = self.payments {
            sc = sc.with_payments(n)?;
        }
        for (p, rate) in &self.faults {
            sc = sc.with_rate(*p, *rate)?;
        }
        if let Some(s) = &self.schedule {
            sc = sc.with_schedule(s.clone())?;
        }
        if let Some(w) = sc.aimed_warning() {
            warn!("{w}");
        }
        Ok(sc)
    }
}

/// What a run tells whoever shows it, in order: the library computes and
/// emits these; a [`Reporter`] (the binary's choice, see `commands/`) turns
/// them into tables, JSON, or nothing.
pub enum Event<'a> {
    /// The infrastructure is open; the components start next.
    Started { run_id: &'a str, scenario: &'a str, seed: u64, infra: &'a str },
    /// The run ended and its report was saved at `json`, `md` and `html`.
    Finished { report: &'a Report, json: &'a Path, md: &'a Path, html: &'a Path },
}

/// Consumes a run's events.
pub trait Reporter: Send + Sync {
    fn event(&self, event: &Event<'_>) -> Result<()>;

    /// Whether the live progress line is drawn on stderr meanwhile.
    fn shows_progress(&self) -> bool {
        true
    }
}

/// Shows nothing: a run inside the selftest or the bench, which print
/// their own tables.
pub struct Quiet;

impl Reporter for Quiet {
    fn event(&self, _: &Event<'_>) -> Result<()> {
        Ok(())
    }

    fn shows_progress(&self) -> bool {
        false
    }
}

/// Runs a scenario file end to end and returns its report.
pub async fn run(opts: RunOptions, reporter: &dyn Reporter) -> Result<Report> {
    let sc = opts.scenario()?;
    let (db, brokers) = (opts.database_url.clone(), opts.brokers.clone());
    execute_keeping(sc, db, brokers, &opts.reports_dir, reporter, opts.keep).await
}

/// Runs a validated scenario end to end: open the infrastructure, start
/// the components, drive the workload and the drain, stop, verify, report.
/// A passing embedded run's SQLite file is removed.
pub async fn execute(
    sc: Scenario,
    database_url: Option<String>,
    brokers: Option<String>,
    reports_dir: &std::path::Path,
    reporter: &dyn Reporter,
) -> Result<Report> {
    execute_keeping(sc, database_url, brokers, reports_dir, reporter, false).await
}

/// [`execute`], keeping a passing embedded run's SQLite file when `keep`.
/// The one skeleton of every run, whichever the system under test:
/// infrastructure → system → workload under the nemesis → drain → stop →
/// checkers → report.
async fn execute_keeping(
    sc: Scenario,
    database_url: Option<String>,
    brokers: Option<String>,
    reports_dir: &std::path::Path,
    reporter: &dyn Reporter,
    keep: bool,
) -> Result<Report> {
    let started = Instant::now();
    let endpoints = infra::endpoints(&sc, database_url, brokers)?;
    let names = SystemUnderTest::names(&sc);
    let (mut sut, mut infra) = SystemUnderTest::open(&sc, &endpoints, &names, reports_dir).await?;
    let sc = Arc::new(sc);
    let (trigger, mut ctx) = infra::context(&sc, &infra, &names);
    // The email provider stands before the components, which get its URL.
    let provider = crate::harness::emails::start(&sc, &ctx.faults).await?;
    if let Some(p) = &provider {
        ctx.email = Some(Arc::new(crate::harness::emails::client(&p.base_url())?));
    }
    // The proxy's and the timeline's faults strike from the workload's
    // start until the drain ends.
    let acting = Acting::default();
    let lanes = match (&endpoints.database_url, sc.proxied()) {
        (Some(url), true) => Some(Lanes::start(&ctx, url, acting.subscribe()).await?),
        _ => None,
    };
    let infra_line = banner(&mut infra, &names, lanes.as_ref());
    reporter.event(&Event::Started { run_id: &names.run_id, scenario: &sc.name, seed: sc.seed, infra: &infra_line })?;
    info!(run_id = %names.run_id, seed = sc.seed, "starting");
    let (latest, follows) = tokio::sync::watch::channel(None);
    let total = (sut.operations(&sc), sut.unit());
    let progress = Progress::start(total, ctx.stats.clone(), ctx.faults.clone(), follows, reporter.shows_progress());
    infra.broker.create_topic(&sc.topic(&names.topic)).await?;
    let setup_ms = started.elapsed().as_millis() as u64;

    let mut components = match sut.start(&ctx, &endpoints, reports_dir, lanes.as_ref()).await {
        Ok(c) => c,
        Err(e) => return Err(abandon(trigger, Vec::new(), infra, e).await),
    };
    let slots = lanes.as_ref().map(|l| l.slots()).unwrap_or_default();
    components.extend(crate::nemesis::timeline::start(&ctx, acting.watch(), slots));
    let (series, stop_series) = series::sample(ctx.stats.clone(), sut.from_broker(&ctx), latest);
    let mut driven = match phases::drive(&ctx, &sut, &acting, &progress).await {
        Ok(driven) => driven,
        Err(e) => return Err(abandon(trigger, components, infra, e).await),
    };
    trigger.trigger();
    components.extend(ctx.tasks.take());
    let stopped = tokio::select! {
        s = drive::stop(components) => s,
        _ = crate::harness::interrupt::requested(), if !driven.ran.interrupted => { driven.ran.interrupted = true; Stopped::default() }
    };
    let _ = stop_series.send(());
    let series = series.await.unwrap_or_default();
    if let Some(l) = lanes {
        l.close();
    }
    // Every component has stopped: the provider's record is final.
    // The provider itself goes with it: its table of idempotency keys (a
    // million keys take about 80 MB) is no use to the verifier.
    let emails = match provider {
        Some(p) => Some(p.stop_and_take_record().await),
        None => None,
    };
    why_incomplete(&mut driven.ran, sut.failure(), &stopped);

    let history = sut.history(&ctx, emails, !stopped.stuck.is_empty());
    let log: Vec<_> = history.faults.log.iter().take(assemble::REPORT_FAULT_LOG).cloned().collect();
    let t_verify = Instant::now();
    progress.phase(Phase::Verify);
    crate::context::memory::hand_back_before_judging(!driven.ran.interrupted && driven.ran.incomplete.is_none());
    let judged = phases::judge(&ctx, &sut, &mut driven, history).await;
    progress.finish();
    // Built once, from the history and what the judge found.
    let mut rep = assemble::build(&sc, &names, &infra.info, &log, &ctx.stats, judged);
    rep.series = series;
    rep.timings = timings(setup_ms, &driven.ran, t_verify, started);
    sut.shape(&mut rep);
    finish(rep, infra, reports_dir, reporter, keep).await
}

/// The run's timings: setup, workload, drain and settle, the verification
/// (from `t_verify`) and the whole (from `started`).
fn timings(setup_ms: u64, ran: &Ran, t_verify: Instant, started: Instant) -> Timings {
    Timings {
        setup_ms,
        workload_ms: ran.workload_ms,
        drain_ms: ran.drain_ms,
        settle_ms: ran.settle.map(|s| s.ms),
        verify_ms: t_verify.elapsed().as_millis() as u64,
        total_ms: started.elapsed().as_millis() as u64,
    }
}

/// The banner's infra line, the fault proxy's lanes included (and noted
/// in the report's infra).
fn banner(infra: &mut Infra, names: &crate::domain::names::RunNames, lanes: Option<&Lanes>) -> String {
    let line = infra.describe(names);
    match lanes {
        Some(l) => {
            infra.info.proxy = Some(l.describe());
            format!("{line} · {}", l.describe())
        }
        None => line,
    }
}

/// A run that could not go on: its components stopped, its infrastructure
/// closed, and the error it ends with.
async fn abandon(trigger: ShutdownTrigger, components: Vec<Named>, infra: Infra, e: Error) -> Error {
    trigger.trigger();
    let _ = drive::stop(components).await;
    infra.close().await;
    e
}

/// Closes the infrastructure, saves the report and tells the reporter.
/// The report holds what the run found: a passing run's SQLite file
/// (about 1 MB) is only clutter in the reports folder. A run that did not
/// pass keeps it, to be looked into beside its report.
async fn finish(rep: Report, infra: Infra, reports_dir: &Path, reporter: &dyn Reporter, keep: bool) -> Result<Report> {
    let sqlite = match &infra.store {
        crate::store::Store::Sqlite(s) => Some(PathBuf::from(&s.endpoint)),
        crate::store::Store::Postgres(_) => None,
    };
    infra.close().await;
    let saved = rep.save(reports_dir)?;
    let passed = matches!(rep.verdict, crate::verifier::Verdict::Pass | crate::verifier::Verdict::Inconclusive);
    if let (Some(db), true) = (sqlite, passed && !keep) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
    }
    reporter.event(&Event::Finished { report: &rep, json: &saved.json, md: &saved.md, html: &saved.html })?;
    Ok(rep)
}

/// Adds to the run's reason for being incomplete a program under test that
/// failed and components that panicked or did not stop.
fn why_incomplete(ran: &mut Ran, program_failed: Option<String>, stopped: &Stopped) {
    if let (None, Some(why)) = (&ran.incomplete, program_failed) {
        ran.incomplete = Some(why);
    }
    if let Some(why) = stopped.why() {
        warn!("{why}");
        ran.incomplete = Some(match ran.incomplete.take() {
            Some(before) => format!("{before}; {why}"),
            None => why,
        });
    }
}
