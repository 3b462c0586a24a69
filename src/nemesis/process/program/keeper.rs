//! A slot's keeper: it starts the program, keeps its output, and is the
//! nemesis for its process, one incarnation after another.

use super::*;
use crate::nemesis::signal::PAUSE_AFTERMATH;

/// One slot: its process, one incarnation after another.
pub(super) struct Keeper {
    pub(super) ctx: Ctx,
    /// The instance number (`notifier-2` is 2), under which its figures are kept.
    pub(super) slot: usize,
    /// Kills decided outside the keeper: the per-message nemesis's (for
    /// the keeper to send), the fault proxy's (which has sent SIGKILL).
    pub(super) kill_rx: tokio::sync::mpsc::UnboundedReceiver<Struck>,
    /// The slot's incarnation as every striker sees it: a kill is claimed
    /// on it once, and no signal reaches a process that left it.
    pub(super) occupant: Arc<Occupant>,
    pub(super) role: Role,
    /// The reference relay or notifier as `chaos component`, speaking the
    /// protocol of [`crate::harness::component`] on its stdout.
    pub(super) reference: bool,
    /// The pause before a killed process's slot starts again.
    pub(super) restart: Duration,
    /// A fault point that the next incarnation's start confirms.
    pub(super) confirm_on_start: Option<FaultPoint>,
    pub(super) name: String,
    pub(super) command: ProgramCommand,
    pub(super) env: Env,
    pub(super) logs: PathBuf,
    pub(super) failure: watch::Sender<Option<String>>,
    /// Set by a program that exited with status 3 before the run began to
    /// act: the contract's word for "my environment lacks something".
    pub(super) lacking: Arc<std::sync::OnceLock<String>>,
    pub(super) acting: watch::Receiver<bool>,
    pub(super) tail: Tail,
    pub(super) rng: rand::rngs::StdRng,
    /// Set once an incarnation shows its session: what the run waits for
    /// before its workload (a relay under test).
    pub(super) shown: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// A service's health URL: each incarnation is ready once it answers
    /// with a 2xx, not once its first session opens (a JVM's pool connects
    /// seconds before it serves).
    pub(super) health: Option<String>,
}

/// How much longer than a pause a zombie made inside its transaction
/// (`db.pause_in_transaction`) stays stopped: a pause outlasts the session
/// timeout by 2 s, and the group then still has to notice (a heartbeat, up
/// to 3 s), give the partitions away, and their new owner fetch the same
/// messages, all before the zombie goes on. At the pause alone, the new
/// owner of the orders example had not fetched them in 3 runs of 4.
const ZOMBIE_LONGER: Duration = Duration::from_secs(6);

/// What the keeper's watch of one incarnation tracks between its turns.
pub(super) struct Watch {
    /// Stopped by a pause until then.
    paused_until: Option<Instant>,
    /// Counted among the run's zombies while stopped: a drain's clock of
    /// no progress does not run while the nemesis holds a process stopped
    /// (a correct consumer's new owner waits on the zombie's claim).
    stopped: Option<crate::context::ZombieGuard>,
    /// The incarnation's serial while the pause occupies it (no other
    /// fault draws on a paused process): released [`PAUSE_AFTERMATH`]
    /// after its SIGCONT, at `release_at`.
    occupied: Option<u64>,
    release_at: Option<Instant>,
    /// The start of the second being drawn, and the instant within it.
    second: Instant,
    next: Instant,
    /// Whether the incarnation shows its session (see `Keeper::watch`).
    ready: bool,
    ready_check: Instant,
    /// A kill that came before the incarnation was ready.
    deferred: Option<(FaultPoint, Claim)>,
}

impl Watch {
    fn new(ready: bool) -> Self {
        let now = Instant::now();
        Self {
            paused_until: None,
            stopped: None,
            occupied: None,
            release_at: None,
            second: now,
            next: now,
            ready,
            ready_check: now,
            deferred: None,
        }
    }

    fn stop_until(&mut self, until: Instant, ctx: &Ctx) {
        self.paused_until = Some(until);
        self.stopped = Some(ctx.coord.zombie());
    }

    fn woke(&mut self) {
        self.paused_until = None;
        self.stopped = None;
    }

    /// Seconds are drawn from now on: a pause, readiness or the nemesis's
    /// switch restarts them.
    fn restart_seconds(&mut self, keeper: &mut Keeper) {
        self.second = Instant::now();
        self.next = self.second + keeper.instant_within_second();
    }
}

