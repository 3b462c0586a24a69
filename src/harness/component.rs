//! A reference relay or notifier as an OS process of its own
//! (`[run] components = "process"`): the hidden `chaos component`
//! subcommand, and the line protocol it speaks to the harness on stdout.
//!
//! The harness starts each instance as `chaos component` with the
//! contract's environment (docs/contract.md) plus the validated scenario.
//! The process runs the same relay or notifier code as in-process mode.
//! What differs is who ends it at a crash point: the component stops there
//! and says where it is ([`halt`]), and the harness sends SIGKILL, so the
//! kernel ends it with its transaction open and its consumer in the group.
//! A stall is the harness's SIGSTOP, then SIGCONT ([`stall`]).
//!
//! Everything the harness counts crosses on stdout, one JSON line each
//! after [`PREFIX`]: the fault firings, their confirmations, the events a
//! relay crash awaits on the topic, and every 200 ms a snapshot of the
//! component's counters and of the fault points it reached. Logs go to
//! stderr.

use crate::broker::kafka::Kafka;
use crate::pipeline::context::{shutdown_pair, Ctx, Stats};
use crate::error::{Error, Result};
use crate::exit::Exit;
use crate::faults::{FaultInjector, FaultPoint, FaultRecord};
use crate::harness::infra::RunNames;
use crate::scenario::Scenario;
use crate::store::{postgres::PgStore, sqlite::SqliteStore, Store};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What starts every protocol line on a component's stdout.
pub const PREFIX: &str = "chaos-component ";

/// The environment variable that carries the validated scenario, as JSON.
pub const SCENARIO_ENV: &str = "CHAOS_SCENARIO_JSON";
/// Set to the SQLite file in the embedded mode (then no database URL).
pub const SQLITE_ENV: &str = "CHAOS_SQLITE_PATH";
/// "1" when the broker is the embedded mock cluster.
pub const EMBEDDED_ENV: &str = "CHAOS_EMBEDDED";

/// How often a component reports its counters.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);
/// How long a stalled component waits for the harness's SIGSTOP to land
/// before it goes on (it goes on, late, once SIGCONT comes).
const STALL_HANDOFF: Duration = Duration::from_millis(100);

/// One line of the protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Fired {
        record: FaultRecord,
    },
    Confirmed {
        point: FaultPoint,
        n: u64,
    },
    Copies {
        point: FaultPoint,
        event: uuid::Uuid,
        copies: u8,
    },
    /// Stopped at a crash point: kill me. `fires`: the firings this one
    /// crash stands for (several events of one batch may fire).
    Halt {
        point: FaultPoint,
        fires: u64,
    },
    /// At a stall point: stop me for `ms`.
    Stall {
        point: FaultPoint,
        ms: u64,
    },
    Snapshot {
        snapshot: Snapshot,
    },
    /// A notifier received a batch: its size and, per partition, its first
    /// and last offset (the anomalies' stories show each delivery).
    Delivered {
        component: String,
        messages: u32,
        spans: Vec<(i32, i64, i64)>,
    },
}

/// A component's cumulative figures since it started.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// In the order of [`counters`].
    pub counters: Vec<u64>,
    /// Occurrences per fault point, in `FaultPoint::ALL` order.
    pub reached: Vec<u64>,
    /// First and last publish, first and last apply, as Unix milliseconds
    /// (0: none yet).
    pub marks_unix_ms: [u64; 4],
    /// The partitions a notifier holds after its latest rebalance: the
    /// run's group wait reads them (the mock cluster cannot list groups).
    #[serde(default)]
    pub assigned: Option<usize>,
}

/// The counters a component process reports, in a fixed order.
pub fn counters(s: &Stats) -> [&AtomicU64; 10] {
    [
        &s.messages_published,
        &s.relay_batches,
        &s.relay_crashes,
        &s.relay_errors,
        &s.events_applied,
        &s.duplicates_absorbed,
        &s.stale_ignored,
        &s.dead_lettered,
        &s.notifier_crashes,
        &s.notifier_errors,
    ]
}

/// The stage marks, in the order of `Snapshot::marks_unix_ms`.
pub fn marks(s: &Stats) -> [(&AtomicU64, bool); 4] {
    // (mark, is a "first" mark)
    [(&s.first_publish_ms, true), (&s.last_publish_ms, false), (&s.first_apply_ms, true), (&s.last_apply_ms, false)]
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The component's counters and injector, for the snapshot sent before a halt.
static FIGURES: std::sync::OnceLock<(Arc<Stats>, Arc<FaultInjector>)> = std::sync::OnceLock::new();

/// True inside a `chaos component` process.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Writes one protocol line; only inside a component process.
pub fn emit(line: &Line) {
    if !active() {
        return;
    }
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        // A harness that went away leaves nobody to tell.
        let _ = writeln!(out, "{PREFIX}{text}");
        let _ = out.flush();
    }
}

