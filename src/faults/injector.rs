//! The injector every component of a run shares: it counts occurrences,
//! decides, logs what fired, and waits for each firing's confirmation.

use super::decide::{draw_below, ARMING_SALT, SPREAD_SALT};
use super::*;
use crate::broker::{Position, Stretch};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A watched message: who holds it, when it was last delivered, and the
/// firings waiting for it to be delivered again.
#[derive(Debug, Default)]
struct Watch {
    holders: u32,
    last_delivery: u64,
    awaiting: Vec<(FaultPoint, u64)>,
}

/// A batch a notifier received, for [`FaultInjector::settled`] and
/// [`FaultInjector::await_redelivery`]: its first message and when it came.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub first: Position,
    delivery: u64,
}

/// What the harness still has to see before a firing counts as confirmed.
#[derive(Debug, Default)]
struct Awaited {
    /// The first message of each batch a notifier holds or a fault waits
    /// on, by its position.
    watched: std::collections::HashMap<Position, Watch>,
    /// Numbers the deliveries, so "delivered again after I received it" is
    /// a comparison.
    deliveries: u64,
    /// Relay faults the verifier confirms from the topic: the point, the
    /// batch's first event and the copies of it the topic must hold.
    copies: Vec<(FaultPoint, uuid::Uuid, u8)>,
}

/// Shared by every component of a run.
pub struct FaultInjector {
    seed: u64,
    rates: [f64; N],
    pub(super) occurrences: [AtomicU64; N],
    fired: [AtomicU64; N],
    confirmed: [AtomicU64; N],
    /// Firings another fault pre-empted, each with its point and why.
    preempted: Mutex<Vec<(FaultPoint, String)>>,
    awaited: Mutex<Awaited>,
    log: Mutex<Vec<FaultRecord>>,
    /// Pinned firings, in place of the seeded decisions.
    schedule: Option<Schedule>,
    /// What an aimed kill's rate counts.
    aimed: Aimed,
    /// Per point, the seconds of process life drawn for arming so far: the
    /// occurrence numbers of the arming decisions.
    draws: [AtomicU64; N],
    /// Per point, the draws that armed a process.
    armings: [AtomicU64; N],
    /// The processes armed and not yet struck.
    arms: Mutex<Vec<Arm>>,
    /// Aimed kills' rates for one role's processes, over `rates`.
    role_rates: RoleRates,
    /// The consumers' group is rebalancing, as the coordinator last said
    /// ([`FaultInjector::set_group_stable`]).
    rebalancing: std::sync::atomic::AtomicBool,
    /// The calm stretch (`[nemesis] calm_after`) has begun: no point that
    /// kills or pauses a process strikes from here on.
    calm: std::sync::atomic::AtomicBool,
    /// The faults have stopped (the drain's last timeout, the settle, the
    /// verification): no point strikes or counts an occurrence.
    stopped: std::sync::atomic::AtomicBool,

    /// Every in-process firing by occurrence, uncapped: the schedule a
    /// shrink starts from.
    fired_at: Mutex<Vec<(FaultPoint, u64)>>,
    /// The batches the reference notifiers received (in process, or
    /// reported by their processes), the first [`DELIVERY_LOG_CAP`] of them.
    deliveries: Mutex<Vec<DeliveryRecord>>,
    started: Instant,
    /// The same moment on the wall clock, which the database's timestamps
    /// share: what dates an anomaly against the fault log.
    started_wall: std::time::SystemTime,
    /// Inside a `chaos component` process: the line to the harness, which
    /// keeps the run's counts and ends the process at a crash point.
    link: std::sync::OnceLock<std::sync::Arc<dyn HarnessLink>>,
}

/// What a component process tells the harness, and how it asks to be
/// stopped. The injector holds one only inside a `chaos component`
/// process (the harness's side of the protocol implements it); in process
/// it holds none and keeps every count itself.
pub trait HarnessLink: Send + Sync {
    /// A fault fired here.
    fn fired(&self, record: &FaultRecord);
    /// `n` firings of `point` had their effect.
    fn confirmed(&self, point: FaultPoint, n: u64);
    /// A firing of `point` waits for `copies` copies of `event` on the topic.
    fn copies(&self, point: FaultPoint, event: uuid::Uuid, copies: u8);
    /// A notifier received a batch: its size and its (partition, first,
    /// last offset) spans.
    fn delivered(&self, component: &str, messages: u32, spans: Vec<Stretch>);
    /// A firing of `point` waits for the next delivery of `first`, to any
    /// process of the run.
    fn awaits_delivery(&self, point: FaultPoint, first: Position);
    /// Stopped at a crash point for `fires` firings: send the last figures
    /// and ask to be killed.
    fn halt(&self, injector: &FaultInjector, point: FaultPoint, fires: u64);
    /// At a stall point: ask to be stopped for `d`.
    fn stall(&self, point: FaultPoint, d: Duration);
}