/// A running incarnation.
pub(super) struct Proc {
    child: Child,
    /// Protocol lines from a reference component's stdout.
    lines: tokio::sync::mpsc::UnboundedReceiver<Line>,
    fold: crate::nemesis::process::protocol::Fold,
    pid: i32,
    incarnation: u32,
    started: Instant,
    /// Sees the process end without reaping it.
    exit: Exit,
    /// Its place in the slot's occupant: left once it ended, before it is
    /// reaped; dropped, however the keeper ends, it kills the whole group.
    lease: Lease,
    /// How it ended, once reaped.
    status: Option<ExitStatus>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Proc {
    /// Waits for the process to end, empties the slot (killing what it
    /// left in its group), then reaps it.
    async fn end(&mut self) -> std::io::Result<ExitStatus> {
        self.exit.wait().await;
        self.lease.ended();
        let status = self.child.wait().await;
        self.status = status.as_ref().ok().copied();
        status
    }
}

/// How an incarnation ended.
pub(super) enum End {
    /// The nemesis killed it: start the next one.
    Killed,
    /// The run told it to stop.
    Stopped,
    /// It exited by itself: a failure of the program.
    Exited(ExitStatus),
    /// SIGKILL did not end it within [`SIGNAL_SEEN`].
    Unkillable,
}

impl Keeper {
    pub(super) async fn keep(mut self) {
        let mut shutdown = self.ctx.shutdown.clone();
        let mut incarnation = 0;
        while !shutdown.is_set() {
            let mut proc = match self.spawn(incarnation) {
                Ok(p) => p,
                Err(why) => return self.fail(why),
            };
            let end = self.watch(&mut proc).await;
            self.settle_struck(&proc);
            match end {
                End::Killed => {}
                End::Stopped => return,
                End::Unkillable => {
                    return self.fail(format!(
                        "{} (pid {}) did not end within {} s of SIGKILL; it is in an uninterruptible wait",
                        self.name,
                        proc.pid,
                        SIGNAL_SEEN.as_secs()
                    ))
                }
                // Told to stop just as it exited: not a failure.
                End::Exited(_) if shutdown.is_set() => return,
                End::Exited(status) => {
                    // Its last words are still in the pipes.
                    for r in proc.readers.drain(..) {
                        let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
                    }
                    let why = format!(
                        "{} (`{}`, pid {}, incarnation {}) exited on its own with {} after {:.1} s; {}",
                        self.name,
                        self.command.shown(),
                        proc.pid,
                        proc.incarnation,
                        describe(status),
                        proc.started.elapsed().as_secs_f64(),
                        self.stderr_tail()
                    );
                    self.lacks(status);
                    return self.fail(why);
                }
            }
            incarnation += 1;
            if shutdown.sleep(self.restart).await {
                return;
            }
        }
    }

    /// Kills other strikers claimed on an incarnation that has ended by
    /// another path (a crash point's halt, the run's stop, a kill of the
    /// keeper's): the process seen ending by SIGKILL confirms them too; any
    /// other end is logged with its reason. Every claimed kill's word is in
    /// the channel before its signal, so before the end is seen.
    fn settle_struck(&mut self, proc: &Proc) {
        let by_sigkill = proc.status.is_some_and(|s| s.signal() == Some(libc::SIGKILL));
        while let Ok((point, serial, _)) = self.kill_rx.try_recv() {
            if point == FaultPoint::DbPauseInTransaction {
                // A pause asked for, not a kill: the proxy counts its end.
                self.occupant.woke();
                continue;
            }
            match (serial == proc.lease.serial(), by_sigkill) {
                (true, true) => self.ctx.faults.confirm(point, 1),
                (true, false) => {
                    let how = proc.status.map_or_else(|| "unknown".into(), describe);
                    let why = format!("the process ended otherwise ({how}) before the kill landed");
                    self.ctx.faults.preempt(point, &self.name, &why);
                }
                (false, _) => self.ctx.faults.preempt(point, &self.name, "its incarnation had ended before the kill"),
            }
        }
    }

    /// Status 3 before the run acts (docs/contract.md, section 2): the
    /// program lacks a piece of its environment (jars not fetched, a
    /// database setting), which the run ends with exit 3 for, in the
    /// program's own last words, as it would for an unreachable database.
    fn lacks(&self, status: ExitStatus) {
        if status.code() != Some(3) || *self.acting.borrow() {
            return;
        }
        let last = lock(&self.tail).iter().last().cloned().unwrap_or_else(|| "its stderr is empty".into());
        let _ = self.lacking.set(format!(
            "{} exited with status 3 before the run began, so its environment lacks something: {last} (logs in {})",
            self.name,
            self.logs.display()
        ));
    }

    fn fail(&self, why: String) {
        warn!("{why}");
        self.failure.send_if_modified(|f| {
            let first = f.is_none();
            if first {
                *f = Some(why);
            }
            first
        });
    }

    fn stderr_tail(&self) -> String {
        let lines: Vec<String> = lock(&self.tail).iter().cloned().collect();
        match lines.is_empty() {
            true => format!("its stderr is empty (logs in {})", self.logs.display()),
            false => format!("its stderr ends: {} (logs in {})", lines.join(" | "), self.logs.display()),
        }
    }

    /// The command of one incarnation: the contract's environment, its own
    /// process group, killed with the run however the run ends.
    fn command(&self, incarnation: u32) -> Command {
        let app = self.application_name(incarnation);
        let mut cmd = Command::new(&self.command.argv[0]);
        cmd.args(&self.command.argv[1..])
            .current_dir(&self.command.dir)
            .envs(self.env.0.iter().map(|(k, v)| (*k, v.as_str())))
            .env("CHAOS_INSTANCE", &self.name)
            .env("CHAOS_INCARNATION", incarnation.to_string())
            .env("PGAPPNAME", &app)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: between fork and exec only async-signal-safe calls are
        // allowed; prctl is one. The kernel then kills the child if the
        // thread that forked it (so `chaos`) dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd
    }