/// At a crash point: in a component process, say so and stop here until
/// the harness's SIGKILL; in process, return at once (the caller crashes
/// in place).
pub async fn halt(point: FaultPoint) {
    halt_for(point, 1).await
}

/// [`halt`] for a crash that `fires` firings of `point` decided.
pub async fn halt_for(point: FaultPoint, fires: u64) {
    if active() {
        // The last figures first: the harness kills at once.
        if let Some((s, f)) = FIGURES.get() {
            emit(&Line::Snapshot { snapshot: snapshot(s, f) });
        }
        emit(&Line::Halt { point, fires });
        std::future::pending::<()>().await;
    }
}

/// At a stall point: in a component process, ask the harness to stop this
/// process for `d` and return true once it is running again; in process,
/// return false (the caller stalls in place).
pub async fn stall(point: FaultPoint, d: Duration) -> bool {
    if !active() {
        return false;
    }
    emit(&Line::Stall { point, ms: d.as_millis() as u64 });
    tokio::time::sleep(STALL_HANDOFF).await;
    true
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
pub async fn serve() -> Result<Exit> {
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
    let (trigger, shutdown) = shutdown_pair();
    let ctx = Ctx {
        scenario: Arc::new(sc),
        store: store.clone(),
        faults: faults.clone(),
        stats: stats.clone(),
        shutdown,
        broker: Arc::new(Kafka::for_component(
            &var("CHAOS_BROKERS")?,
            std::env::var(EMBEDDED_ENV).as_deref() == Ok("1"),
        )),
        names,
        intent: Default::default(),
        tasks: Default::default(),
    };
    let _ = FIGURES.set((stats.clone(), faults.clone()));
    ACTIVE.store(true, Ordering::Relaxed);
    let reporter = tokio::spawn(report_every(stats.clone(), faults.clone()));
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
    emit(&Line::Snapshot { snapshot: snapshot(&stats, &faults) });
    store.close().await;
    Ok(Exit::Pass)
}

async fn report_every(stats: Arc<Stats>, faults: Arc<FaultInjector>) {
    loop {
        tokio::time::sleep(SNAPSHOT_EVERY).await;
        emit(&Line::Snapshot { snapshot: snapshot(&stats, &faults) });
    }
}

fn snapshot(stats: &Stats, faults: &FaultInjector) -> Snapshot {
    let origin = stats.origin_unix_ms;
    let marks = marks(stats).map(|(m, first)| match Stats::get(m) {
        u64::MAX => 0,
        0 if !first => 0,
        v => origin + v,
    });
    Snapshot {
        counters: counters(stats).iter().map(|c| Stats::get(c)).collect(),
        reached: FaultPoint::ALL.iter().map(|p| faults.reached(*p)).collect(),
        marks_unix_ms: marks,
        assigned: stats.assigned.lock().ok().and_then(|a| a.values().next().copied()),
    }
}

/// The harness's side: folds one component's snapshots into the run's
/// counters, adding what changed since the last one.
#[derive(Default)]
pub struct Fold {
    last: Snapshot,
}

impl Fold {
    /// `slot`: the component's instance number, under which its
    /// assignment is kept.
    pub fn apply(&mut self, s: Snapshot, slot: usize, stats: &Stats, faults: &FaultInjector) {
        if let Some(n) = s.assigned {
            stats.set_assigned(slot, n);
        }
        for (i, c) in counters(stats).iter().enumerate() {
            let (now, before) =
                (s.counters.get(i).copied().unwrap_or(0), self.last.counters.get(i).copied().unwrap_or(0));
            Stats::add(c, now.saturating_sub(before));
        }
        for (i, p) in FaultPoint::ALL.iter().enumerate() {
            let (now, before) =
                (s.reached.get(i).copied().unwrap_or(0), self.last.reached.get(i).copied().unwrap_or(0));
            faults.add_reached(*p, now.saturating_sub(before));
        }
        for (i, (m, first)) in marks(stats).iter().enumerate() {
            let unix = s.marks_unix_ms[i];
            if unix == 0 || unix < stats.origin_unix_ms {
                continue;
            }
            let rel = unix - stats.origin_unix_ms;
            if *first {
                m.fetch_min(rel, Ordering::Relaxed);
            } else {
                m.fetch_max(rel, Ordering::Relaxed);
            }
        }
        self.last = s;
    }
}
