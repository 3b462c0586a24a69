//! A reference relay or notifier as an OS process of its own
//! (`[run] components = "process"`): the hidden `chaos component`
//! subcommand. The line protocol it speaks to the harness on stdout is
//! [`crate::nemesis::process::protocol`].
//!
//! The harness starts each instance as `chaos component` with the
//! contract's environment (docs/contract.md) plus the validated scenario.
//! The process runs the same relay or notifier code as in-process mode.
//! What differs is who ends it at a crash point: the component stops there
//! and says where it is ([`FaultInjector::halt`]), and the harness sends
//! SIGKILL, so the kernel ends it with its transaction open and its
//! consumer in the group. A stall is the harness's SIGSTOP, then SIGCONT
//! ([`FaultInjector::stall`]).
//!
//! Everything the harness counts crosses on stdout, one JSON line each
//! after [`PREFIX`]: the fault firings, their confirmations, the events a
//! relay crash awaits on the topic, and every 200 ms a snapshot of the
//! component's counters and of the fault points it reached. Logs go to
//! stderr.

use crate::context::{shutdown_pair, Coordination, Ctx, Stats};
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::faults::{FaultInjector, FaultPoint, FaultRecord, HarnessLink};
use crate::scenario::Scenario;
use crate::store::{postgres::PgStore, sqlite::SqliteStore, Store};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::nemesis::process::protocol::{snapshot, Line, EMBEDDED_ENV, PREFIX, SCENARIO_ENV, SQLITE_ENV};

/// How often a component reports its counters.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);

/// The injector's line to the harness: protocol lines on stdout. It holds
/// the component's counters for the snapshot sent before a halt.
struct Stdout {
    stats: Arc<Stats>,
    coord: Coordination,
}

/// Writes one protocol line on stdout.
fn emit(line: &Line) {
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        // A harness that went away leaves nobody to tell.
        let _ = writeln!(out, "{PREFIX}{text}");
        let _ = out.flush();
    }
}

impl HarnessLink for Stdout {
    fn fired(&self, record: &FaultRecord) {
        emit(&Line::Fired { record: record.clone() });
    }
    fn confirmed(&self, point: FaultPoint, n: u64) {
        emit(&Line::Confirmed { point, n });
    }
    fn copies(&self, point: FaultPoint, event: uuid::Uuid, copies: u8) {
        emit(&Line::Copies { point, event, copies });
    }
    fn delivered(&self, component: &str, messages: u32, spans: Vec<crate::broker::Stretch>) {
        emit(&Line::Delivered { component: component.to_string(), messages, spans });
    }
    fn awaits_delivery(&self, point: FaultPoint, first: crate::broker::Position) {
        emit(&Line::AwaitsDelivery { point, at: first });
    }
    fn halt(&self, injector: &FaultInjector, point: FaultPoint, fires: u64) {
        // The last figures first: the harness kills at once.
        emit(&Line::Snapshot { snapshot: snapshot(&self.stats, &self.coord, injector) });
        emit(&Line::Halt { point, fires });
    }
    fn stall(&self, point: FaultPoint, d: Duration) {
        emit(&Line::Stall { point, ms: d.as_millis() as u64 });
    }
}

fn var(key: &str) -> Result<String> {
    std::env::var(key).map_err(|_| {
        Error::Usage(format!(
            "{key} is not set: `chaos component` is started by `chaos run` with components = \"process\""
        ))
    })
}

/// How long a component process keeps trying to open its first database
/// session before it gives up: longer than a `db.restart` or a
/// `net.blackhole` takes.
const FIRST_SESSION_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The component's store, its first session retried: a process started
/// while PostgreSQL restarts, or whose connection the fault proxy resets
/// during the handshake, waits for the database as an in-process
/// component's pool does, instead of exiting (which the keeper would take
/// for the program's failure).
async fn attach_retrying(url: &str, schema: &str) -> Result<PgStore> {
    let started = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        match PgStore::attach(url, schema, 4).await {
            Err(Error::DatabaseUnreachable { cause, .. }) if started.elapsed() < FIRST_SESSION_WITHIN => {
                tracing::info!(%cause, "the database did not answer; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// `chaos component`: runs one relay or notifier instance until SIGTERM.
pub async fn serve() -> Result<()> {
    let role = var("CHAOS_ROLE")?;
    let instance = var("CHAOS_INSTANCE")?;
    let slot: usize = instance.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(1);
    let incarnation: u64 = var("CHAOS_INCARNATION")?.parse().unwrap_or(0);
    let sc: Scenario = serde_json::from_str(&var(SCENARIO_ENV)?)
        .map_err(|e| Error::Usage(format!("{SCENARIO_ENV} is not a scenario: {e}")))?;
    let names = RunNames::from_id(&var("CHAOS_RUN_ID")?);
    let store = match std::env::var(SQLITE_ENV) {
        Ok(path) => Store::Sqlite(SqliteStore::open(std::path::Path::new(&path), 4).await?),
        Err(_) => Store::Postgres(attach_retrying(&var("CHAOS_DATABASE_URL")?, &names.schema).await?),
    };
    // Each incarnation its own decisions: the same seed would make a
    // restarted process crash where its predecessor did, again and again.
    let salt = (role == "relay") as u64 * 1_000_003 + slot as u64 * 7919 + incarnation * 104_729;
    let faults = Arc::new(FaultInjector::new(sc.seed.wrapping_add(salt), &sc.faults));
    let stats = Arc::new(Stats::default());
    let coord = Coordination::default();
    let (trigger, shutdown) = shutdown_pair();
    let ctx = Ctx {
        scenario: Arc::new(sc),
        store: store.gated(crate::store::CommitGate::new(faults.clone(), &instance, Some(stats.on_writer_hold()))),
        faults: faults.clone(),
        stats: stats.clone(),
        coord: coord.clone(),
        shutdown,
        broker: crate::broker::attach(
            &var("CHAOS_BROKERS")?,
            std::env::var(EMBEDDED_ENV).as_deref() == Ok("1"),
            crate::broker::Attacher::Component,
        ),
        names,
        intent: Default::default(),
        tasks: Default::default(),
        email: match std::env::var(crate::provider::client::PROVIDER_ENV) {
            Ok(url) => Some(Arc::new(crate::harness::emails::client(&url)?)),
            Err(_) => None,
        },
    };
    faults.link_to_harness(Arc::new(Stdout { stats: stats.clone(), coord: coord.clone() }));
    let reporter = tokio::spawn(report_every(stats.clone(), coord.clone(), faults.clone()));
    let mut task = match role.as_str() {
        "relay" => tokio::spawn(crate::pipeline::relay::run(ctx.clone(), slot)),
        "notifier" => tokio::spawn(crate::pipeline::notifier::run(ctx.clone(), slot)),
        other => return Err(Error::Usage(format!("CHAOS_ROLE is {other:?}; expected \"relay\" or \"notifier\""))),
    };
    tokio::select! {
        _ = &mut task => {}
        _ = crate::harness::interrupt::requested() => {
            trigger.trigger();
            let _ = tokio::time::timeout(Duration::from_secs(8), &mut task).await;
        }
    }
    reporter.abort();
    emit(&Line::Snapshot { snapshot: snapshot(&stats, &coord, &faults) });
    store.close().await;
    Ok(())
}

async fn report_every(stats: Arc<Stats>, coord: Coordination, faults: Arc<FaultInjector>) {
    loop {
        tokio::time::sleep(SNAPSHOT_EVERY).await;
        emit(&Line::Snapshot { snapshot: snapshot(&stats, &coord, &faults) });
    }
}
