//! Programs under test: a user's notifier (`[notifier] command`) or relay
//! (`[relay] command`) run as OS processes, one per slot, and the
//! harness's own acts on them.
//!
//! Each slot has a keeper task. It starts the program with the contract's
//! environment (docs/contract.md), keeps its output, and from the moment
//! every instance is ready until the pipeline has drained it is the
//! nemesis for its process: each second, at a random instant
//! within it, `process.kill` sends SIGKILL to the process group and
//! `process.pause` sends SIGSTOP, then SIGCONT later. The kernel ends or
//! stops the process; nothing in it runs. A killed process is replaced by a
//! new one in the same slot (incarnation + 1).
//!
//! A process that exits when nobody killed it or asked it to stop, or that
//! cannot start at all, ends the run: the first such failure is published
//! on [`Programs::failed`], naming the command, the exit status and the last
//! lines of its stderr. However the run ends, every process group the
//! keepers started is killed: on stop, on drop, and (for the direct child)
//! by the kernel if `chaos` itself dies (`PR_SET_PDEATHSIG`).

use crate::context::{Ctx, Stats, RESTART_FLOOR};
use crate::faults::{Confirm, FaultPoint};
use crate::nemesis::process::protocol::Line;
use crate::nemesis::signal::{Claim, Exit, Lease, Occupant, Sent, Struck};
use crate::scenario::{Components, ProgramCommand};
use crate::store::Store;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

mod by_messages;
mod env;
mod keeper;

use by_messages::*;
use env::*;
pub(crate) use keeper::process_state;
use keeper::*;

/// How long a program gets to exit after SIGTERM before it is killed
/// (docs/contract.md promises 10 s; the run's own stop deadline is 15 s).
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a SIGKILLed or SIGSTOPped process may take to be seen so: the
/// kernel acts at once, unless the process sits in an uninterruptible wait.
const SIGNAL_SEEN: Duration = Duration::from_secs(5);
/// How long a kill claimed by another striker (the fault proxy) may take
/// to be sent before the keeper sends it itself.
const CLAIMER_GRACE: Duration = Duration::from_secs(1);
/// How long the database may take to drop a killed process's sessions: it
/// sees the connection close as soon as the kernel closes the socket.
const SESSIONS_GONE: Duration = Duration::from_secs(5);
/// How often a starting process is looked for in pg_stat_activity.
const READY_CHECK: Duration = Duration::from_millis(100);
/// Lines of a process's stderr quoted in an error about it.
const TAIL_LINES: usize = 6;
/// How often the group's membership is read while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(250);
/// How often the consumers' group's state is read while the run acts.
const GROUP_POLL: Duration = Duration::from_millis(200);

/// The programs of one run and what they have come to.
pub struct Programs {
    /// The notifier under test, if the notifier is one: its command and
    /// instance count, for the readiness wait.
    notifier: Option<(ProgramCommand, usize)>,
    /// Each relay slot under test, and whether an incarnation of it has
    /// shown its database session yet.
    relays: Vec<(String, Arc<std::sync::atomic::AtomicBool>)>,
    failure: watch::Sender<Option<String>>,
    /// What a program that exited with status 3 before the run acted says
    /// it lacks.
    lacking: Arc<std::sync::OnceLock<String>>,
    acting: watch::Sender<bool>,
    /// Each slot's name and latest stderr lines, for errors raised outside
    /// a keeper.
    tails: Vec<(String, Tail)>,
    pub logs: PathBuf,
    /// Each service slot's port on 127.0.0.1, in slot order.
    service_ports: Vec<u16>,
}

/// Which component a program stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Notifier,
    Relay,
    /// A declared system's own service (`[system.service]`), driven by
    /// HTTP requests on its `CHAOS_PORT`.
    Service,
}

impl Role {
    fn restart_delay(self, sc: &crate::scenario::Scenario) -> Duration {
        match self {
            Role::Notifier => sc.notifier.restart_delay,
            Role::Relay => sc.relay.restart_delay,
            Role::Service => RESTART_FLOOR,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Notifier => "notifier",
            Role::Relay => "relay",
            Role::Service => "service",
        }
    }
}

type Tail = Arc<Mutex<VecDeque<String>>>;

