//! What every component of one run shares: live counters, the shutdown
//! signal, the restart floor and the tasks they spawn. Components write the
//! counters; the progress line and the report read them. The run's group
//! wait and drain watch [`Coordination`]: the group's assignments and the
//! zombies still active.

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

/// Declares the components' counters once: [`Counters`] holds them live,
/// [`Counts`] holds them at one moment (the report's component figures,
/// and what a component process sends the harness), both with the same
/// names, so a new counter is one line here.
macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// The components' live counters. They feed the progress line, the
        /// report's component figures and the benchmark's stage rates; the
        /// verdict never rests on them (the verifier reads the ground truth
        /// instead).
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        /// The counters at one moment. Shown for insight; the verdict never
        /// rests on these.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        #[serde(default)]
        #[schemars(rename = "ComponentFigures")]
        pub struct Counts {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Every counter now.
            pub fn counts(&self) -> Counts {
                Counts { $( $name: Stats::get(&self.$name), )* }
            }

            /// Adds what `now` counts beyond `before`, counter by counter: a
            /// component process's snapshots folded into the run's counters.
            pub fn add_since(&self, now: &Counts, before: &Counts) {
                $( Stats::add(&self.$name, now.$name.saturating_sub(before.$name)); )*
            }
        }
    };
}

counters! {
    /// Messages the broker acked (a crashed batch counts again when replayed).
    messages_published,
    relay_batches,
    relay_crashes,
    relay_errors,
    /// Events whose effects a notifier applied.
    events_applied,
    /// Events the inbox absorbed as already processed.
    duplicates_absorbed,
    stale_ignored,
    dead_lettered,
    notifier_crashes,
    notifier_errors,
    purged_outbox_rows,
    purged_inbox_rows,
    /// Processes of programs under test: every incarnation started, the
    /// nemesis's kills and pauses, kills of a process with database
    /// sessions open and those whose sessions PostgreSQL then showed gone.
    processes_started,
    processes_killed,
    processes_paused,
    sessions_at_kill,
    sessions_gone_after_kill,
    /// Commits the fault proxy saw acknowledged: with changed rows, and
    /// empty or read-only (never struck by an aimed kill).
    commits_written,
    commits_empty,
    /// How long the run waited for the fault proxy's Kafka ports another
    /// run held, before it started.
    waited_for_ports_ms,
    /// Process-seconds of consumers the nemesis left undrawn (random kills
    /// and pauses, arms of aimed kills) because their group was rebalancing
    /// (the coordinator said so).
    group_waits,
    /// The power of the random kills and pauses (`process.kill`,
    /// `process.kill_per_message`, `process.pause`), from pg_stat_activity
    /// while the process stood stopped: those measured, those that found a
    /// transaction open (the work a wrong program can lose), and the kills
    /// that found no session at all (a process still starting, or between
    /// connections).
    random_kills_measured,
    random_kills_in_transaction,
    random_kills_without_session,
    pauses_measured,
    pauses_in_transaction,
    /// Held writers' commits (`db.hold_commit` on a service,
    /// `workload.slow_commit`) that went on; those while which another
    /// writer committed rows, so that a row inserted later became visible
    /// first (an overtake a relay reading by insert order skips past); and
    /// those other commits. The evidence that a run reordered its outbox:
    /// a hold alone proves nothing.
    writer_holds,
    writer_holds_overtaken,
    overtakes,
    /// Consumers' (notifiers') held COMMITs that ran their course or were
    /// killed as their offsets moved: the evidence that a run held a
    /// consumer's transaction while auto-commit could have moved them.
    consumer_holds,
}

/// What one run's components count: the stage marks and the payments
/// written, and every [`Counters`] counter (reached through `Deref`, as
/// `stats.relay_batches`).
#[derive(Debug)]
pub struct Stats {
    /// When the run's clock started; the `*_ms` marks count from here.
    pub origin: std::time::Instant,
    /// The same moment as Unix milliseconds, so that a component process's
    /// marks can be placed on the harness's clock.
    pub origin_unix_ms: u64,
    pub first_write_ms: AtomicU64,
    pub last_write_ms: AtomicU64,
    pub first_publish_ms: AtomicU64,
    pub last_publish_ms: AtomicU64,
    pub first_apply_ms: AtomicU64,
    pub last_apply_ms: AtomicU64,
    pub payments_written: AtomicU64,
    pub counters: Counters,
}

impl std::ops::Deref for Stats {
    type Target = Counters;