/// How long a stalled component process waits for the harness's SIGSTOP
/// to land before it goes on (it goes on, late, once SIGCONT comes).
const STALL_HANDOFF: Duration = Duration::from_millis(100);

/// The log keeps the first records only; the counters count them all.
const LOG_CAP: usize = 10_000;

/// Batches kept for the stories: a few megabytes at most (a run of a
/// million payments takes about 40,000 batches, redeliveries included).
pub const DELIVERY_LOG_CAP: usize = 200_000;

/// An armed process for an aimed kill, waiting for its window.
struct Arm {
    point: FaultPoint,
    component: String,
    /// The windows it lets go by before the one struck.
    pass: u64,
}

/// An armed process is struck at one of its next this many windows, drawn
/// from the seed. A program's windows come in bursts (a message's
/// statements, each its own commit; a batch's), and an arm drawn in a
/// quiet second would always strike the first window of the next burst:
/// the kill after a message's second statement, where a program that
/// commits its effects one by one breaks, would never come.
pub const ARM_SPREAD: u64 = 4;

impl FaultInjector {
    pub fn new(seed: u64, rates: &FaultRates) -> Self {
        Self {
            seed,
            rates: std::array::from_fn(|i| rates.get(FaultPoint::ALL[i])),
            occurrences: std::array::from_fn(|_| AtomicU64::new(0)),
            fired: std::array::from_fn(|_| AtomicU64::new(0)),
            confirmed: std::array::from_fn(|_| AtomicU64::new(0)),
            preempted: Mutex::new(Vec::new()),
            awaited: Mutex::new(Awaited::default()),
            log: Mutex::new(Vec::new()),
            schedule: None,
            aimed: Aimed::PerOccurrence,
            draws: std::array::from_fn(|_| AtomicU64::new(0)),
            armings: std::array::from_fn(|_| AtomicU64::new(0)),
            arms: Mutex::new(Vec::new()),
            role_rates: Vec::new(),
            rebalancing: Default::default(),
            calm: Default::default(),
            stopped: Default::default(),
            fired_at: Mutex::new(Vec::new()),
            deliveries: Mutex::new(Vec::new()),
            started: Instant::now(),
            started_wall: std::time::SystemTime::now(),
            link: std::sync::OnceLock::new(),
        }
    }

    /// Makes this injector a component process's: from now on it reports
    /// to the harness through `link`. Set once; a second link is ignored.
    pub fn link_to_harness(&self, link: std::sync::Arc<dyn HarnessLink>) {
        let _ = self.link.set(link);
    }

    fn link(&self) -> Option<&dyn HarnessLink> {
        self.link.get().map(|l| l.as_ref())
    }

    /// True inside a `chaos component` process, whose harness keeps the
    /// run's counts and ends it at a crash point.
    pub fn linked(&self) -> bool {
        self.link.get().is_some()
    }

    /// At a crash point: in a component process, say so and stop here until
    /// the harness's SIGKILL; in process, return at once (the caller
    /// crashes in place).
    pub async fn halt(&self, point: FaultPoint) {
        self.halt_for(point, 1).await
    }

    /// [`FaultInjector::halt`] for a crash that `fires` firings of `point` decided.
    pub async fn halt_for(&self, point: FaultPoint, fires: u64) {
        if let Some(link) = self.link() {
            link.halt(self, point, fires);
            std::future::pending::<()>().await;
        }
    }

    /// At a stall point: in a component process, ask the harness to stop
    /// this process for `d` and return true once it runs again; in
    /// process, return false (the caller stalls in place).
    pub async fn stall(&self, point: FaultPoint, d: Duration) -> bool {
        let Some(link) = self.link() else { return false };
        link.stall(point, d);
        tokio::time::sleep(STALL_HANDOFF).await;
        true
    }

