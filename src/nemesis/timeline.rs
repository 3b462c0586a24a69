//! Service faults on a timeline: the scenario's `[[nemesis.timeline]]`
//! pauses or kills the broker, restarts PostgreSQL, terminates the run's
//! database sessions, or has the fault proxy partition (`net.blackhole`)
//! or reset (`net.reset`) every proxied component, at a time after the
//! workload starts and, with `every`, again and again until the pipeline
//! has drained.
//!
//! The broker is found by the port it listens on (the kernel's socket
//! table names the owning process), so any local Kafka will do; it is
//! restarted, and PostgreSQL restarted, by the commands in `[nemesis]`
//! (`scripts/services.sh` by default). Each act is confirmed by what the
//! harness sees afterwards: the broker stopped in `/proc`, the broker gone
//! and its port open again, the postmaster's start time moved, sessions
//! terminated, connections reset, reads held by the partition.

use crate::context::Ctx;
use crate::error::{Error, Result};
use crate::faults::FaultPoint;
use crate::nemesis::acting::Watch;
use crate::nemesis::proxy::Slot;
use crate::scenario::Timed;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// How long a restart command may take before the act counts as failed.
const RESTART_LIMIT: Duration = Duration::from_secs(120);
/// How long a signalled process may take to be seen stopped or gone.
const SEEN: Duration = Duration::from_secs(5);

/// Starts one task per timeline entry; each waits for `acting` (the
/// workload's start), then strikes on its schedule while acting lasts.
/// `slots` are the fault proxy's, which the `net.*` entries strike.
pub fn start(ctx: &Ctx, acting: Watch, slots: Vec<Arc<Slot>>) -> Vec<crate::context::Named> {
    ctx.scenario
        .timeline
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = format!("nemesis {} #{}", t.point.name(), i + 1);
            (name, tokio::spawn(follow(ctx.clone(), t.clone(), acting.clone(), slots.clone())))
        })
        .collect()
}

async fn follow(ctx: Ctx, t: Timed, acting: Watch, slots: Vec<Arc<Slot>>) {
    let mut shutdown = ctx.shutdown.clone();
    let mut on = acting.on.clone();
    tokio::select! {
        r = on.wait_for(|a| *a) => if r.is_err() { return },
        _ = shutdown.wait() => return,
    }
    let mut next = Instant::now() + t.at;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.wait() => return,
        }
        // A service fault (a broker or PostgreSQL taken down) holds the
        // guard through its act: stopping the faults waits for the service
        // to be back. A proxy fault does not: a partition is the proxy's
        // state, and a planted one is meant to outlast the faults
        // (examples/debezium/planted-stall.toml).
        let Some(guard) = acting.act().await else { return };
        let _held = t.point.is_service().then_some(guard);
        let target = target_of(&ctx, t.point);
        if has_target(&ctx, t.point, &slots).await
            && ctx.faults.strike(t.point, &target, || describe(&t, ctx.broker.embedded()))
        {
            match act(&ctx, &t, &slots).await {
                Ok(()) => ctx.faults.confirm(t.point, 1),
                Err(e) => warn!(point = t.point.name(), cause = %e, "a service fault did not have its effect"),
            }
        }
        match t.every {
            Some(every) => next += every,
            None => return,
        }
    }
}

fn target_of(ctx: &Ctx, point: FaultPoint) -> String {
    match point {
        FaultPoint::BrokerPause | FaultPoint::BrokerKill => format!("broker {}", ctx.broker.bootstrap()),
        FaultPoint::BrokerKillLeader => format!("the leader of {} partition 0", ctx.names.topic),
        FaultPoint::NetReset | FaultPoint::NetBlackhole => "every proxied component".into(),
        _ => format!("PostgreSQL {}", ctx.store.endpoint()),
    }
}

