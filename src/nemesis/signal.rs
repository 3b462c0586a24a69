//! The one place the harness sends a signal, and the one record of which
//! process a slot holds.
//!
//! Every SIGKILL, SIGSTOP, SIGCONT and SIGTERM the harness sends goes
//! through [`send`]. It refuses what no fault may ever reach: a pid or a
//! process group of 1 or less (`kill(0, …)` is the caller's own group,
//! `kill(-1, …)` every process it may signal), `chaos`'s own pid, the
//! leader of its process group, and that group. A refusal is a harness
//! error: logged, counted ([`refusals`]) and returned.
//!
//! A slot's process is struck from several places at once: its keeper
//! (random kills, pauses, the stop), the fault proxy (a kill after an
//! acknowledgement) and the per-message nemesis (through the keeper). An
//! [`Occupant`] is what they share, and it keeps two rules:
//! - a process enters it with the pid the kernel gave it and leaves it once
//!   it has ended but *before* it is reaped ([`Exit`] sees the end without
//!   reaping). A pid it holds can so never be recycled: a signal it sends
//!   reaches a live (or zombie) child of the run, or nothing;
//! - one kill claims an incarnation. A second striker finds it claimed, or
//!   the slot empty, and strikes nothing;
//! - one fault at a time. A fault that lasts (a held `COMMIT`, a pause)
//!   *occupies* the incarnation until it resolves, and no other striker
//!   draws on it meanwhile: its window is no occurrence of theirs, so it is
//!   neither fired nor pre-empted. Only the occupying fault may go on to
//!   kill it (a hold whose offsets moved). Faults so compose the way
//!   Jepsen's combined nemesis schedules them, one per process at a time,
//!   instead of the strongest erasing the others: a kill drawn while a
//!   service's `COMMIT` is held waits for the next window after the hold,
//!   and the hold's reorder reaches the relays.

use crate::faults::FaultPoint;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::error;

/// Whom a signal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One process, by its pid (a broker found by its port).
    Process(i32),
    /// A process group, by its id: a component's incarnation and whatever
    /// it started.
    Group(i32),
}

/// What came of a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Delivered,
    /// No such process or group any more: it ended first. A normal outcome.
    Gone,
    /// The guard refused it: a harness error, logged.
    Refused,
    /// kill(2) failed otherwise; the errno.
    Failed(i32),
}

static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Signals the guard refused in this process so far.
pub fn refusals() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Sends `sig` to `target`, unless the guard refuses it.
pub fn send(target: Target, sig: i32) -> Sent {
    if let Some(why) = forbidden(target) {
        REFUSED.fetch_add(1, Ordering::Relaxed);
        error!(?target, signal = sig, "harness error: refused to send a signal to {why}");
        return Sent::Refused;
    }
    #[cfg(test)]
    tests::record(target, sig);
    let raw = match target {
        Target::Process(p) => p,
        Target::Group(g) => -g,
    };
    // SAFETY: kill(2) has no memory effects on this process, and the guard
    // above keeps it away from this process and its group.
    match unsafe { libc::kill(raw, sig) } {
        0 => Sent::Delivered,
        _ => match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => Sent::Gone,
            e => Sent::Failed(e.unwrap_or(0)),
        },
    }
}

/// Why `target` must never be signalled, if it must not.
fn forbidden(target: Target) -> Option<String> {
    let own = std::process::id() as i32;
    // SAFETY: getpgrp(2) cannot fail and touches no memory.
    let own_group = unsafe { libc::getpgrp() };
    match target {
        Target::Process(p) | Target::Group(p) if p <= 1 => {
            Some(format!("{target:?}: an id of 1 or less reaches this process's own group, init, or every process"))
        }
        Target::Process(p) if p == own => Some(format!("pid {p}: chaos itself")),
        Target::Process(p) if p == own_group => {
            Some(format!("pid {p}: the leader of chaos's own process group (what launched it)"))
        }
        Target::Group(g) if g == own_group || g == own => Some(format!("process group {g}: chaos's own")),
        _ => None,
    }
}