    fn deref(&self) -> &Counters {
        &self.counters
    }
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            origin: std::time::Instant::now(),
            origin_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            first_write_ms: AtomicU64::new(u64::MAX),
            last_write_ms: AtomicU64::new(0),
            first_publish_ms: AtomicU64::new(u64::MAX),
            last_publish_ms: AtomicU64::new(0),
            first_apply_ms: AtomicU64::new(u64::MAX),
            last_apply_ms: AtomicU64::new(0),
            payments_written: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }
}

impl Stats {
    /// Records that a stage did something now: moves its first/last marks.
    pub fn mark(&self, first: &AtomicU64, last: &AtomicU64) {
        let now = self.origin.elapsed().as_millis() as u64;
        first.fetch_min(now, Ordering::Relaxed);
        last.fetch_max(now, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A writer's held commit went on, `others` commits of other writers
    /// having overtaken it.
    pub fn writer_hold(&self, others: u64) {
        Stats::add(&self.writer_holds, 1);
        Stats::add(&self.writer_holds_overtaken, (others > 0) as u64);
        Stats::add(&self.overtakes, others);
    }

    /// [`Stats::writer_hold`] as the payment service's commit gate calls it.
    pub fn on_writer_hold(self: &std::sync::Arc<Self>) -> std::sync::Arc<dyn Fn(u64) + Send + Sync> {
        let stats = self.clone();
        std::sync::Arc::new(move |others| stats.writer_hold(others))
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// What the run waits on, apart from the counters: the topic lanes each
/// notifier holds after its latest rebalance (the group-ready wait) and the
/// stalled notifiers still holding a batch (the drain). Watch channels, so
/// a waiter wakes when either changes instead of reading counters.
#[derive(Clone)]
pub struct Coordination {
    /// Lanes each notifier (by index) holds after its latest rebalance.
    assigned: std::sync::Arc<watch::Sender<std::collections::BTreeMap<usize, usize>>>,
    /// Stalled notifier incarnations still holding a batch: their late
    /// effects would land after verification.
    zombies: std::sync::Arc<watch::Sender<u64>>,
}

impl Default for Coordination {
    fn default() -> Self {
        Self {
            assigned: std::sync::Arc::new(watch::channel(Default::default()).0),
            zombies: std::sync::Arc::new(watch::channel(0).0),
        }
    }
}

impl Coordination {
    /// Records the lanes a notifier holds after a rebalance.
    pub fn set_assigned(&self, notifier: usize, lanes: usize) {
        self.assigned.send_modify(|a| {
            a.insert(notifier, lanes);
        });
    }

    /// The lanes each notifier holds now.
    pub fn assigned(&self) -> std::collections::BTreeMap<usize, usize> {
        self.assigned.borrow().clone()
    }

    /// Wakes on every change of the assignments.
    pub fn watch_assigned(&self) -> watch::Receiver<std::collections::BTreeMap<usize, usize>> {
        self.assigned.subscribe()
    }

    /// Every notifier has joined, the group holds every lane once, and
    /// every notifier that can have a lane holds one.
    pub fn group_settled(&self, notifiers: usize, lanes: usize) -> bool {
        settled(&self.assigned.borrow(), notifiers, lanes)
    }

    /// A zombie starts holding its batch; it stops when the guard drops
    /// (a panic included).
    pub fn zombie(&self) -> ZombieGuard {
        self.zombies.send_modify(|n| *n += 1);
        ZombieGuard(self.zombies.clone())
    }

    /// Zombies still holding a batch.
    pub fn zombies(&self) -> u64 {
        *self.zombies.borrow()
    }
}

/// Whether `assigned` is a settled group of `notifiers` over `lanes`.
pub fn settled(assigned: &std::collections::BTreeMap<usize, usize>, notifiers: usize, lanes: usize) -> bool {
    let holders = assigned.values().filter(|n| **n > 0).count();
    assigned.len() == notifiers && assigned.values().sum::<usize>() == lanes && holders == notifiers.min(lanes)
}

/// Counts a zombie as active for as long as it lives.
pub struct ZombieGuard(std::sync::Arc<watch::Sender<u64>>);

impl Drop for ZombieGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The shortest pause before a component restarts after an error (not a
/// fault): a service that refuses it now, a dead connection, would
/// otherwise be retried in a tight loop by every relay and notifier. Faults
/// restart after the scenario's `restart_delay_ms` alone.
pub const RESTART_FLOOR: std::time::Duration = std::time::Duration::from_millis(200);

/// Tells every task to stop. Cloned into each task; `trigger` on the sender.
#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

pub fn shutdown_pair() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    pub fn is_set(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown has been triggered.
    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|v| *v).await;
    }

    /// Sleeps for `d`, or less if shutdown comes first. Returns true on shutdown.
    pub async fn sleep(&mut self, d: std::time::Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => self.is_set(),
            _ = self.wait() => true,
        }
    }
}

/// Tasks a component spawns beside itself (a stalled notifier's zombie),
/// named, so that the run's stop awaits them with the components and
/// notices one that panicked.
#[derive(Clone, Default)]
pub struct Tasks(std::sync::Arc<std::sync::Mutex<Vec<Named>>>);

/// A task and the name the run reports it by.
pub type Named = (String, tokio::task::JoinHandle<()>);

impl Tasks {
    pub fn spawn(&self, name: String, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((name, handle));
    }

    /// Every task spawned so far, leaving none behind.
    pub fn take(&self) -> Vec<Named> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Everything a component of one run needs, cheap to clone into each task.
#[derive(Clone)]
pub struct Ctx {
    pub scenario: std::sync::Arc<crate::scenario::Scenario>,
    pub store: crate::store::Store,
    pub faults: std::sync::Arc<crate::faults::FaultInjector>,
    pub stats: std::sync::Arc<Stats>,
    /// What the run's waits watch: the group's assignments, the zombies.
    pub coord: Coordination,
    pub shutdown: Shutdown,
    /// The run's broker: Kafka, the embedded mock cluster, or (in unit
    /// tests) the in-memory one.
    pub broker: crate::broker::SharedBroker,
    pub names: crate::domain::names::RunNames,
    /// What the workload committed: the verifier's record of intent.
    pub intent: std::sync::Arc<crate::domain::intent::Intent>,
    /// Tasks the components spawn beside themselves.
    pub tasks: Tasks,
    /// The email provider's client, when the notifier sends each receipt
    /// as an email (`notifier.email`); None otherwise.
    pub email: Option<std::sync::Arc<crate::provider::client::EmailClient>>,
}

impl Ctx {
    /// The run's topic, as the broker is asked about it.
    pub fn topic(&self) -> crate::broker::Topic {
        self.scenario.topic(&self.names.topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_settles_only_when_every_notifier_holds_its_share() {
        let s = Coordination::default();
        assert!(!s.group_settled(2, 6), "nobody joined");
        s.set_assigned(1, 6);
        assert!(!s.group_settled(2, 6), "the first member holds everything; the second has not joined");
        s.set_assigned(2, 0);
        assert!(!s.group_settled(2, 6), "the second joined but holds nothing");
        s.set_assigned(1, 3);
        s.set_assigned(2, 3);
        assert!(s.group_settled(2, 6));
        // More notifiers than partitions: some hold none by design.
        let s = Coordination::default();
        for (n, held) in [(1, 1), (2, 1), (3, 0)] {
            s.set_assigned(n, held);
        }
        assert!(s.group_settled(3, 2));
    }
}

/// This process's memory, as the run and its measurements see it.
pub mod memory {
    /// A figure of `/proc/self/status` (`"VmRSS:"`, `"VmHWM:"`), in kB; 0
    /// where there is none.
    pub fn status_kb(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or(0)
    }

    /// Hands the pages the allocator keeps free back to the system, and
    /// logs where the memory stands. Called between the run and its
    /// checkers: glibc keeps the pipeline's freed buffers inside its heaps,
    /// and once handed back the checkers' columns take fresh pages in their
    /// place rather than adding to them. The log tells whether a run's peak
    /// was the pipeline's or the verifier's. Only a run that is `judged`
    /// needs it: an interrupted or incomplete one stops here.
    pub fn hand_back_before_judging(judged: bool) {
        if !judged {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory the allocator holds.
        unsafe {
            libc::malloc_trim(0);
        }
        log(tracing::Level::INFO, "the verifier begins");
    }

    /// Logs where the memory stands after `step`: resident now, and the
    /// peak so far, in MB.
    pub fn log(level: tracing::Level, step: &str) {
        let (resident_mb, peak_mb) = (status_kb("VmRSS:") / 1024, status_kb("VmHWM:") / 1024);
        match level {
            tracing::Level::INFO => tracing::info!(resident_mb, peak_mb, "{step}"),
            _ => tracing::debug!(resident_mb, peak_mb, "{step}"),
        }
    }
}