impl Programs {
    /// Starts a keeper per slot of each component the scenario gives a
    /// command; returns them as named tasks for the run's stop to await.
    /// None when every component is the reference one.
    pub fn start(
        ctx: &Ctx,
        database: &Database,
        logs: PathBuf,
        lanes: Option<&crate::nemesis::proxy::Lanes>,
    ) -> crate::error::Result<Option<(Self, Vec<crate::context::Named>)>> {
        let sc = &ctx.scenario;
        let roles = Self::roles(sc)?;
        if roles.iter().all(|r| r.1.is_none()) {
            return Ok(None);
        }
        std::fs::create_dir_all(&logs).map_err(|e| crate::Error::io(&logs, e))?;
        let (failure, _) = watch::channel(None);
        let lacking: Arc<std::sync::OnceLock<String>> = Default::default();
        let (acting, _) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut tails = Vec::new();
        let mut notifier = None;
        let mut relays = Vec::new();
        let mut kills = Vec::new();
        let mut service_ports = Vec::new();
        for (role, command, instances, batch) in roles {
            let Some((command, is_reference)) = command else { continue };
            if role == Role::Notifier && !is_reference {
                notifier = Some((command.clone(), instances));
            }
            let env = Env::new(ctx, role, batch, database, is_reference)?;
            let restart = Self::restart_after(sc, role, is_reference);
            for slot in 1..=instances {
                let name = format!("{}-{slot}", role.as_str());
                let shown = (role == Role::Relay && !is_reference).then(|| {
                    let shown = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    relays.push((name.clone(), shown.clone()));
                    shown
                });
                let tail: Tail = Default::default();
                tails.push((name.clone(), tail.clone()));
                let (kill, kill_rx) = tokio::sync::mpsc::unbounded_channel();
                let proxy_slot = lanes.and_then(|l| l.slot(&name));
                // Everything that strikes the slot claims its kills on one
                // occupant: the keeper, the proxy, the per-message nemesis.
                let occupant = proxy_slot.as_ref().map(|s| s.process.occupant.clone()).unwrap_or_default();
                let env = slot_env(env.clone(), role, proxy_slot.as_deref(), lanes, &kill, &mut service_ports)?;
                let health = match (role, sc.system.as_ref().and_then(|s| s.service.as_ref()), service_ports.last()) {
                    (Role::Service, Some(s), Some(port)) if s.ready_line.is_none() => {
                        Some(format!("http://127.0.0.1:{port}{}", s.health))
                    }
                    _ => None,
                };
                kills.push((name.clone(), kill, occupant.clone()));
                let keeper = Keeper {
                    slot,
                    kill_rx,
                    occupant,
                    ctx: ctx.clone(),
                    role,
                    reference: is_reference,
                    restart,
                    confirm_on_start: None,
                    name: name.clone(),
                    command: command.clone(),
                    env,
                    logs: logs.clone(),
                    failure: failure.clone(),
                    lacking: lacking.clone(),
                    acting: acting.subscribe(),
                    tail,
                    rng: Self::slot_rng(sc.seed, role, slot),
                    shown,
                    health,
                };
                tasks.push((name, tokio::spawn(keeper.keep())));
            }
        }
        if sc.faults.get(FaultPoint::ProcessKillPerMessage) > 0.0 {
            let nemesis = by_messages(ctx.clone(), acting.subscribe(), kills);
            tasks.push(("nemesis (process.kill_per_message)".into(), tokio::spawn(nemesis)));
        }
        Ok(Some((Self { notifier, relays, failure, lacking, acting, tails, logs, service_ports }, tasks)))
    }

    /// The pause before a killed process's slot starts again. A program
    /// under test gets the contract's 200 ms; the reference components
    /// restart after the scenario's delay, as in process.
    fn restart_after(sc: &crate::scenario::Scenario, role: Role, reference: bool) -> Duration {
        match reference {
            false => RESTART_FLOOR,
            true => role.restart_delay(sc),
        }
    }