/// How long a woken zombie stays out of the other faults' reach after its
/// SIGCONT, whichever fault stopped it (a pause, or a stop inside its
/// transaction): its time to act on what it held.
pub const PAUSE_AFTERMATH: std::time::Duration = std::time::Duration::from_secs(3);

/// The process a slot holds now, shared by everything that may strike it.
#[derive(Default)]
pub struct Occupant {
    now: Mutex<Option<Live>>,
    /// The last incarnation's serial: a claim names the one it was made on.
    serials: AtomicU64,
    /// Counts the pauses the keeper ended (or could not begin): what a
    /// striker that asked for a pause waits on.
    wakes: std::sync::OnceLock<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug)]
struct Live {
    pgid: i32,
    serial: u64,
    /// A kill has claimed this incarnation.
    claimed: bool,
    /// A fault that lasts is under way on it (a held COMMIT, a pause): no
    /// other striker draws until it resolves.
    occupied_by: Option<FaultPoint>,
}

/// A kill claimed on one incarnation: its holder alone may send it SIGSTOP
/// (to look at it first) and SIGKILL.
#[derive(Debug)]
pub struct Claim {
    pgid: i32,
    serial: u64,
}

/// A kill decided outside a slot's keeper, told to it: the point, the
/// incarnation it was claimed on, and the claim itself when the keeper is
/// the one to send the signal (None: the striker sent it already).
pub type Struck = (FaultPoint, u64, Option<Claim>);

/// An incarnation's place in its slot. Dropped, however its keeper ends,
/// it kills the incarnation's process group if it is still there.
pub struct Lease {
    occupant: Arc<Occupant>,
    serial: u64,
    pgid: i32,
}

impl Claim {
    /// The incarnation the claim was made on.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl Occupant {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Live>> {
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A child just started, in a process group of its own whose id is its
    /// pid. Refused for a pid the guard would refuse, or while another
    /// incarnation is still held.
    pub fn enter(self: &Arc<Self>, pid: i32) -> Result<Lease, String> {
        if let Some(why) = forbidden(Target::Group(pid)) {
            return Err(format!("its process id cannot be signalled safely: {why}"));
        }
        let mut now = self.lock();
        if let Some(live) = &*now {
            return Err(format!("the slot still holds process group {}", live.pgid));
        }
        let serial = self.serials.fetch_add(1, Ordering::Relaxed) + 1;
        *now = Some(Live { pgid: pid, serial, claimed: false, occupied_by: None });
        Ok(Lease { occupant: self.clone(), serial, pgid: pid })
    }

    /// Whether the slot holds an incarnation that no kill has claimed.
    pub fn holds(&self) -> bool {
        self.current().is_some()
    }

    /// The serial of the incarnation the slot holds, if no kill has
    /// claimed it: what a fault that acts later (a held COMMIT) names.
    pub fn current(&self) -> Option<u64> {
        self.lock().as_ref().filter(|l| !l.claimed).map(|l| l.serial)
    }

    /// [`Occupant::claim`], only while the slot still holds incarnation
    /// `serial`: a kill decided on one incarnation never lands on the next.
    pub fn claim_on(&self, serial: u64, decide: impl FnOnce() -> bool) -> Option<Claim> {
        let mut now = self.lock();
        let live = now.as_mut().filter(|l| !l.claimed && l.occupied_by.is_none() && l.serial == serial)?;
        if !decide() {
            return None;
        }
        live.claimed = true;
        Some(Claim { pgid: live.pgid, serial: live.serial })
    }

    /// Claims the slot's incarnation for a kill. `decide` (the fault's
    /// draw) runs only when there is an unclaimed incarnation that no
    /// lasting fault occupies, under the lock, so a draw is an occurrence
    /// only when there is something to strike, and two strikers never both
    /// claim one incarnation.
    pub fn claim(&self, decide: impl FnOnce() -> bool) -> Option<Claim> {
        let serial = self.current()?;
        self.claim_on(serial, decide)
    }