    /// The same injector with its decisions pinned to `schedule`.
    /// A point the schedule leaves out counts as off (probability 0), so
    /// the chaos checks ask only the listed points to fire; the timeline's
    /// service faults are the timeline's.
    pub fn with_schedule(mut self, schedule: Option<Schedule>) -> Self {
        if let Some(s) = &schedule {
            for p in FaultPoint::ALL.iter().filter(|p| !p.is_service()) {
                if s.0.get(p).is_none_or(|ns| ns.is_empty()) {
                    self.rates[p.index()] = 0.0;
                }
            }
        }
        self.schedule = schedule;
        self
    }

    /// The same injector with aimed kills' rates read as `aimed` says.
    pub fn with_aimed(mut self, aimed: Aimed) -> Self {
        self.aimed = aimed;
        self
    }

    /// The same injector with these roles' own rates for aimed kills
    /// (`[faults.service]`), drawn per second as the others are.
    pub fn with_role_rates(mut self, role_rates: RoleRates) -> Self {
        self.role_rates = role_rates;
        self
    }

    /// Whether `point` fires only at a window of a process armed before
    /// ([`Aimed::PerSecond`]). A schedule pins windows by occurrence
    /// instead, so that a replay strikes the same ones.
    pub fn arms(&self, point: FaultPoint) -> bool {
        // A role's own rate stands over a set one only (the scenario refuses
        // it over 0): the proxy watches a wire for a point set in `rates`.
        self.aimed == Aimed::PerSecond && point.aimed() && self.schedule.is_none() && self.rates[point.index()] > 0.0
    }

    /// `point`'s rate for `component` (per second for an aimed kill, per
    /// occurrence otherwise): its role's own (`service` for `service-1`),
    /// or the scenario's.
    /// `point`'s rate on `component` (a role's own, else the point's).
    pub fn rate_for(&self, point: FaultPoint, component: &str) -> f64 {
        let role = component.split_once('-').map_or(component, |(role, _)| role);
        self.role_rates
            .iter()
            .find(|r| r.point == point && r.role == role)
            .map_or(self.rates[point.index()], |r| r.rate)
    }

    /// One second of `component`'s process life, for `point`: a seeded
    /// draw at the point's rate, which when it fires arms the process for
    /// one of its next [`ARM_SPREAD`] windows, drawn from the seed too. An
    /// armed process stays armed (once) until struck. Returns whether this
    /// draw armed it.
    pub fn arm(&self, point: FaultPoint, component: &str) -> bool {
        if !self.arms(point) || self.calmed(point) {
            return false;
        }
        let i = point.index();
        let n = self.draws[i].fetch_add(1, Ordering::Relaxed);
        // Its own decision stream: the windows' stream stays the one a
        // per-occurrence run of the same seed draws.
        if !decide(self.seed ^ ARMING_SALT, point, n, self.rate_for(point, component)) {
            return false;
        }
        self.armings[i].fetch_add(1, Ordering::Relaxed);
        let mut arms = self.arms.lock().unwrap_or_else(|p| p.into_inner());
        if !arms.iter().any(|a| a.point == point && a.component == component) {
            let pass = draw_below(self.seed ^ SPREAD_SALT, point, n, ARM_SPREAD);
            arms.push(Arm { point, component: component.to_string(), pass });
        }
        true
    }

    /// What the coordinator last said of the consumers' group: stable or
    /// not. Unknown (a broker that cannot say) is stable.
    pub fn set_group_stable(&self, stable: bool) {
        self.rebalancing.store(!stable, Ordering::Relaxed);
    }

    /// Whether a second of `component`'s life must pass undrawn because it
    /// is a consumer (a notifier slot, the reference's or a program's) and
    /// its group is rebalancing. A kill then teaches nothing a kill after
    /// the rebalance would not, and a client without static membership
    /// killed while its group rebalances makes the group rebalance again,
    /// and again: a kill storm that never drains. The caller counts it
    /// (`Stats::group_waits`).
    pub fn waits_for_group(&self, component: &str) -> bool {
        component.starts_with("notifier") && self.rebalancing.load(Ordering::Relaxed)
    }