    /// Starts one incarnation in a process group of its own.
    fn spawn(&mut self, incarnation: u32) -> Result<Proc, String> {
        let mut cmd = self.command(incarnation);
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "{} could not start `{}` in {}: {e}; check that the program exists (a bare name is looked up on PATH)",
                self.name,
                self.command.shown(),
                self.command.dir.display()
            )
        })?;
        // Never a made-up id: pid 0 would be kill(0), chaos's own group.
        let Some(pid) = child.id().map(|p| p as i32) else {
            return Err(format!(
                "{} started `{}` but could not read its process id (it was reaped already)",
                self.name,
                self.command.shown()
            ));
        };
        let exit = Exit::watch(pid);
        let lease = self.occupant.enter(pid).map_err(|why| format!("{} (pid {pid}): {why}", self.name))?;
        Stats::add(&self.ctx.stats.processes_started, 1);
        info!(component = %self.name, pid, incarnation, "process started");
        if let Some(point) = self.confirm_on_start.take() {
            // The crash's effect: the component's next incarnation.
            self.ctx.faults.confirm(point, 1);
        }
        let log = self.logs.join(format!("{}.{incarnation}.log", self.name));
        let mut readers = Vec::new();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            let protocol = self.reference.then_some(tx);
            readers.push(tokio::spawn(copy_lines(out, log.clone(), "stdout", None, protocol)));
        }
        if let Some(err) = child.stderr.take() {
            lock(&self.tail).clear();
            readers.push(tokio::spawn(copy_lines(err, log, "stderr", Some(self.tail.clone()), None)));
        }
        Ok(Proc {
            child,
            lines,
            fold: Default::default(),
            pid,
            incarnation,
            started: Instant::now(),
            exit,
            lease,
            status: None,
            readers,
        })
    }

    /// Watches one incarnation until it ends, acting on it as the nemesis.
    async fn watch(&mut self, proc: &mut Proc) -> End {
        let mut shutdown = self.ctx.shutdown.clone();
        // The nemesis strikes a process only once it is ready: PostgreSQL
        // shows a session of this incarnation (a relay about to claim, a
        // notifier about to handle what its group gave it). Its seconds
        // starting up are not drawn, and a per-message kill that comes
        // before waits for it. On SQLite nothing shows it: ready at once.
        let app = self.application_name(proc.incarnation);
        let mut w = Watch::new(self.health.is_none() && !matches!(self.ctx.store, Store::Postgres(_)));
        w.restart_seconds(self);
        if w.ready {
            self.mark_shown();
        }
        loop {
            let acting = *self.acting.borrow() && w.ready && w.paused_until.is_none();
            tokio::select! {
                // A kill decided outside arrives before the process can end
                // of it (the fault proxy sends the word, then the signal),
                // so it is looked at first: that end is the nemesis's, not
                // the program's own.
                biased;
                Some((point, serial, claim)) = self.kill_rx.recv() => {
                    if let Some(end) = self.kill_decided(proc, &mut w, point, serial, claim).await {
                        return end;
                    }
                }
                _ = tokio::time::sleep_until(w.ready_check), if !w.ready => {
                    if let Some(end) = self.check_ready(proc, &mut w, &app).await {
                        return end;
                    }
                }
                _ = proc.exit.wait() => {
                    return match proc.end().await {
                        Ok(s) => End::Exited(s),
                        Err(e) => { warn!(component = %self.name, cause = %e, "waiting for the process failed"); End::Stopped }
                    };
                }
                _ = tokio::time::sleep_until(w.next), if acting => {
                    if let Some(end) = self.strike_second(proc, &mut w).await {
                        return end;
                    }
                }
                _ = tokio::time::sleep_until(w.paused_until.unwrap_or_else(Instant::now)), if w.paused_until.is_some() => {
                    self.resume(proc, &mut w);
                }
                _ = tokio::time::sleep_until(w.release_at.unwrap_or_else(Instant::now)), if w.release_at.is_some() => {
                    w.release_at = None;
                    if let Some(serial) = w.occupied.take() {
                        self.occupant.release(serial);
                    }
                }
                Some(line) = proc.lines.recv() => match line {
                    Line::Halt { point, fires } => return self.halted(proc, point, fires).await,
                    Line::Stall { point, ms } => self.stall(proc, &mut w, point, ms).await,
                    other => self.count(proc, other),
                },
                // A switch gone (its run ending) is no change: the branch
                // then waits no more, rather than firing without end.
                Ok(()) = self.acting.changed() => w.restart_seconds(self),
                _ = shutdown.wait() => {
                    if w.paused_until.is_some() {
                        self.signal(proc, None, libc::SIGCONT);
                        self.occupant.woke();
                        w.woke();
                    }
                    self.stop(proc).await;
                    return End::Stopped;
                }
            }
        }
    }

    /// A pause's end: SIGCONT. The zombie wakes and acts on what it held
    /// (commits a transaction its group has given away) before any other
    /// fault may strike it, [`PAUSE_AFTERMATH`]: a kill or a hold there
    /// would erase what the pause was for.
    fn resume(&mut self, proc: &Proc, w: &mut Watch) {
        self.signal(proc, None, libc::SIGCONT);
        w.woke();
        self.occupant.woke();
        w.release_at = w.occupied.map(|_| Instant::now() + PAUSE_AFTERMATH);
        // The seconds spent stopped are not struck again.
        w.restart_seconds(self);
    }

    /// A reference component asked for its stall: it lands even on an
    /// occupied process, and occupies it when it can.
    async fn stall(&mut self, proc: &Proc, w: &mut Watch, point: FaultPoint, ms: u64) {
        let occupied = self.occupant.occupy(point, || true);
        if self.pause(proc, point).await {
            w.stop_until(Instant::now() + Duration::from_millis(ms), &self.ctx);
            w.occupied = occupied;
        } else if let Some(serial) = occupied {
            self.occupant.release(serial);
        }
    }

    /// A kill decided outside (a per-message halt, the fault proxy): on
    /// this incarnation now, or once it is ready.
    async fn kill_decided(
        &mut self,
        proc: &mut Proc,
        w: &mut Watch,
        point: FaultPoint,
        serial: u64,
        claim: Option<Claim>,
    ) -> Option<End> {
        if point == FaultPoint::DbPauseInTransaction {
            // The fault proxy holds the transaction's next statement and
            // occupies the process: the keeper stops it, and wakes it
            // (telling the proxy) after the scenario's pause. The proxy
            // counts the firing's end.
            match serial == proc.lease.serial() && self.pause(proc, point).await {
                true => w.stop_until(Instant::now() + self.ctx.scenario.pause + ZOMBIE_LONGER, &self.ctx),
                false => self.occupant.woke(),
            }
            return None;
        }
        if serial != proc.lease.serial() {
            // Claimed on an incarnation that ended before its signal:
            // pre-empted by that end.
            self.ctx.faults.preempt(point, &self.name, "its incarnation had ended before the kill");
            return None;
        }
        let Some(claim) = claim else {
            // The fault proxy's: claimed and signalled there.
            return Some(self.kill_for(proc, point, None).await);
        };
        if !w.ready {
            w.deferred = Some((point, claim));
            return None;
        }
        self.measure_kill(proc, &claim).await;
        Some(self.kill_for(proc, point, Some(claim)).await)
    }

    /// Whether the incarnation shows its session yet (a service: answers
    /// its health path); once it does, a deferred kill lands and its
    /// seconds start.
    async fn check_ready(&mut self, proc: &mut Proc, w: &mut Watch, app: &str) -> Option<End> {
        let ready = match &self.health {
            Some(url) => answers(url).await,
            None => sessions(&self.ctx.store, app).await > 0,
        };
        if !ready {
            w.ready_check = Instant::now() + READY_CHECK;
            return None;
        }
        w.ready = true;
        self.mark_shown();
        info!(component = %self.name, pid = proc.pid, ms = proc.started.elapsed().as_millis() as u64, "process ready");
        if let Some((point, claim)) = w.deferred.take() {
            self.measure_kill(proc, &claim).await;
            return Some(self.kill_for(proc, point, Some(claim)).await);
        }
        w.restart_seconds(self);
        None
    }

    /// One second of the process's life: the per-second kill and pause
    /// drawn, and struck.
    async fn strike_second(&mut self, proc: &mut Proc, w: &mut Watch) -> Option<End> {
        w.second += Duration::from_secs(1);
        w.next = w.second + self.instant_within_second();
        // A consumer's second while its group rebalances is no
        // occurrence: struck now, it would only rebalance again.
        if self.strikes_seconds() && self.ctx.faults.waits_for_group(&self.name) {
            Stats::add(&self.ctx.stats.group_waits, 1);
            return None;
        }
        // `[nemesis] targets`: a process not named is never drawn.
        let targets = &self.ctx.scenario.nemesis_targets;
        if !targets.is_empty() && !targets.contains(&self.name) {
            return None;
        }
        let hit = || format!("pid {} (incarnation {})", proc.pid, proc.incarnation);
        // Drawn on the occupant: a second whose process a kill from
        // elsewhere has claimed, or a held COMMIT occupies, is no
        // occurrence of either. One fault a second, the pause drawn first:
        // a kill on the stopped process would erase the zombie the pause
        // is there to make, so a second that pauses draws no kill.
        let faults = &self.ctx.faults;
        let paused =
            self.occupant.occupy(FaultPoint::ProcessPause, || faults.strike(FaultPoint::ProcessPause, &self.name, hit));
        if let Some(serial) = paused {
            match self.pause(proc, FaultPoint::ProcessPause).await {
                true => {
                    w.stop_until(Instant::now() + self.ctx.scenario.pause, &self.ctx);
                    w.occupied = Some(serial);
                }
                false => self.occupant.release(serial),
            }
            return None;
        }
        let claim = self.occupant.claim(|| faults.strike(FaultPoint::ProcessKill, &self.name, hit))?;
        self.measure_kill(proc, &claim).await;
        Some(self.kill_for(proc, FaultPoint::ProcessKill, Some(claim)).await)
    }

    /// The name an incarnation's database sessions carry: unique to the
    /// run, so that concurrent runs (or a leftover process of another one)
    /// are never taken for this one's.
    fn mark_shown(&self) {
        if let Some(shown) = &self.shown {
            shown.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn application_name(&self, incarnation: u32) -> String {
        format!("chaos-{}-{}-{incarnation}", self.ctx.names.run_id, self.name)
    }

    /// The kill for `point`, confirmed by the kernel's word: the keeper
    /// sends it with its claim, or (None) the striker that claimed it did.
    async fn kill_for(&self, proc: &mut Proc, point: FaultPoint, claim: Option<Claim>) -> End {
        match self.kill(proc, claim).await {
            Some(by_sigkill) => {
                if by_sigkill {
                    self.ctx.faults.confirm(point, 1);
                }
                End::Killed
            }
            // Never two live processes in one slot.
            None => End::Unkillable,
        }
    }

    /// What a reference component reports that the run counts.
    fn count(&self, proc: &mut Proc, line: Line) {
        let faults = &self.ctx.faults;
        match line {
            Line::Fired { record } => {
                if let Some(p) = FaultPoint::from_name(&record.point) {
                    faults.record_fired(p, record);
                }
            }
            Line::Confirmed { point, n } => faults.confirm(point, n),
            Line::Copies { point, event, copies } => faults.await_copies(point, event, copies),
            Line::Snapshot { snapshot } => {
                proc.fold.apply(snapshot, self.slot, &self.ctx.stats, &self.ctx.coord, faults)
            }
            Line::Delivered { component, messages, spans } => faults.record_delivery(component, messages, spans),
            Line::AwaitsDelivery { point, at } => faults.await_next_delivery(point, at),
            Line::Halt { .. } | Line::Stall { .. } => {}
        }
    }

    fn instant_within_second(&mut self) -> Duration {
        Duration::from_millis(self.rng.gen_range(0..1000))
    }

    /// Whether this keeper draws its seconds for a random kill or pause.
    fn strikes_seconds(&self) -> bool {
        let f = &self.ctx.faults;
        f.probability(FaultPoint::ProcessKill) > 0.0 || f.probability(FaultPoint::ProcessPause) > 0.0
    }

    /// A reference component stopped at a crash point: the harness's
    /// SIGKILL. A point confirmed by the next incarnation is confirmed when
    /// it starts; one confirmed by copies on the topic, by the verifier;
    /// the others by the process seen ending by SIGKILL there, holding its
    /// batch uncommitted.
    async fn halted(&mut self, proc: &mut Proc, point: FaultPoint, fires: u64) -> End {
        let crashes = match self.role {
            Role::Relay => &self.ctx.stats.relay_crashes,
            Role::Notifier => &self.ctx.stats.notifier_crashes,
            // A service under test never halts at a reference crash point.
            Role::Service => &self.ctx.stats.relay_crashes,
        };
        Stats::add(crashes, 1);
        // A kill the proxy claimed first ends it all the same.
        let claim = self.occupant.claim(|| true);
        let Some(by_sigkill) = self.kill(proc, claim).await else { return End::Unkillable };
        match point.confirm() {
            Confirm::NextIncarnation => self.confirm_on_start = Some(point),
            // The verifier counts the copies on the topic.
            Confirm::TopicCopies => {}
            _ if by_sigkill => self.ctx.faults.confirm(point, fires),
            _ => {}
        }
        End::Killed
    }

    /// SIGKILL to the process group, with the keeper's claim (None: the
    /// striker that claimed it sends it), then what the kernel and the
    /// database show: the process ending (true when by that signal), its
    /// sessions gone. None when the process was not seen to end.
    async fn kill(&self, proc: &mut Proc, claim: Option<Claim>) -> Option<bool> {
        let app = self.application_name(proc.incarnation);
        let before = sessions(&self.ctx.store, &app).await;
        match &claim {
            Some(c) => {
                self.signal(proc, Some(c), libc::SIGKILL);
            }
            // A striker that claimed it and has not sent its signal within a
            // second (its pump stuck on a full socket): the keeper sends it.
            None => {
                if tokio::time::timeout(CLAIMER_GRACE, proc.exit.wait()).await.is_err() {
                    warn!(component = %self.name, pid = proc.pid, "a claimed kill was not sent within {} ms; the keeper sends it", CLAIMER_GRACE.as_millis());
                    self.occupant.signal_held(&proc.lease, libc::SIGKILL);
                }
            }
        }
        Stats::add(&self.ctx.stats.processes_killed, 1);
        let by_sigkill = match tokio::time::timeout(SIGNAL_SEEN, proc.end()).await {
            Ok(Ok(s)) if s.signal() == Some(libc::SIGKILL) => true,
            Ok(Ok(s)) => {
                warn!(component = %self.name, status = %describe(s), "a killed process ended otherwise");
                false
            }
            Ok(Err(e)) => {
                warn!(component = %self.name, cause = %e, "waiting for the killed process failed");
                false
            }
            Err(_) => return None,
        };
        if before > 0 {
            Stats::add(&self.ctx.stats.sessions_at_kill, 1);
            let (store, stats, name, pid) =
                (self.ctx.store.clone(), self.ctx.stats.clone(), self.name.clone(), proc.pid);
            // Watched beside the restart: the next incarnation need not wait.
            self.ctx.tasks.spawn(format!("{name} session watch"), async move {
                let t = Instant::now();
                while t.elapsed() < SESSIONS_GONE {
                    if sessions(&store, &app).await == 0 {
                        Stats::add(&stats.sessions_gone_after_kill, 1);
                        let ms = t.elapsed().as_millis() as u64;
                        info!(component = %name, pid, sessions = before, ms, "killed process's database sessions gone");
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let what = match &store {
                    Store::Postgres(pg) => pg.session_states(&app).await.unwrap_or_else(|e| e.to_string()),
                    Store::Sqlite(_) => String::new(),
                };
                // Said once, in the report's `processes:` line (killed with
                // sessions open, and how many of those were seen gone), not
                // as a warning in the middle of the run's output.
                info!(component = %name, pid, sessions = %what, "a killed process's database sessions outlived it");
            });
        }
        Some(by_sigkill)
    }

    /// SIGSTOP to the process group for `point` (the nemesis's pause, or a
    /// reference notifier's stall), confirmed once the kernel shows the
    /// process stopped. False when it was not seen stopped.
    /// It lands only on a process no kill has claimed.
    async fn pause(&self, proc: &Proc, point: FaultPoint) -> bool {
        let claim = None;
        Stats::add(&self.ctx.stats.processes_paused, 1);
        match self.stop_and_see(proc, claim).await {
            Seen::Stopped => {}
            // The process ended on its own (or by another fault's kill)
            // between the draw and the stop: the pause had nothing to
            // stop, which is no failure of the harness to pause it.
            Seen::Gone => {
                if point != FaultPoint::DbPauseInTransaction {
                    self.ctx.faults.preempt(point, &self.name, "the process ended before it could be seen stopped");
                }
                self.signal(proc, claim, libc::SIGCONT);
                return false;
            }
            Seen::Running(state) => {
                warn!(component = %self.name, pid = proc.pid, state = %state, "a paused process was not seen stopped");
                self.signal(proc, claim, libc::SIGCONT);
                return false;
            }
        }
        // A zombie's transaction is confirmed by the proxy, once it woke.
        if point != FaultPoint::DbPauseInTransaction {
            self.ctx.faults.confirm(point, 1);
        }
        if point == FaultPoint::ProcessPause {
            if let Some((_, in_tx)) = activity(&self.ctx.store, &self.application_name(proc.incarnation)).await {
                let s = &self.ctx.stats;
                Stats::add(&s.pauses_measured, 1);
                Stats::add(&s.pauses_in_transaction, (in_tx > 0) as u64);
            }
        }
        true
    }

    /// SIGSTOP to the process group, and what the kernel then shows of the
    /// process: stopped, gone (a zombie, or no entry: it exited before the
    /// stop took hold), or still in another state after [`SIGNAL_SEEN`].
    async fn stop_and_see(&self, proc: &Proc, claim: Option<&Claim>) -> Seen {
        match self.signal(proc, claim, libc::SIGSTOP) {
            Sent::Delivered => {}
            Sent::Gone => return Seen::Gone,
            Sent::Refused | Sent::Failed(_) => return Seen::Running('?'),
        }
        let t = Instant::now();
        let mut last = '?';
        while t.elapsed() < SIGNAL_SEEN {
            match Seen::of(process_state(proc.pid)) {
                Ok(seen) => return seen,
                Err(state) => last = state,
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Seen::Running(last)
    }

    /// Before a random kill: the process stopped, so it cannot move on,
    /// and what PostgreSQL shows of it then, for the run's power figures
    /// (did the kill find a transaction open, or no session at all?). The
    /// kill that follows lands on the stopped process.
    async fn measure_kill(&self, proc: &Proc, claim: &Claim) {
        if !matches!(self.ctx.store, Store::Postgres(_)) || self.stop_and_see(proc, Some(claim)).await != Seen::Stopped
        {
            return;
        }
        if let Some((sessions, in_tx)) = activity(&self.ctx.store, &self.application_name(proc.incarnation)).await {
            let s = &self.ctx.stats;
            Stats::add(&s.random_kills_measured, 1);
            Stats::add(&s.random_kills_in_transaction, (in_tx > 0) as u64);
            Stats::add(&s.random_kills_without_session, (sessions == 0) as u64);
        }
    }

    /// SIGTERM, then SIGKILL after the grace period: the run's own stop,
    /// sent whether or not a kill has claimed the process.
    async fn stop(&self, proc: &mut Proc) {
        self.occupant.signal_held(&proc.lease, libc::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, proc.end()).await.is_err() {
            warn!(component = %self.name, pid = proc.pid, "did not exit within {} s of SIGTERM; killed", STOP_GRACE.as_secs());
            self.occupant.signal_held(&proc.lease, libc::SIGKILL);
            let _ = tokio::time::timeout(SIGNAL_SEEN, proc.end()).await;
        }
    }

    /// A signal to the incarnation through the occupant: with the claim of
    /// the kill it belongs to, or (None) only while no kill has claimed it.
    /// A refusal is a harness error and ends the run.
    fn signal(&self, proc: &Proc, claim: Option<&Claim>, sig: i32) -> Sent {
        let sent = match claim {
            Some(c) => self.occupant.signal_claimed(c, sig),
            None => self.occupant.signal_unclaimed(&proc.lease, sig),
        };
        if sent == Sent::Refused {
            self.fail(format!(
                "harness error: {} (pid {}) could not be signalled safely; see the log",
                self.name, proc.pid
            ));
        }
        sent
    }
}

/// "status 3" or "signal 11 (SIGSEGV)".
pub(super) fn describe(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("status {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => s.to_string(),
    }
}

/// A process's state letter from /proc (`T` when stopped).
/// What the kernel showed of a process sent SIGSTOP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Stopped,
    Gone,
    /// Never seen stopped; the last state read (`?` when none was).
    Running(char),
}

impl Seen {
    /// A state read from `/proc`: stopped, gone, or (Err) still to wait on.
    fn of(state: Option<char>) -> std::result::Result<Seen, char> {
        match state {
            Some('T') => Ok(Seen::Stopped),
            Some('Z' | 'X') | None => Ok(Seen::Gone),
            Some(other) => Err(other),
        }
    }
}

pub(crate) fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces; the state follows it.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Database sessions open under an application name; 0 when they cannot be
/// counted (SQLite has no sessions).
/// A process's sessions and those inside a transaction; None on SQLite,
/// or when PostgreSQL did not answer.
pub(super) async fn activity(store: &Store, app: &str) -> Option<(i64, i64)> {
    match store {
        Store::Postgres(pg) => pg
            .session_activity(app)
            .await
            .inspect_err(|e| warn!(cause = %e, "reading a process's database sessions failed"))
            .ok(),
        Store::Sqlite(_) => None,
    }
}

pub(super) async fn sessions(store: &Store, app: &str) -> i64 {
    match store {
        Store::Postgres(pg) => pg.sessions(app).await.unwrap_or_else(|e| {
            warn!(cause = %e, "counting a process's database sessions failed");
            0
        }),
        Store::Sqlite(_) => 0,
    }
}

/// Whether `url` answers a GET with a 2xx within a second.
async fn answers(url: &str) -> bool {
    static CLIENT: std::sync::OnceLock<Option<reqwest::Client>> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| reqwest::Client::builder().timeout(Duration::from_secs(1)).build().ok());
    match client {
        Some(c) => c.get(url).send().await.is_ok_and(|r| r.status().is_success()),
        None => false,
    }
}

/// Copies a process's output, line by line, into its log file; keeps the
/// last lines of stderr for errors.
pub(super) async fn copy_lines(
    from: impl tokio::io::AsyncRead + Unpin,
    log: PathBuf,
    stream: &'static str,
    tail: Option<Tail>,
    protocol: Option<tokio::sync::mpsc::UnboundedSender<Line>>,
) {
    let mut file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&log).await {
        Ok(f) => Some(f),
        Err(e) => {
            warn!(path = %log.display(), cause = %e, "a process log could not be opened; its output is dropped");
            None
        }
    };
    let mut lines = BufReader::new(from).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let (Some(tx), Some(json)) = (&protocol, line.strip_prefix(crate::nemesis::process::protocol::PREFIX)) {
            match serde_json::from_str::<Line>(json) {
                Ok(l) => {
                    let _ = tx.send(l);
                    continue;
                }
                Err(e) => warn!(cause = %e, "a component's protocol line did not parse"),
            }
        }
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(format!("[{stream}] {line}\n").as_bytes()).await;
        }
        if let Some(t) = &tail {
            let mut t = lock(t);
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
    if let Some(mut f) = file {
        let _ = f.flush().await;
    }
}

/// Reads the consumers' group's state from the coordinator until the run
/// stops, and tells the fault injector, so that no kill or pause of a
/// consumer is drawn while its group rebalances
/// ([`crate::faults::FaultInjector::waits_for_group`]).
///
/// `CHAOS_SKIP_GROUP_WAIT=1` never watches (a switch for tests and
/// measurements that show what the wait is for).
pub(super) fn watch_group(ctx: &Ctx) {
    if std::env::var_os("CHAOS_SKIP_GROUP_WAIT").is_some() {
        warn!("CHAOS_SKIP_GROUP_WAIT: consumers are struck whatever their group's state");
        return;
    }
    let (broker, group, faults, mut shutdown) =
        (ctx.broker.clone(), ctx.names.group.clone(), ctx.faults.clone(), ctx.shutdown.clone());
    ctx.tasks.spawn("the consumer group's watch".into(), async move {
        loop {
            match broker.group(&group).await {
                Ok(Some(g)) => faults.set_group_stable(g.settled),
                // A broker that cannot say: never wait on it.
                Ok(None) => return faults.set_group_stable(true),
                // Unread this time (the broker paused or killed by the
                // nemesis): the last word stands.
                Err(e) => debug!(cause = %e, "reading the consumer group's state failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(GROUP_POLL) => {}
                _ = shutdown.wait() => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_shows_state_t() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        // Running, sleeping, or (on a loaded machine, still loading its
        // binary) in disk sleep: anything but stopped.
        assert!(matches!(process_state(pid), Some('S') | Some('R') | Some('D')), "{:?}", process_state(pid));
        crate::nemesis::signal::send(crate::nemesis::signal::Target::Process(pid), libc::SIGSTOP);
        let t = std::time::Instant::now();
        while process_state(pid) != Some('T') && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(process_state(pid), Some('T'));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(describe(status), "signal 9");
    }
}

/// The keeper's accounting of a kill that another striker claimed while
/// the keeper was busy ending the incarnation by another path (here the
/// run's stop): seen ending by SIGKILL, the kill is confirmed; ended
/// otherwise, it is pre-empted with its reason. Never left fired and
/// unaccounted, which under load failed a run's every-firing check.
#[cfg(test)]
mod settling {
    use super::*;

    const POINT: FaultPoint = FaultPoint::DbKillAfterCommit;

    /// A keeper over `script` (run by sh in `dir`, after a trap that notes
    /// SIGTERM in the file `term` and the file `ready` that says it is set),
    /// its kill channel and
    /// its occupant, on a unit context whose kills after commit all fire.
    /// The nemesis's switch is dropped at once, as at a run's end: the
    /// keeper must still hear the stop (it once saw a gone switch change
    /// without end, and never reached the stop's branch).
    async fn keeper(
        script: &str,
        dir: &std::path::Path,
    ) -> (crate::pipeline::testing::Harness, Keeper, tokio::sync::mpsc::UnboundedSender<Struck>, Arc<Occupant>) {
        let h = crate::pipeline::testing::harness(
            "name = \"unit\"\n[run]\ncomponents = \"process\"\n[faults]\ndb_kill_after_commit = 1.0\n",
        )
        .await;
        let (kill, kill_rx) = tokio::sync::mpsc::unbounded_channel();
        let occupant = Arc::new(Occupant::default());
        let (failure, _) = watch::channel(None);
        let (_, acting) = watch::channel(false);
        let keeper = Keeper {
            lacking: Default::default(),
            ctx: h.ctx.clone(),
            slot: 1,
            kill_rx,
            occupant: occupant.clone(),
            role: Role::Relay,
            reference: false,
            restart: RESTART_FLOOR,
            confirm_on_start: None,
            name: "relay-1".into(),
            command: ProgramCommand {
                argv: vec!["sh".into(), "-c".into(), format!("trap 'touch term' TERM; touch ready; {script}")],
                dir: dir.to_path_buf(),
            },
            env: Env(Vec::new()),
            logs: dir.to_path_buf(),
            failure,
            acting,
            tail: Default::default(),
            rng: rand::rngs::StdRng::seed_from_u64(1),
            shown: None,
            health: None,
        };
        (h, keeper, kill, occupant)
    }

    /// Waits (bounded) for `file` to appear: the program's word that its
    /// trap is set, or that the run's SIGTERM reached it (the keeper is
    /// then inside its stop).
    async fn seen(file: &std::path::Path) {
        let t = Instant::now();
        while !file.exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "{} never appeared", file.display());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The striker's side, as the fault proxy does it: the kill claimed on
    /// the occupant, its word sent, then (if `signal`) SIGKILL.
    fn strike(
        h: &crate::pipeline::testing::Harness,
        kill: &tokio::sync::mpsc::UnboundedSender<Struck>,
        occupant: &Occupant,
        signal: bool,
    ) {
        let claim = occupant
            .claim(|| h.ctx.faults.strike(POINT, "relay-1", || "a commit".into()))
            .expect("the live incarnation is claimed");
        let serial = claim.serial();
        kill.send((POINT, serial, None)).expect("the keeper listens");
        if signal {
            assert_eq!(occupant.signal_claimed(&claim, libc::SIGKILL), Sent::Delivered);
        }
    }

    /// Waits for the program to enter its slot and set its trap: stopped
    /// before the trap is set, the shell would die of SIGTERM.
    async fn started(occupant: &Occupant, dir: &std::path::Path) {
        let t = Instant::now();
        while occupant.current().is_none() {
            assert!(t.elapsed() < Duration::from_secs(30), "the program never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        seen(&dir.join("ready")).await;
    }

    #[tokio::test]
    async fn a_kill_claimed_during_the_stop_and_seen_by_sigkill_is_confirmed() {
        let dir = tempfile::tempdir().unwrap();
        // SIGTERM is noted and outlived: only the striker's SIGKILL ends it.
        let (h, keeper, kill, occupant) = keeper("while :; do sleep 0.05; done", dir.path()).await;
        let task = tokio::spawn(keeper.keep());
        started(&occupant, dir.path()).await;
        let term = dir.path().join("term");
        let striker = async {
            seen(&term).await;
            strike(&h, &kill, &occupant, true);
        };
        tokio::join!(h.stop(vec![task]), striker);
        assert_eq!(h.ctx.faults.fired(POINT), 1);
        assert_eq!((h.ctx.faults.confirmed(POINT), h.ctx.faults.preempted(POINT)), (1, 0), "confirmed, not pre-empted");
    }

    #[tokio::test]
    async fn a_kill_claimed_on_a_process_that_then_exits_is_preempted_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        // SIGTERM is noted; the program exits by itself once told to.
        let (h, keeper, kill, occupant) = keeper("while [ ! -e go ]; do sleep 0.05; done; exit 3", dir.path()).await;
        let task = tokio::spawn(keeper.keep());
        started(&occupant, dir.path()).await;
        let (term, go) = (dir.path().join("term"), dir.path().join("go"));
        let striker = async {
            seen(&term).await;
            strike(&h, &kill, &occupant, false);
            std::fs::write(&go, b"").unwrap();
        };
        tokio::join!(h.stop(vec![task]), striker);
        assert_eq!(h.ctx.faults.fired(POINT), 1);
        assert_eq!((h.ctx.faults.confirmed(POINT), h.ctx.faults.preempted(POINT)), (0, 1), "pre-empted, not confirmed");
        let summary = h.ctx.faults.summary();
        let why = &summary.iter().find(|s| s.point == POINT.name()).expect("the point's summary").preempted_why;
        assert!(
            why.len() == 1 && why[0].contains("ended otherwise (status 3)"),
            "the reason names how it ended: {why:?}"
        );
    }

    /// A service is ready once it answers its health path, not once it
    /// starts (on SQLite, nothing else shows it): a per-message kill that
    /// comes while it is still starting waits for the answer. Planting the
    /// old readiness (ready at once) kills it before it listens.
    #[tokio::test]
    async fn a_service_is_struck_only_once_it_answers_its_health_path() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let serve = format!("echo $$ > pid; sleep 1; exec python3 -m http.server {port} --bind 127.0.0.1");
        let (h, mut keeper, kill, occupant) = keeper(&serve, dir.path()).await;
        (keeper.role, keeper.health) = (Role::Service, Some(format!("http://127.0.0.1:{port}/")));
        let task = tokio::spawn(keeper.keep());
        started(&occupant, dir.path()).await;
        seen(&dir.path().join("pid")).await;
        let pid: i32 = std::fs::read_to_string(dir.path().join("pid")).unwrap().trim().parse().unwrap();
        let claim = occupant
            .claim(|| h.ctx.faults.strike(POINT, "relay-1", || "a message".into()))
            .expect("the live incarnation is claimed");
        kill.send((POINT, claim.serial(), Some(claim))).expect("the keeper listens");
        let (t, mut answered) = (Instant::now(), false);
        while Seen::of(process_state(pid)) != Ok(Seen::Gone) {
            assert!(t.elapsed() < Duration::from_secs(30), "the deferred kill never landed");
            answered |= reqwest::get(format!("http://127.0.0.1:{port}/")).await.is_ok_and(|r| r.status().is_success());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(answered, "killed after {:?}, before its health path answered", t.elapsed());
        h.stop(vec![task]).await;
        assert_eq!(h.ctx.faults.fired(POINT), 1);
    }

    #[test]
    fn a_process_that_exited_unreaped_is_gone_not_running() {
        let mut child = std::process::Command::new("sh").args(["-c", "exit 0"]).spawn().unwrap();
        let pid = child.id() as i32;
        let t = Instant::now();
        // Unreaped, the exited child stays a zombie: what a pause finds when
        // the program ended between the draw and the stop.
        while process_state(pid) != Some('Z') {
            assert!(t.elapsed() < Duration::from_secs(30), "never a zombie: {:?}", process_state(pid));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(Seen::of(process_state(pid)), Ok(Seen::Gone));
        child.wait().unwrap();
        assert_eq!(Seen::of(process_state(pid)), Ok(Seen::Gone), "reaped: no entry at all");
        assert_eq!(Seen::of(Some('S')), Err('S'), "asleep: the stop is still to take hold");
        assert_eq!(Seen::of(Some('T')), Ok(Seen::Stopped));
    }
}