    /// Occupies the slot's incarnation with a fault that lasts (`point`):
    /// `decide` (its draw) runs only when the incarnation is unclaimed and
    /// unoccupied, under the lock. Returns the serial to
    /// [`Occupant::release`] once the fault resolves.
    pub fn occupy(&self, point: FaultPoint, decide: impl FnOnce() -> bool) -> Option<u64> {
        let mut now = self.lock();
        let live = now.as_mut().filter(|l| !l.claimed && l.occupied_by.is_none())?;
        if !decide() {
            return None;
        }
        live.occupied_by = Some(point);
        Some(live.serial)
    }

    fn wake_channel(&self) -> &tokio::sync::watch::Sender<u64> {
        self.wakes.get_or_init(|| tokio::sync::watch::channel(0).0)
    }

    /// What a striker that asked the keeper for a pause waits on: it
    /// changes when the keeper woke the process, or found it could not
    /// stop it.
    pub fn wakes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.wake_channel().subscribe()
    }

    /// The keeper's word that a pause asked for from outside is over.
    pub fn woke(&self) {
        self.wake_channel().send_modify(|n| *n += 1);
    }

    /// The lasting fault on incarnation `serial` resolved: others may draw
    /// on it again. A no-op once the incarnation has left.
    pub fn release(&self, serial: u64) {
        if let Some(l) = self.lock().as_mut().filter(|l| l.serial == serial) {
            l.occupied_by = None;
        }
    }

    /// The occupying fault's own kill (a hold whose offsets moved): claimed
    /// only by the fault that occupies incarnation `serial`.
    pub fn claim_occupied(&self, serial: u64, point: FaultPoint) -> Option<Claim> {
        let mut now = self.lock();
        let live = now.as_mut().filter(|l| !l.claimed && l.serial == serial && l.occupied_by == Some(point))?;
        live.claimed = true;
        Some(Claim { pgid: live.pgid, serial: live.serial })
    }

    /// A claimed kill's signal, sent only while its incarnation is still
    /// the slot's: once it left, the signal finds it gone.
    pub fn signal_claimed(&self, claim: &Claim, sig: i32) -> Sent {
        let now = self.lock();
        match &*now {
            Some(l) if l.serial == claim.serial => send(Target::Group(claim.pgid), sig),
            _ => Sent::Gone,
        }
    }

    /// A signal that does not end the incarnation (a pause, or its end):
    /// sent only while the slot holds one that no kill has claimed.
    pub fn signal_unclaimed(&self, lease: &Lease, sig: i32) -> Sent {
        let now = self.lock();
        match &*now {
            Some(l) if l.serial == lease.serial && !l.claimed => send(Target::Group(l.pgid), sig),
            _ => Sent::Gone,
        }
    }

    /// The keeper's own signal to its incarnation, claimed or not: its
    /// stop at the run's end, and a kill whose claimer has not acted in
    /// time. Still only while the incarnation is the slot's.
    pub fn signal_held(&self, lease: &Lease, sig: i32) -> Sent {
        let now = self.lock();
        match &*now {
            Some(l) if l.serial == lease.serial => send(Target::Group(l.pgid), sig),
            _ => Sent::Gone,
        }
    }

    /// The incarnation ended (its leader is a zombie, not yet reaped): what
    /// it left in its group is killed, and the slot is empty. Its pid is
    /// free to be reaped after this, and never signalled again.
    fn leave(&self, serial: u64) {
        let mut now = self.lock();
        if let Some(l) = now.as_ref().filter(|l| l.serial == serial) {
            send(Target::Group(l.pgid), libc::SIGKILL);
            *now = None;
        }
    }
}

impl Lease {
    /// The incarnation's process group id (its leader's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// The incarnation's serial in its slot.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The leader was seen to end, unreaped: empty the slot (killing what
    /// the leader left in its group). Call before reaping.
    pub fn ended(&self) {
        self.occupant.leave(self.serial);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.occupant.leave(self.serial);
    }
}