fn describe(t: &Timed, embedded: bool) -> String {
    match t.point {
        FaultPoint::BrokerPause if embedded => format!("mock round trip of {} ms", t.lasts.as_millis()),
        FaultPoint::BrokerKill if embedded => format!("mock broker down for {} ms", t.lasts.as_millis()),
        FaultPoint::BrokerPause => format!("SIGSTOP, SIGCONT after {} ms", t.lasts.as_millis()),
        FaultPoint::BrokerKill => format!("SIGKILL, restarted after {} ms", t.lasts.as_millis()),
        FaultPoint::BrokerKillLeader => format!("SIGKILL to the leader, restarted after {} ms", t.lasts.as_millis()),
        FaultPoint::DbRestart => "restart in immediate mode".into(),
        FaultPoint::NetReset => "every proxied connection reset".into(),
        FaultPoint::NetBlackhole => format!("every proxied byte held for {} ms", t.lasts.as_millis()),
        _ => "the run's sessions terminated".into(),
    }
}

async fn act(ctx: &Ctx, t: &Timed, slots: &[Arc<Slot>]) -> Result<()> {
    match t.point {
        FaultPoint::BrokerPause | FaultPoint::BrokerKill if ctx.broker.embedded() => {
            mock_outage(ctx, t.point, t.lasts).await
        }
        FaultPoint::BrokerPause => pause_broker(ctx, t.lasts).await,
        FaultPoint::BrokerKill => kill_broker(ctx, t.lasts).await,
        FaultPoint::BrokerKillLeader => kill_leader(ctx, t.lasts).await,
        FaultPoint::DbRestart => restart_database(ctx).await,
        FaultPoint::DbTerminateBackends => terminate_backends(ctx).await,
        FaultPoint::NetReset => match slots.iter().map(|s| s.reset_all()).sum::<usize>() {
            0 => Err(Error::Internal("no proxied connection was open to reset".into())),
            n => {
                info!(connections = n, "every proxied connection reset");
                Ok(())
            }
        },
        FaultPoint::NetBlackhole => blackhole(ctx, slots, t.lasts).await,
        other => Err(Error::Internal(format!("{} is not a service fault", other.name()))),
    }
}

/// The port of the first bootstrap address.
fn broker_port(ctx: &Ctx) -> Result<u16> {
    let first = ctx.broker.bootstrap().split(',').next().unwrap_or_default();
    first
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Error::Internal(format!("no port in the broker address {first}")))
}

/// The mock cluster's own controls, for the embedded mode: a pause is
/// every request answered only after the pause, a kill the broker down.
async fn mock_outage(ctx: &Ctx, point: FaultPoint, lasts: Duration) -> Result<()> {
    use crate::broker::Outage;
    let (start, end) = match point {
        FaultPoint::BrokerPause => (Outage::RoundTrip(lasts), Outage::RoundTrip(Duration::ZERO)),
        _ => (Outage::Down, Outage::Up),
    };
    let took = ctx.broker.outage(start);
    tokio::time::sleep(lasts).await;
    let back = ctx.broker.outage(end);
    match (took, back) {
        (true, true) => Ok(()),
        _ => Err(Error::Internal(format!("the mock cluster refused {start:?} or {end:?}"))),
    }
}

async fn pause_broker(ctx: &Ctx, lasts: Duration) -> Result<()> {
    let pid = listener_pid(broker_port(ctx)?)?;
    signal(pid, libc::SIGSTOP)?;
    let seen = wait_until(|| process_state(pid) == Some('T')).await;
    info!(pid, stopped = seen, "broker paused");
    tokio::time::sleep(lasts).await;
    signal(pid, libc::SIGCONT)?;
    match seen {
        true => Ok(()),
        false => Err(Error::Internal(format!("the broker (pid {pid}) was not seen stopped"))),
    }
}

async fn kill_broker(ctx: &Ctx, down: Duration) -> Result<()> {
    let port = broker_port(ctx)?;
    let pid = listener_pid(port)?;
    signal(pid, libc::SIGKILL)?;
    if !wait_until(|| process_state(pid).is_none()).await {
        return Err(Error::Internal(format!("the broker (pid {pid}) did not end after SIGKILL")));
    }
    info!(pid, "broker killed");
    tokio::time::sleep(down).await;
    run_command(&ctx.scenario.broker_restart, "nemesis.broker_restart").await?;
    let back = listener_pid(port)?;
    info!(pid = back, "broker restarted");
    Ok(())
}

/// How long a cluster may take to elect a partition's new leader.
const ELECTION: Duration = Duration::from_secs(20);

/// The node serving the topic's first lane, asked off the async threads.
async fn leader_of(ctx: &Ctx) -> Option<String> {
    let (broker, topic) = (ctx.broker.clone(), ctx.names.topic.clone());
    tokio::task::spawn_blocking(move || broker.serving_node(&topic)).await.ok().flatten()
}