    /// One window of `component` for `point`: true when it is struck, the
    /// arm taken. An armed process lets the windows its arm was drawn to
    /// pass go by first.
    fn disarm(&self, point: FaultPoint, component: &str) -> bool {
        let mut arms = self.arms.lock().unwrap_or_else(|p| p.into_inner());
        match arms.iter().position(|a| a.point == point && a.component == component) {
            Some(i) if arms[i].pass > 0 => {
                arms[i].pass -= 1;
                false
            }
            Some(i) => {
                arms.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Per point, the seconds drawn and the draws that armed a process.
    pub fn armed(&self, point: FaultPoint) -> (u64, u64) {
        let i = point.index();
        (self.draws[i].load(Ordering::Relaxed), self.armings[i].load(Ordering::Relaxed))
    }

    /// When the log's clock started, in milliseconds since the epoch.
    pub fn started_epoch_ms(&self) -> i64 {
        self.started_wall.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    pub fn probability(&self, point: FaultPoint) -> f64 {
        self.rates[point.index()]
    }

    /// Begins the calm stretch: from now on no process is killed or paused
    /// (every point that needs a process), whatever its rate.
    pub fn calm_down(&self) {
        if !self.calm.swap(true, Ordering::Relaxed) {
            tracing::info!("the calm stretch begins: no process is killed or paused from here on");
        }
    }

    /// No fault strikes from now on, of any point: what the harness says
    /// when it turns the faults off for the drain's last timeout. Before
    /// it, a point struck per commit or per batch (`db.commit_ack_lost`)
    /// kept striking in the stretch the report called fault-free: a
    /// library's relay lost a COMMIT answer 36 s into it.
    pub fn stop(&self) {
        if !self.stopped.swap(true, Ordering::Relaxed) {
            tracing::info!("the faults stop: no point strikes from here on");
        }
    }

    /// Whether the calm stretch has begun.
    pub fn is_calm(&self) -> bool {
        self.calm.load(Ordering::Relaxed)
    }

    fn calmed(&self, point: FaultPoint) -> bool {
        point.needs_process() && self.is_calm()
    }

    /// Reaches a fault point once. Returns true when the fault fires; then it
    /// is counted and logged with what it hit.
    pub fn strike(&self, point: FaultPoint, component: &str, hit: impl FnOnce() -> String) -> bool {
        self.strike_reaching(point, component, hit, Reach::default)
    }

    /// [`FaultInjector::strike`], logging the data the firing hit too: a
    /// relay's batch of outbox rows, a notifier's batch of messages.
    pub fn strike_reaching(
        &self,
        point: FaultPoint,
        component: &str,
        hit: impl FnOnce() -> String,
        reach: impl FnOnce() -> Reach,
    ) -> bool {
        // In the calm stretch a kill or a pause is no occurrence at all:
        // the rate still means the same per window before it; once the
        // faults have stopped, nothing is.
        if self.calmed(point) || self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        let i = point.index();
        let n = self.occurrences[i].fetch_add(1, Ordering::Relaxed);
        let fires = match &self.schedule {
            Some(s) => self.rates[i] > 0.0 && s.fires(point, n),
            // Every window is an occurrence (what a schedule pins); only
            // an armed process's is struck.
            None if self.arms(point) => self.disarm(point, component),
            // A role's own rate per occurrence (`db_commit_ack_lost` in
            // `[faults.notifier]`), or the scenario's.
            None => decide(self.seed, point, n, self.rate_for(point, component)),
        };
        if !fires {
            return false;
        }
        self.fired[i].fetch_add(1, Ordering::Relaxed);
        self.fired_at.lock().unwrap_or_else(|p| p.into_inner()).push((point, n));
        let record = FaultRecord {
            point: point.name().to_string(),
            component: component.to_string(),
            at_ms: self.started.elapsed().as_millis() as u64,
            hit: hit(),
            occurrence: Some(n),
            reach: reach(),
        };
        tracing::info!(point = %record.point, component = %record.component, hit = %record.hit, "fault fired");
        // A component process tells the harness, which keeps the run's count.
        if let Some(link) = self.link() {
            link.fired(&record);
        }
        self.push_log(record);
        true
    }

    fn push_log(&self, record: FaultRecord) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() < LOG_CAP {
            log.push(record);
        }
    }

    /// A firing a component process reported: counted and logged here, at
    /// the harness's clock.
    pub fn record_fired(&self, point: FaultPoint, mut record: FaultRecord) {
        self.fired[point.index()].fetch_add(1, Ordering::Relaxed);
        record.at_ms = self.started.elapsed().as_millis() as u64;
        record.occurrence = None;
        self.push_log(record);
    }

    /// How often a point was reached.
    pub fn reached(&self, point: FaultPoint) -> u64 {
        self.occurrences[point.index()].load(Ordering::Relaxed)
    }

    /// Occurrences a component process reported.
    pub fn add_reached(&self, point: FaultPoint, n: u64) {
        self.occurrences[point.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// `n` firings of `point` had the effect the harness looks for.
    pub fn confirm(&self, point: FaultPoint, n: u64) {
        if let Some(link) = self.link() {
            link.confirmed(point, n);
        }
        self.confirmed[point.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub fn confirmed(&self, point: FaultPoint) -> u64 {
        self.confirmed[point.index()].load(Ordering::Relaxed)
    }

    /// The points set to strike a process (kills, pauses, holds) that have
    /// no confirmed firing yet: what the calm waits for, so that a run
    /// does not end its faults with a window never struck.
    pub fn unstruck(&self) -> Vec<FaultPoint> {
        FaultPoint::ALL
            .iter()
            .copied()
            .filter(|p| p.needs_process() && self.probability(*p) > 0.0 && self.confirmed(*p) == 0)
            .collect()
    }

    /// A firing of `point` on `component` had no effect of its own: another
    /// fault ended the process first (`why`). Counted apart, so a correct
    /// run is not inconclusive for it, and said in the report.
    pub fn preempt(&self, point: FaultPoint, component: &str, why: &str) {
        tracing::info!(point = point.name(), component, why, "a firing was pre-empted by another fault");
        let at = self.started.elapsed().as_millis();
        self.preempted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((point, format!("{component} at {at} ms: {why}")));
    }

    pub fn preempted(&self, point: FaultPoint) -> u64 {
        self.preempted.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(p, _)| *p == point).count() as u64
    }

    fn awaited(&self) -> std::sync::MutexGuard<'_, Awaited> {
        self.awaited.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A notifier received a batch. Confirms the firings waiting for any of
    /// its messages to come again, and watches the batch's first message
    /// until the batch is settled or crashes. Watching from receipt, not
    /// from the crash, matters: during a rebalance two consumers may read the
    /// same messages, and the redelivery can come before the crash is known.
    pub fn delivered(&self, first: Position, messages: impl IntoIterator<Item = Position>) -> Held {
        let mut a = self.awaited();
        a.deliveries += 1;
        let now = a.deliveries;
        for m in messages {
            if let Some(w) = a.watched.get_mut(&m) {
                w.last_delivery = now;
                for (point, fires) in std::mem::take(&mut w.awaiting) {
                    self.confirm(point, fires);
                }
            }
        }
        let w = a.watched.entry(first).or_default();
        w.holders += 1;
        w.last_delivery = now;
        Held { first, delivery: now }
    }

    /// Logs a batch `component` received (its messages' positions), for
    /// the anomalies' stories.
    pub fn log_delivery(&self, component: &str, messages: impl IntoIterator<Item = Position>) {
        let (spans, n) = Stretch::fold(messages);
        if let Some(link) = self.link() {
            // A component process tells the harness, whose log the stories read.
            link.delivered(component, n, spans);
            return;
        }
        self.record_delivery(component.to_string(), n, spans);
    }

    /// A batch received, logged at the harness's clock (a component
    /// process's report comes here).
    pub fn record_delivery(&self, component: String, messages: u32, spans: Vec<Stretch>) {
        {
            // What a process reported confirms the firings awaiting a
            // delivery of a message in its spans (in process,
            // [`FaultInjector::delivered`] took them already).
            let mut a = self.awaited();
            let covered = |k: &Position| spans.iter().any(|s| s.contains(*k));
            let hit: Vec<Position> =
                a.watched.iter().filter(|(k, w)| !w.awaiting.is_empty() && covered(k)).map(|(k, _)| *k).collect();
            for k in hit {
                if let Some(w) = a.watched.get_mut(&k) {
                    for (point, fires) in std::mem::take(&mut w.awaiting) {
                        self.confirm(point, fires);
                    }
                }
            }
        }
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut log = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() < DELIVERY_LOG_CAP {
            log.push(DeliveryRecord { component, at_ms, messages, spans });
        }
    }

    /// The batches the reference notifiers received, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.deliveries.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The batch is done (committed, or failed without a fault): stop
    /// watching it.
    pub fn settled(&self, held: Held) {
        let mut a = self.awaited();
        Self::release(&mut a, held.first);
    }

    fn release(a: &mut Awaited, first: Position) {
        if let Some(w) = a.watched.get_mut(&first) {
            w.holders = w.holders.saturating_sub(1);
            if w.holders == 0 && w.awaiting.is_empty() {
                a.watched.remove(&first);
            }
        }
    }

    /// `fires` firings of `point` hit the held batch: they are confirmed by
    /// its first message delivered again after the batch was received (at
    /// once, if that has happened already), to any notifier.
    pub fn await_redelivery(&self, point: FaultPoint, fires: u64, held: Held) {
        let mut a = self.awaited();
        let w = a.watched.entry(held.first).or_default();
        if w.last_delivery > held.delivery {
            self.confirm(point, fires);
        } else {
            w.awaiting.push((point, fires));
        }
        Self::release(&mut a, held.first);
    }

    /// `point` fired on data already settled (a replay): confirmed by the
    /// next delivery of `first`.
    pub fn await_next_delivery(&self, point: FaultPoint, first: Position) {
        if let Some(link) = self.link() {
            // The harness watches every process's deliveries; this process
            // may be killed before it reads the message again.
            link.awaits_delivery(point, first);
            return;
        }
        self.awaited().watched.entry(first).or_default().awaiting.push((point, 1));
    }

    /// A firing of `point` is confirmed when the topic holds at least `copies`
    /// copies of `event`; the verifier looks.
    pub fn await_copies(&self, point: FaultPoint, event: uuid::Uuid, copies: u8) {
        // The verifier of the harness looks for them, not a component process.
        if let Some(link) = self.link() {
            link.copies(point, event, copies);
        }
        self.awaited().copies.push((point, event, copies));
    }

    /// The copies the verifier must look for, taken once.
    pub fn take_awaited_copies(&self) -> Vec<(FaultPoint, uuid::Uuid, u8)> {
        std::mem::take(&mut self.awaited().copies)
    }

    pub fn fired(&self, point: FaultPoint) -> u64 {
        self.fired[point.index()].load(Ordering::Relaxed)
    }

    pub fn total_fired(&self) -> u64 {
        FaultPoint::ALL.iter().map(|p| self.fired(*p)).sum()
    }

    pub fn summary(&self) -> Vec<FaultSummary> {
        FaultPoint::ALL
            .iter()
            .map(|p| FaultSummary {
                point: p.name().to_string(),
                unit: match self.arms(*p) {
                    true => format!(
                        "second, per process (armed, then struck at one of its next {ARM_SPREAD} windows: {})",
                        p.unit()
                    ),
                    false => p.unit().to_string(),
                },
                probability: self.probability(*p),
                occurrences: self.occurrences[p.index()].load(Ordering::Relaxed),
                fired: self.fired(*p),
                confirmed: self.confirmed(*p),
                preempted: self.preempted(*p),
                preempted_why: {
                    let all = self.preempted.lock().unwrap_or_else(|p| p.into_inner());
                    all.iter().filter(|(q, _)| q == p).take(5).map(|(_, why)| why.clone()).collect()
                },
                armed: self.arms(*p).then(|| self.armed(*p)),
                per_role: self.role_rates.iter().filter(|r| r.point == *p).map(|r| (r.role.clone(), r.rate)).collect(),
            })
            .collect()
    }

    /// Every firing struck in this process, as a schedule that replays it.
    pub fn fired_schedule(&self) -> Schedule {
        Schedule::from_firings(self.fired_at.lock().unwrap_or_else(|p| p.into_inner()).iter().copied())
    }

    pub fn log(&self) -> Vec<FaultRecord> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The faults' side of the run's history, for the checkers: taken once
    /// the run is over (the firings that wait for copies on the topic are
    /// taken with it).
    pub fn history(&self) -> FaultHistory {
        FaultHistory {
            started_epoch_ms: self.started_epoch_ms(),
            log: self.log(),
            deliveries: self.deliveries(),
            awaited_copies: self.take_awaited_copies(),
        }
    }
}