    /// Each slot its own stream of instants, from the seed.
    fn slot_rng(seed: u64, role: Role, slot: usize) -> rand::rngs::StdRng {
        let salt = (slot as u64 + 64 * role as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        rand::rngs::StdRng::seed_from_u64(seed ^ salt)
    }

    /// Each role, with the command its processes run and whether that is
    /// the reference component (`chaos component`); None for a role that
    /// runs in process.
    #[allow(clippy::type_complexity)]
    fn roles(
        sc: &crate::scenario::Scenario,
    ) -> crate::error::Result<[(Role, Option<(ProgramCommand, bool)>, usize, usize); 3]> {
        let reference = Self::reference_command()?;
        let as_process = |c: &Option<ProgramCommand>| match (c, sc.components) {
            (Some(c), _) => Some((c.clone(), false)),
            (None, Components::Process) => Some((reference.clone(), true)),
            (None, Components::InProcess) => None,
        };
        Ok([
            (Role::Notifier, as_process(&sc.notifier.command), sc.notifier.instances, sc.notifier.batch_size),
            (Role::Relay, as_process(&sc.relay.command), sc.relay.instances, sc.relay.batch_size),
            (
                Role::Service,
                sc.system.as_ref().and_then(|s| s.service.as_ref()).map(|s| (s.command.clone(), false)),
                sc.system.as_ref().and_then(|s| s.service.as_ref()).map_or(0, |s| s.instances),
                1,
            ),
        ])
    }

    /// `chaos component`, as this very binary.
    fn reference_command() -> crate::error::Result<ProgramCommand> {
        let exe = std::env::current_exe().map_err(|e| {
            crate::Error::Internal(format!("finding the chaos binary for components = \"process\": {e}"))
        })?;
        let dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Ok(ProgramCommand { argv: vec![exe.display().to_string(), "component".into()], dir })
    }

    /// True when the notifier is a program under test (so the group's
    /// readiness is read from the broker, not from the reference
    /// notifier's own report of its assignments).
    pub fn has_notifier(&self) -> bool {
        self.notifier.is_some()
    }

    /// Each service slot's port on 127.0.0.1 (`CHAOS_PORT`), in slot order.
    pub fn service_ports(&self) -> &[u16] {
        &self.service_ports
    }

    /// Resolves with the first failure of any program.
    pub async fn failed(&self) -> String {
        let mut rx = self.failure.subscribe();
        let first = rx.wait_for(|f| f.is_some()).await.map(|f| f.clone());
        match first {
            Ok(f) => f.unwrap_or_default(),
            // The sender lives as long as `self`: never reached.
            Err(_) => std::future::pending().await,
        }
    }

    /// The first failure of any program, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// What a program said it lacks, by exiting with status 3 before the
    /// run began to act.
    pub fn lacking(&self) -> Option<String> {
        self.lacking.get().cloned()
    }

    /// Turns the nemesis on (while the workload runs) or off.
    pub fn set_acting(&self, on: bool) {
        self.acting.send_replace(on);
    }

    /// Waits until every relay under test has shown its database session
    /// and every instance of the notifier under test is a member of the
    /// group, or says why not: a failed program, or a ready timeout.
    pub async fn ready(&self, ctx: &Ctx) -> Result<(), String> {
        self.relays_shown(ctx).await?;
        let Some((command, instances)) = &self.notifier else {
            return match self.failure.borrow().clone() {
                Some(f) => Err(f),
                None => Ok(()),
            };
        };
        let limit = ctx.scenario.notifier.ready_timeout;
        let started = Instant::now();
        let mut seen = (0, String::new());
        while started.elapsed() < limit {
            if let Some(f) = self.failure.borrow().clone() {
                return Err(f);
            }
            match ctx.broker.group(&ctx.names.group).await {
                Ok(Some(g)) if g.members >= *instances => {
                    info!(ms = started.elapsed().as_millis() as u64, members = g.members, "notifier group settled");
                    watch_group(ctx);
                    return Ok(());
                }
                Ok(Some(g)) => seen = (g.members, String::new()),
                Ok(None) => {
                    // The mock cluster cannot list groups: nothing to wait on.
                    warn!("the broker cannot describe consumer groups; starting without waiting for the group");
                    return Ok(());
                }
                Err(e) => seen.1 = format!(" (reading the group failed: {e})"),
            }
            tokio::time::sleep(READY_POLL).await;
        }
        Err(format!(
            "{} of {} instances of the notifier command `{}` joined group {} within {} s{}; {}",
            seen.0,
            instances,
            command.shown(),
            ctx.names.group,
            limit.as_secs(),
            seen.1,
            self.stderr_of_first()
        ))
    }

    /// Waits until each relay slot under test has shown a database session
    /// (`PGAPPNAME`): a relay that needs time to start (a Kafka Connect
    /// worker registering its connector) must be running before the first
    /// event is written, or a change-data-capture reader would never see it.
    async fn relays_shown(&self, ctx: &Ctx) -> Result<(), String> {
        let limit = ctx.scenario.relay.ready_timeout;
        let started = Instant::now();
        loop {
            if let Some(f) = self.failure.borrow().clone() {
                return Err(f);
            }
            let waiting: Vec<&str> = self
                .relays
                .iter()
                .filter(|(_, shown)| !shown.load(std::sync::atomic::Ordering::SeqCst))
                .map(|(name, _)| name.as_str())
                .collect();
            if waiting.is_empty() {
                if !self.relays.is_empty() {
                    info!(ms = started.elapsed().as_millis() as u64, "every relay under test shows its session");
                }
                return Ok(());
            }
            if started.elapsed() >= limit {
                return Err(format!(
                    "{} showed no database session (PGAPPNAME) within {} s; raise `[relay] ready_timeout_secs` if it starts slowly; {}",
                    waiting.join(", "),
                    limit.as_secs(),
                    self.stderr_of_first()
                ));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// "notifier-1's stderr ends: …" for the first slot of each program,
    /// for errors about the whole run (a drain that did not end).
    pub fn stderr_of_first(&self) -> String {
        let log = self.logs.display();
        let mut parts = Vec::new();
        for (name, tail) in self.tails.iter().filter(|(n, _)| n.ends_with("-1")) {
            let lines: Vec<String> = lock(tail).iter().cloned().collect();
            parts.push(match lines.is_empty() {
                true => format!("{name}'s stderr is empty"),
                false => format!("{name}'s stderr ends: {}", lines.join(" | ")),
            });
        }
        format!("{} (logs in {log})", parts.join("; "))
    }
}

/// A slot's environment. A service gets a port of its own, kept across
/// incarnations, so the workload finds a restarted service where it was.
/// Behind the fault proxy, the slot's process talks to the database (and
/// the broker) through its own ports, and the proxy gets the keeper's
/// line to ask for its kill (db.kill_after_commit).
fn slot_env(
    mut env: Env,
    role: Role,
    proxy_slot: Option<&crate::nemesis::proxy::Slot>,
    lanes: Option<&crate::nemesis::proxy::Lanes>,
    kill: &tokio::sync::mpsc::UnboundedSender<Struck>,
    service_ports: &mut Vec<u16>,
) -> crate::error::Result<Env> {
    if role == Role::Service {
        let port = free_port()?;
        service_ports.push(port);
        env.0.push(("CHAOS_PORT", port.to_string()));
    }
    if let (Some(slot), Some(l)) = (proxy_slot, lanes) {
        env.0.retain(|(k, _)| *k != "CHAOS_DATABASE_URL");
        env.0.push(("CHAOS_DATABASE_URL", l.url_of(slot)));
        if let Some(kafka) = slot.kafka {
            env.0.retain(|(k, _)| *k != "CHAOS_BROKERS");
            env.0.push(("CHAOS_BROKERS", kafka.to_string()));
        }
        *lock(&slot.process.keeper) = Some(kill.clone());
    }
    Ok(env)
}

/// A port on 127.0.0.1 that nothing listens on now, released for the
/// service to bind, and bound again by each restart. It is taken below the
/// kernel's ephemeral range: a port the kernel picked (bind to port 0) can
/// be handed, once released, to any outgoing connection as its local port
/// (a Kafka Connect worker opens dozens), and the service's bind then
/// fails with "address already in use", as it once did in a Debezium run.
fn free_port() -> crate::error::Result<u16> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const FROM: u16 = 10_000;
    if ephemeral_from > FROM + 1_000 {
        for _ in 0..200 {
            let port = rand::Rng::gen_range(&mut rand::thread_rng(), FROM..ephemeral_from);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| crate::Error::Internal(format!("finding a free port for a service: {e}")))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| crate::Error::Internal(format!("finding a free port: {e}")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the components' database is: what a process is told to open.
pub enum Database {
    Postgres(String),
    Sqlite(PathBuf),
}