/// Sees a child end without reaping it, so that its pid stays its own
/// until the slot lets it go: a pidfd that polls readable at the exit, or,
/// where the kernel has none, `waitid(WNOWAIT)` every few milliseconds.
pub struct Exit {
    pid: i32,
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Exit {
    /// Call while `pid` is an unreaped child of this process.
    pub fn watch(pid: i32) -> Exit {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd
        // or -1; the fd is owned from here on.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        let fd = (raw >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) }).and_then(|fd| {
            // SAFETY: the fd is owned by the AsyncFd, so it stays open for
            // as long as it is registered.
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
        });
        Exit { pid, fd }
    }

    /// Returns once the child has ended; it is left unreaped.
    pub async fn wait(&self) {
        if let Some(fd) = &self.fd {
            // A pidfd polls readable once its process has exited, and stays so.
            if fd.readable().await.is_ok() {
                return;
            }
        }
        while !self.ended() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether the child has ended (exited or killed), without reaping it.
    pub fn ended(&self) -> bool {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::waitid(libc::P_PID, self.pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
        };
        // An error (ECHILD) means it was reaped already: ended too.
        r != 0 || unsafe { info.si_pid() } != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Every signal sent in this test process, with whether its target was
    /// then an unreaped child of this process (the race test's evidence).
    static SENT: Mutex<Vec<(Target, i32, bool)>> = Mutex::new(Vec::new());

    pub(super) fn record(target: Target, sig: i32) {
        let id = match target {
            Target::Process(p) | Target::Group(p) => p,
        };
        let ours = parent_of(id) == Some(std::process::id() as i32);
        SENT.lock().unwrap_or_else(|p| p.into_inner()).push((target, sig, ours));
    }

    fn parent_of(pid: i32) -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    }

    #[test]
    fn the_guard_refuses_this_process_its_group_and_ids_of_one_or_less() {
        let own = std::process::id() as i32;
        let group = unsafe { libc::getpgrp() };
        // Signal 0 only asks whether the target exists: harmless even if
        // the guard were gone, which this test would then show.
        for t in [Target::Process(0), Target::Group(0), Target::Process(1), Target::Group(1), Target::Process(-5)] {
            assert_eq!(send(t, 0), Sent::Refused, "{t:?}");
        }
        assert_eq!(send(Target::Process(own), 0), Sent::Refused);
        assert_eq!(send(Target::Group(group), 0), Sent::Refused);
        assert_eq!(send(Target::Process(group), 0), Sent::Refused);
        assert!(refusals() >= 8);
        // A process that is gone is a normal outcome, not a refusal.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert_eq!(send(Target::Process(pid), 0), Sent::Gone);
    }

    #[test]
    fn an_occupant_takes_no_made_up_pid_and_one_kill_claims_an_incarnation() {
        let o = Arc::new(Occupant::default());
        if let Ok(wrong) = o.enter(0) {
            // Its drop would be kill(0, SIGKILL): this test's own group.
            std::mem::forget(wrong);
            panic!("pid 0 was taken as a slot's process");
        }
        assert!(o.claim(|| true).is_none(), "an empty slot has nothing to claim");
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let pid = child.id() as i32;
        let lease = o.enter(pid).unwrap();
        assert!(o.enter(pid + 1).is_err(), "one incarnation at a time");
        let mut drawn = 0;
        assert!(
            o.claim(|| {
                drawn += 1;
                false
            })
            .is_none(),
            "a draw that does not fire claims nothing"
        );
        let first = o
            .claim(|| {
                drawn += 1;
                true
            })
            .expect("the first kill claims it");
        assert!(
            o.claim(|| {
                drawn += 1;
                true
            })
            .is_none(),
            "a second finds it claimed"
        );
        assert_eq!(drawn, 2, "a claimed incarnation is no occurrence for another striker");
        assert_eq!(o.signal_unclaimed(&lease, libc::SIGSTOP), Sent::Gone, "no pause on a claimed incarnation");
        assert_eq!(o.signal_claimed(&first, libc::SIGKILL), Sent::Delivered);
        child.wait().unwrap();
        lease.ended();
        assert_eq!(o.signal_claimed(&first, libc::SIGKILL), Sent::Gone, "gone once it left");
        assert!(!o.holds());
    }

    /// A lasting fault occupies its incarnation: while it is under way no
    /// other striker draws (no firing, so nothing to pre-empt), a second
    /// lasting fault is refused, and only the occupying fault may claim the
    /// kill. Released, the others draw again.
    #[test]
    fn a_lasting_fault_holds_off_every_other_striker_until_it_resolves() {
        let o = Arc::new(Occupant::default());
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let lease = o.enter(child.id() as i32).unwrap();
        let hold = FaultPoint::DbHoldCommit;
        let serial = o.occupy(hold, || true).expect("an unoccupied incarnation takes a hold");
        let drawn = std::cell::Cell::new(0);
        let draw = || {
            drawn.set(drawn.get() + 1);
            true
        };
        assert!(o.claim(draw).is_none(), "no kill on an occupied incarnation");
        assert!(o.claim_on(serial, draw).is_none(), "nor one aimed at its serial");
        assert!(o.occupy(FaultPoint::ProcessPause, draw).is_none(), "nor a pause over the hold");
        assert_eq!(drawn.get(), 0, "an occupied incarnation is no occurrence of another fault");
        assert!(o.claim_occupied(serial, FaultPoint::ProcessPause).is_none(), "only the occupier's own kill");
        o.release(serial);
        assert!(o.claim_occupied(serial, hold).is_none(), "a released hold claims nothing");
        let kill = o.claim(draw).expect("released, the others draw again");
        assert_eq!(drawn.get(), 1);
        o.signal_claimed(&kill, libc::SIGKILL);
        child.wait().unwrap();
        lease.ended();
        // Occupied, then killed by its own fault.
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let lease = o.enter(child.id() as i32).unwrap();
        let serial = o.occupy(hold, || true).unwrap();
        let own = o.claim_occupied(serial, hold).expect("the hold may kill what it holds");
        assert_eq!(o.signal_claimed(&own, libc::SIGKILL), Sent::Delivered);
        child.wait().unwrap();
        lease.ended();
        o.release(serial);
        assert!(!o.holds());
    }

    use std::os::unix::process::CommandExt;

    /// The strikers' race of issue 41, run in a child test process in a
    /// process group of its own: were a signal to reach the test's own
    /// group, only that child would die, and this test would see it.
    #[test]
    fn strikers_racing_on_one_slot_never_signal_anything_but_its_live_process() {
        const INNER: &str = "CHAOS_SIGNAL_RACE_INNER";
        if std::env::var_os(INNER).is_some() {
            return race();
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "nemesis::signal::tests::strikers_racing_on_one_slot_never_signal_anything_but_its_live_process",
            ])
            .args(["--nocapture", "--test-threads", "1"])
            .env(INNER, "1")
            .process_group(0)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            None,
            "the test process was killed by signal {:?}: {text}",
            out.status.signal()
        );
        assert!(out.status.success(), "the race failed: {text}");
        assert!(text.contains("1 passed"), "the inner test did not run: {text}");
    }

    /// Three strikers claiming the slot's occupant and killing what they
    /// claim, the keeper's way (stopped to look at, then killed).
    fn strikers(
        o: &Arc<Occupant>,
        stop: &Arc<std::sync::atomic::AtomicBool>,
        kills: &Arc<AtomicU64>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..3u64)
            .map(|s| {
                let (o, stop, kills) = (o.clone(), stop.clone(), kills.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        if let Some(c) = o.claim(|| (n + s).is_multiple_of(3)) {
                            o.signal_claimed(&c, libc::SIGSTOP);
                            if o.signal_claimed(&c, libc::SIGKILL) == Sent::Delivered {
                                kills.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect()
    }

    /// A striker with what a pid read as 0, or a stale id, would send: every
    /// one refused.
    fn rogue(stop: &Arc<std::sync::atomic::AtomicBool>) -> tokio::task::JoinHandle<()> {
        let stop = stop.clone();
        tokio::spawn(async move {
            let own = std::process::id() as i32;
            let group = unsafe { libc::getpgrp() };
            while !stop.load(Ordering::Relaxed) {
                for t in [Target::Group(0), Target::Process(0), Target::Process(own), Target::Group(group)] {
                    assert_eq!(send(t, libc::SIGKILL), Sent::Refused);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    }

    /// One incarnation of `argv` in the slot, paused by its keeper while
    /// the strikers race to kill it, and stopped by the keeper when none
    /// did. False when it could not start.
    async fn one_incarnation(o: &Arc<Occupant>, argv: &[&str]) -> bool {
        let mut cmd = tokio::process::Command::new(argv[0]);
        cmd.args(&argv[1..]).process_group(0).kill_on_drop(true);
        let Ok(mut child) = cmd.spawn() else { return false };
        let pid = child.id().expect("a child just started has its id") as i32;
        let exit = Exit::watch(pid);
        let lease = o.enter(pid).unwrap();
        // The keeper's own pauses, racing the strikers' kills.
        let pauser = {
            let o = o.clone();
            async move {
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    o.signal_unclaimed(&lease, libc::SIGSTOP);
                    o.signal_unclaimed(&lease, libc::SIGCONT);
                }
                lease
            }
        };
        let lease = pauser.await;
        // No striker claimed a sleeper within 20 ms: the keeper's
        // own stop (as at the run's end).
        if tokio::time::timeout(Duration::from_millis(20), exit.wait()).await.is_err() {
            if let Some(c) = o.claim(|| true) {
                o.signal_claimed(&c, libc::SIGKILL);
            }
            // A stopped leader (claimed by a striker) is killed by it.
            tokio::time::timeout(Duration::from_secs(10), exit.wait()).await.expect("the incarnation ended");
        }
        lease.ended();
        drop(lease);
        child.wait().await.unwrap();
        true
    }

    /// One slot; a keeper starting incarnations (some that die at start,
    /// some whose start fails), three strikers killing and pausing it at
    /// once, and a rogue striker with a made-up pid 0 and this process's
    /// own ids, for many rounds.
    fn race() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
        rt.block_on(async {
            let o = Arc::new(Occupant::default());
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let kills = Arc::new(AtomicU64::new(0));
            let strikers = strikers(&o, &stop, &kills);
            let rogue = rogue(&stop);
            let (mut started, mut failed) = (0, 0);
            for round in 0..300u32 {
                let argv: &[&str] = match round % 5 {
                    0 => &["/nonexistent/chaos-race-program"],
                    1 | 2 => &["true"],
                    _ => &["sleep", "5"],
                };
                match one_incarnation(&o, argv).await {
                    true => started += 1,
                    false => failed += 1,
                }
            }
            stop.store(true, Ordering::Relaxed);
            for s in strikers {
                s.await.unwrap();
            }
            rogue.await.unwrap();
            let sent = SENT.lock().unwrap().clone();
            let strays: Vec<_> = sent.iter().filter(|(_, _, ours)| !ours).collect();
            assert!(strays.is_empty(), "signals that reached no unreaped child of the run: {strays:?}");
            assert!(failed > 0 && started > 200, "started {started}, failed {failed}");
            assert!(kills.load(Ordering::Relaxed) > 10, "the strikers killed {} times", kills.load(Ordering::Relaxed));
            println!(
                "race: {started} incarnations, {failed} failed starts, {} signals, {} kills by strikers",
                sent.len(),
                kills.load(Ordering::Relaxed)
            );
        });
    }
}