/// `broker.kill_leader`: SIGKILL to the broker that leads partition 0 (found
/// by the port the metadata gives it), then wait for the cluster to elect
/// another leader, then restart the killed one.
async fn kill_leader(ctx: &Ctx, down: Duration) -> Result<()> {
    let leader = leader_of(ctx).await.ok_or_else(|| Error::Internal("the metadata named no leader".into()))?;
    let port = leader
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| Error::Internal(format!("the leader's address {leader} has no port")))?;
    let pid = listener_pid(port)?;
    signal(pid, libc::SIGKILL)?;
    if !wait_until(|| process_state(pid).is_none()).await {
        return Err(Error::Internal(format!("the leader (pid {pid}) did not end after SIGKILL")));
    }
    info!(pid, %leader, "partition leader killed");
    // The run may end while the cluster elects: the waits give way to the
    // shutdown, the restart never does (the broker must be back).
    let mut shutdown = ctx.shutdown.clone();
    let t = Instant::now();
    let mut moved = None;
    while t.elapsed() < ELECTION && !shutdown.is_set() {
        match leader_of(ctx).await {
            Some(l) if l != leader => {
                moved = Some(l);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    tokio::select! {
        _ = tokio::time::sleep(down.saturating_sub(t.elapsed())) => {}
        _ = shutdown.wait() => {}
    }
    run_command(&ctx.scenario.broker_restart, "nemesis.broker_restart").await?;
    listener_pid(port)?;
    match moved {
        Some(l) => {
            info!(new = %l, after_ms = t.elapsed().as_millis() as u64, "another broker leads the partition");
            Ok(())
        }
        None => Err(Error::Internal(format!("no other broker led the partition within {} s", ELECTION.as_secs()))),
    }
}

async fn restart_database(ctx: &Ctx) -> Result<()> {
    // The start time before, read on a session of its own (the run's pool
    // may hold dead connections, and the server may be busy): a few tries.
    let mut before = Err(Error::Internal("no try".into()));
    for _ in 0..20 {
        before = match harness_session(ctx).await {
            Ok(pg) => pg.postmaster_started().await,
            Err(e) => Err(e),
        };
        if before.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let before = before?;
    run_command(&ctx.scenario.database_restart, "nemesis.database_restart").await?;
    let deadline = Instant::now() + RESTART_LIMIT;
    while Instant::now() < deadline {
        let after = match harness_session(ctx).await {
            Ok(pg) => pg.postmaster_started().await.ok(),
            Err(_) => None,
        };
        if let Some(after) = after {
            if after != before {
                info!(%before, %after, "PostgreSQL restarted");
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Internal("PostgreSQL's postmaster start time did not change after the restart".into()))
}

async fn terminate_backends(ctx: &Ctx) -> Result<()> {
    let pg = harness_session(ctx).await?;
    // The sessions seen a moment ago may have closed since (a reset, a
    // component restarting): the next ones to open are taken.
    let t = Instant::now();
    while t.elapsed() < SEEN {
        let n = pg.terminate_run_sessions(&ctx.names.run_id).await?;
        if n > 0 {
            info!(sessions = n, "the run's database sessions terminated");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(Error::Internal(format!("no session of the run's components was open for {} s", SEEN.as_secs())))
}

/// A pool of the harness's own for one act: after a restart, the run's
/// pool may still hold connections the restart killed.
async fn harness_session(ctx: &Ctx) -> Result<crate::store::postgres::PgStore> {
    match &ctx.store {
        Store::Postgres(pg) => pg.fresh(1).await,
        Store::Sqlite(_) => Err(Error::Internal("this service fault needs PostgreSQL".into())),
    }
}

/// `net.blackhole` on a schedule: every proxied byte held for `lasts`,
/// both ways. Confirmed when traffic met it: a read of some slot held.
/// A partition longer than the run (a planted stall) ends with the run.
async fn blackhole(ctx: &Ctx, slots: &[Arc<Slot>], lasts: Duration) -> Result<()> {
    let held = || slots.iter().map(|s| s.held()).sum::<u64>();
    let before = held();
    let until = Instant::now() + lasts;
    for s in slots {
        s.blackhole_until(until);
    }
    let mut shutdown = ctx.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep_until(until) => {}
        _ = shutdown.wait() => {}
    }
    match held() - before {
        0 => Err(Error::Internal("no traffic met the partition".into())),
        n => {
            info!(reads = n, ms = lasts.as_millis() as u64, "a partition held traffic, then healed");
            Ok(())
        }
    }
}

/// Whether the fault has something to act on now. A session fault with
/// no component session open is no occurrence (a component may be between
/// sessions: restarting, or waiting on the broker after a restart killed
/// its session); it waits up to [`SEEN`] for one. So is a reset with no
/// proxied connection open, or a partition with no slot.
async fn has_target(ctx: &Ctx, point: FaultPoint, slots: &[Arc<Slot>]) -> bool {
    match point {
        FaultPoint::NetReset => return wait_until(|| slots.iter().any(|s| s.open() > 0)).await,
        FaultPoint::NetBlackhole => return !slots.is_empty(),
        FaultPoint::DbTerminateBackends => {}
        _ => return true,
    }
    // One session of the harness's for the whole wait: a pool per look
    // would open and close a connection ten times a second.
    let Ok(pg) = harness_session(ctx).await else { return false };
    let t = Instant::now();
    while t.elapsed() < SEEN {
        if pg.run_sessions(&ctx.names.run_id).await.unwrap_or(0) > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Runs a restart command from the current folder, bounded.
async fn run_command(argv: &[String], key: &str) -> Result<()> {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    // A broker restarted empty would lose the run's topic.
    cmd.args(&argv[1..]).env_remove("CHAOS_KAFKA_FRESH").stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(RESTART_LIMIT, cmd.output())
        .await
        .map_err(|_| Error::Internal(format!("`{key}` did not finish within {} s", RESTART_LIMIT.as_secs())))?
        .map_err(|e| Error::Internal(format!("`{key}` ({}) could not start: {e}", argv.join(" "))))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        return Err(Error::Internal(format!("`{key}` ({}) failed with {}: {last}", argv.join(" "), out.status)));
    }
    Ok(())
}

async fn wait_until(mut seen: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < SEEN {
        if seen() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A signal to the broker's process, through the harness's one signalling
/// function: refused (an error) if the port led to `chaos` itself, as when
/// the port is the fault proxy's.
fn signal(pid: i32, sig: i32) -> Result<()> {
    use crate::nemesis::signal::{send, Sent, Target};
    match send(Target::Process(pid), sig) {
        Sent::Delivered | Sent::Gone => Ok(()),
        Sent::Refused => Err(Error::Internal(format!(
            "refused to signal pid {pid}, the broker's port's listener: it is chaos itself or its launcher; point the broker fault at the broker's own port"
        ))),
        Sent::Failed(errno) => Err(Error::Internal(format!("signalling the broker (pid {pid}) failed: errno {errno}"))),
    }
}

/// A process's state letter from `/proc/<pid>/stat` (`T` stopped, `Z` a
/// zombie); None when it is gone. A zombie counts as gone.
fn process_state(pid: i32) -> Option<char> {
    crate::nemesis::process::program::process_state(pid).filter(|s| *s != 'Z')
}

/// The process listening on 127.0.0.1 (or any address) at `port`: the
/// socket's inode from `/proc/net/tcp*`, then the process holding it.
pub fn listener_pid(port: u16) -> Result<i32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            let local_port = f.get(1).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f.get(3) == Some(&"0A") {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    if inodes.is_empty() {
        return Err(Error::Internal(format!("nothing listens on port {port}")));
    }
    let procs = std::fs::read_dir("/proc").map_err(|e| Error::Internal(format!("reading /proc: {e}")))?;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Ok(pid);
                }
            }
        }
    }
    Err(Error::Internal(format!("port {port} listens, but no process of ours holds its socket")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_a_port_is_this_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listener_pid(port).unwrap(), std::process::id() as i32);
        drop(l);
        assert!(listener_pid(port).is_err());
    }

    #[test]
    fn this_process_is_running_and_a_dead_one_is_gone() {
        assert!(matches!(process_state(std::process::id() as i32), Some('R' | 'S')));
        assert_eq!(process_state(i32::MAX), None);
    }
}
