//! The fault proxy: a TCP proxy inside the harness, between the components
//! and PostgreSQL, and with `[proxy] kafka` between them and Kafka, that
//! shapes and breaks their traffic.
//!
//! **Attribution.** Every component instance that the scenario's
//! `[proxy] targets` names gets a slot: a listener of its own on
//! 127.0.0.1 (an ephemeral port), and a database URL that points there.
//! A fault aimed at a slot hits that one relay, notifier or the payment
//! service, whether it runs as a task of `chaos`, as a component process
//! or as a user's program (which is given the slot's URL in
//! `CHAOS_DATABASE_URL`). PostgreSQL never tells clients where to connect
//! next, so a port per instance is all attribution takes. Kafka does, so
//! the slot's Kafka port is the one the broker advertises on a listener of
//! the slot's own ([`kafka`] says why that, and not `client.id`).
//!
//! **Faults.** Shaping applies to every byte of a slot: a latency with
//! jitter per read, a bandwidth limit. The nemesis of each slot strikes
//! once a second, at a random instant: `net.reset` resets every connection
//! the slot has open (an RST to the component, the server sees the socket
//! close), `net.blackhole` holds every byte in both directions for
//! `[proxy] blackhole_ms`, then lets it through (a partition that heals).
//! On the timeline ([`crate::nemesis::timeline`]) both strike every slot at chosen
//! times instead. The protocol-aware points read the server's framing
//! ([`pg`], [`kafka`]): `db.commit_ack_lost` withholds the server's
//! acknowledgement of a commit (a COMMIT, or a write in autocommit) and
//! resets the connection, so the transaction is durable and its client
//! cannot know (an ambiguous commit); `kafka.produce_ack_lost` does the
//! same to a `Produce` response, the broker's ack of an appended batch;
//! `db.kill_after_commit`, `kafka.kill_after_produce_ack`,
//! `kafka.kill_after_offset_commit` have the slot's process killed once
//! the server has done the work, before the response is written on;
//! `kafka.kill_after_fetch` lets the records through, then kills (for
//! any program: a consumer killed between its transaction and its offset
//! commit, a relay between the broker's ack and its mark, a consumer whose
//! offsets are committed before its transaction, a consumer holding
//! records it has only received).
//!
//! **Cost.** With no fault set for a slot, a read is written on at once:
//! no copy beyond the read buffer, no timer, no subscription. The bench
//! measures it against a direct connection (`chaos bench --proxy`).

pub mod kafka;
pub mod lanes;
pub mod pg;

use crate::context::{Shutdown, Stats};
use crate::error::{Error, Result};
use crate::faults::{FaultInjector, FaultPoint, Reach};
use crate::nemesis::signal::{Claim, Occupant, Struck};
pub use crate::scenario::Shaping;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// A slot's process, when the component runs as one: the proxy claims a
/// kill on it (`db.kill_after_commit` and the others after an
/// acknowledgement), tells the keeper, then sends the SIGKILL; the keeper
/// sees it end and confirms the fault.
#[derive(Default)]
pub struct ProcessHandle {
    /// The incarnation the slot holds now, shared with its keeper: a kill
    /// is claimed on it once, and signalled only while it is there.
    pub occupant: Arc<Occupant>,
    pub keeper: Mutex<Option<mpsc::UnboundedSender<Struck>>>,
}

/// One component instance's listener and what is open through it.
pub struct Slot {
    pub name: String,
    /// The slot's port in front of PostgreSQL.
    pub addr: SocketAddr,
    /// The slot's port in front of Kafka, when the run proxies Kafka: the
    /// address the broker advertises on the slot's own listener.
    pub kafka: Option<SocketAddr>,
    shaping: Shaping,
    conns: Mutex<Vec<Conn>>,
    /// Until when every byte of the slot is held (`net.blackhole`).
    blackhole: watch::Sender<Option<Instant>>,
    /// The slot's next byte is a `net.blackhole` occurrence: set at a
    /// random instant of each second. A blackhole so starts with a byte
    /// that it holds (a partition no traffic crossed would prove nothing).
    armed: std::sync::atomic::AtomicBool,
    blackhole_for: Duration,
    pub process: ProcessHandle,
    /// Bytes passed either way: a slot whose count did not move in the
    /// last second is idle, and a blackhole there would hold nothing.
    moved: AtomicU64,
    /// The last connection's id: one count for both wires of the slot,
    /// since a connection is forgotten by its id.
    last_id: AtomicU64,
    /// Reads held by a blackhole so far: what confirms a scheduled one.
    held: AtomicU64,
    /// `OffsetCommit` responses the coordinator sent the slot so far: what
    /// a held `COMMIT` (`db.hold_commit`) watches for.
    offset_commits: watch::Sender<u64>,
    /// The run's counters, for the commits seen on the slot's wire.
    stats: Arc<Stats>,
    /// The group's committed positions, as the last answered commit of any
    /// slot set them: a commit covers the messages from there to its own.
    committed: Arc<kafka::Committed>,
    /// What fetches delivered to the slot's process, and which incarnation
    /// that is (read only with `db.kill_after_commit` set): what its kill
    /// makes the group deliver again, past `committed`.
    fetched: kafka::FetchedBy,
    /// Whether the slot writes the outbox (a service, the workload): its
    /// held COMMIT is what reorders the outbox.
    writer: bool,
    /// Whether the slot is a relay's (its `Produce` requests are counted)
    /// or a consumer's (its holds are the auto-commit window's evidence).
    relay: bool,
    consumer: bool,
    /// Commits with changed rows of every writer slot, shared by the
    /// proxy's slots: what a writer's held COMMIT watches for overtakes.
    writer_commits: Arc<AtomicU64>,
    /// `Produce` requests the relays' slots have sent, shared by the
    /// proxy's slots: a writer's held COMMIT is let through as one goes
    /// out, while that relay is between its claim and its mark.
    relay_produces: Arc<watch::Sender<u64>>,
    /// The consumers' zombies (`db.pause_in_transaction`), shared by the
    /// proxy's slots.
    zombies: Arc<Zombies>,
}

/// What every consumer slot's zombie shares.
#[derive(Default)]
struct Zombies {
    /// Every consumer slot's name and occupant (set once they all exist):
    /// a zombie keeps the other consumers out of the faults' reach, so that
    /// its partitions' new owner lives to handle the same messages.
    consumers: std::sync::OnceLock<Vec<(String, Arc<Occupant>)>>,
    /// Until when no new zombie is drawn: after each, a rest as long as it
    /// lasted. A zombie occupies every consumer for its whole span (the
    /// pause, the wake, the aftermath: some 17 s); drawn back to back they
    /// would take every second from the consumers' other faults, which then
    /// never fire. The rest leaves them at least half.
    rest_until: Mutex<Option<tokio::time::Instant>>,
}

impl Zombies {
    fn resting(&self) -> bool {
        self.rest_until.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// A zombie drawn at `drawn` is over: the next waits as long again.
    fn rest(&self, drawn: tokio::time::Instant) {
        let until = tokio::time::Instant::now() + drawn.elapsed();
        *self.rest_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }
}

/// An open connection: dropping the sender resets it.
struct Conn {
    id: u64,
    reset: watch::Sender<bool>,
}

/// The proxy of one run: a slot per proxied component instance.
pub struct Proxy {
    slots: Vec<Arc<Slot>>,
    upstream: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the proxy needs from its run.
pub struct Settings<'a> {
    pub upstream_url: &'a str,
    pub slots: Vec<String>,
    pub shaping: Shaping,
    pub blackhole: Duration,
    /// Whether the slots stand in front of Kafka too.
    pub kafka: bool,
    /// The run's counters: the commits the proxy saw, with writes and empty.
    pub stats: Arc<Stats>,
}

/// Which wire a listener of a slot carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Postgres,
    Kafka,
}

pub use lanes::Lanes;

impl Proxy {
    /// Binds a listener per slot and starts accepting. The nemesis starts
    /// later, with [`Proxy::act`].
    pub async fn start(s: Settings<'_>, faults: Arc<FaultInjector>, shutdown: Shutdown) -> Result<Self> {
        let upstream = upstream_of(s.upstream_url)?;
        let mut kafka = match s.kafka {
            true => bind_kafka(s.slots.len(), &s.stats).await?.into_iter().map(Some).collect(),
            false => Vec::new(),
        };
        kafka.resize_with(s.slots.len(), || None);
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        let committed = Arc::new(kafka::Committed::default());
        let writer_commits = Arc::new(AtomicU64::new(0));
        let relay_produces = Arc::new(watch::channel(0).0);
        let zombies = Arc::new(Zombies::default());
        for (name, kafka) in s.slots.into_iter().zip(kafka) {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| Error::Internal(format!("binding the fault proxy's port for {name}: {e}")))?;
            let addr = listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?;
            let kafka_addr =
                kafka.as_ref().map(|(l, _)| l.local_addr()).transpose().map_err(|e| Error::Internal(e.to_string()))?;
            let slot = Arc::new(Slot {
                addr,
                kafka: kafka_addr,
                shaping: s.shaping,
                conns: Mutex::new(Vec::new()),
                blackhole: watch::channel(None).0,
                armed: Default::default(),
                blackhole_for: s.blackhole,
                process: ProcessHandle::default(),
                moved: AtomicU64::new(0),
                last_id: AtomicU64::new(0),
                held: AtomicU64::new(0),
                offset_commits: watch::channel(0).0,
                stats: s.stats.clone(),
                committed: committed.clone(),
                fetched: Default::default(),
                writer: crate::domain::names::writes_outbox(&name),
                relay: name.starts_with("relay"),
                consumer: name.starts_with("notifier"),
                writer_commits: writer_commits.clone(),
                relay_produces: relay_produces.clone(),
                zombies: zombies.clone(),
                name,
            });
            tasks.push(tokio::spawn(accept(
                listener,
                slot.clone(),
                (upstream, Wire::Postgres),
                faults.clone(),
                shutdown.clone(),
            )));
            if let Some((listener, broker)) = kafka {
                let task = accept(listener, slot.clone(), (broker, Wire::Kafka), faults.clone(), shutdown.clone());
                tasks.push(tokio::spawn(task));
            }
            slots.push(slot);
        }
        let _ = zombies
            .consumers
            .set(slots.iter().filter(|s| s.consumer).map(|s| (s.name.clone(), s.process.occupant.clone())).collect());
        info!(slots = slots.len(), %upstream, "fault proxy listening");
        Ok(Self { slots, upstream, tasks })
    }

    pub fn slot(&self, name: &str) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.name == name)
    }

    pub fn slots(&self) -> &[Arc<Slot>] {
        &self.slots
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The URL a slot's component connects with: the run's URL with the
    /// host and port of the slot's listener.
    pub fn url_for(&self, slot: &Slot, url: &str) -> String {
        with_address(url, slot.addr)
    }

    /// Starts each slot's nemesis (`net.reset`, `net.blackhole` once a
    /// second), which strikes while `acting` is true. A point the
    /// scenario's timeline schedules (`scheduled`) strikes only at its
    /// times ([`crate::nemesis::timeline`]), never here.
    pub fn act(
        &mut self,
        faults: Arc<FaultInjector>,
        acting: watch::Receiver<bool>,
        seed: u64,
        scheduled: &[FaultPoint],
        shutdown: Shutdown,
    ) {
        let mut struck: Vec<FaultPoint> = [FaultPoint::NetReset, FaultPoint::NetBlackhole]
            .into_iter()
            .filter(|p| faults.probability(*p) > 0.0 && !scheduled.contains(p))
            .collect();
        // Aimed kills read per second: each slot's process is armed here,
        // and struck by its pump at its next window.
        struck.extend(FaultPoint::ALL.iter().copied().filter(|p| faults.arms(*p)));
        if struck.is_empty() {
            return;
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x7072_6f78 ^ ((i as u64) << 32));
            let struck = struck.iter().copied().filter(|p| slot.has_window(*p)).collect();
            let task = nemesis(slot.clone(), faults.clone(), acting.clone(), rng, struck, shutdown.clone());
            self.tasks.push(tokio::spawn(task));
        }
    }

    /// Stops accepting and resets what is still open.
    pub fn close(self) {
        for t in &self.tasks {
            t.abort();
        }
        for slot in &self.slots {
            slot.reset_all();
        }
    }
}

impl Slot {
    /// Whether the slot's process can meet `point`'s window, so is armed
    /// for it: a fetch, an offset commit and a zombie's commit are a
    /// consumer's; a produce's acknowledgement is a relay's (or a
    /// service's that produces itself). An arm on a process that never
    /// meets its window would wait out the run and prove nothing.
    fn has_window(&self, point: FaultPoint) -> bool {
        match point {
            FaultPoint::KafkaKillAfterFetch
            | FaultPoint::KafkaKillAfterOffsetCommit
            | FaultPoint::DbPauseInTransaction => self.consumer,
            FaultPoint::KafkaKillAfterProduceAck => !self.consumer,
            _ => true,
        }
    }

    /// A writer's held COMMIT went on: the other writers' commits with
    /// changed rows since `before` inserted after it and became visible
    /// first. Each is an overtake; a hold none overtook reordered nothing.
    fn overtaken(&self, before: u64) {
        let others = self.writer_commits.load(Ordering::Relaxed).saturating_sub(before);
        self.stats.writer_hold(others);
        info!(slot = %self.name, overtakes = others, "db.hold_commit: a writer's COMMIT went on after the hold");
    }

    /// Notes an answered commit; its reach is the messages it covered.
    fn committing(&self, positions: kafka::Positions, refused: &[i32]) -> Reach {
        Reach { seqs: vec![], spans: self.committed.answered(positions, refused) }
    }

    /// Notes what a fetch delivered to the slot's process now; a new
    /// incarnation starts with nothing fetched.
    fn delivered(&self, last: Option<kafka::Positions>) {
        if let (Some(last), Some(serial)) = (last, self.process.occupant.current()) {
            self.fetched.delivered(serial, last);
        }
    }

    /// The messages incarnation `serial` fetched past the group's committed
    /// positions: killed now, the group delivers them again.
    fn uncommitted(&self, serial: Option<u64>) -> Reach {
        Reach { seqs: vec![], spans: self.fetched.uncommitted(serial, &self.committed) }
    }

    /// Resets every connection open through the slot; returns how many.
    pub fn reset_all(&self) -> usize {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|p| p.into_inner()));
        for c in &conns {
            let _ = c.reset.send(true);
        }
        conns.len()
    }

    /// Holds every byte through the slot, both ways, until `until`.
    pub fn blackhole_until(&self, until: Instant) {
        // `send_replace`, not `send`: with no receiver `send` drops the
        // value, and a read looks at the sender's value, never subscribes.
        self.blackhole.send_replace(Some(until));
    }

    /// Reads a blackhole has held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn open(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn forget(&self, id: u64) {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.id != id);
    }
}

/// Where the run's PostgreSQL listens, from its URL (default port 5432).
fn upstream_of(url: &str) -> Result<SocketAddr> {
    let (_, authority, _) = split_url(url);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let with_port = if host_port.contains(':') { host_port.to_string() } else { format!("{host_port}:5432") };
    let with_port = with_port.replace("localhost", "127.0.0.1");
    with_port.parse().map_err(|_| {
        Error::Usage(format!(
            "the fault proxy needs PostgreSQL at an IP address and port, and the URL gives {}; use 127.0.0.1:5432 in DATABASE_URL",
            crate::error::redact(host_port)
        ))
    })
}

/// (scheme with `://`, authority, path and query) of a URL.
fn split_url(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    (&url[..start], &rest[..end], &rest[end..])
}

/// The URL with its host and port replaced by `addr`, user and password kept.
fn with_address(url: &str, addr: SocketAddr) -> String {
    let (scheme, authority, tail) = split_url(url);
    let user = authority.rfind('@').map_or("", |i| &authority[..=i]);
    format!("{scheme}{user}{addr}{tail}")
}

/// The proxy's Kafka listeners, one per component, each on the port the
/// broker advertises for one of its listeners `SLOT<i>` ([`kafka`]), with
/// the address of that listener. The ports are fixed, so runs that proxy
/// Kafka share the broker's slots: a run takes any `n` free ones, and when
/// fewer are free it waits, holding none, so that two waiting runs never
/// hold half each.
async fn bind_kafka(n: usize, stats: &Stats) -> Result<Vec<(TcpListener, SocketAddr)>> {
    if n > kafka::SLOTS as usize {
        return Err(Error::Usage(format!(
            "the fault proxy has {} Kafka slots and the run puts {n} components behind it; name fewer in `proxy.targets`",
            kafka::SLOTS
        )));
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    let mut told = false;
    loop {
        let mut bound = Vec::new();
        for i in 0..kafka::SLOTS {
            if bound.len() == n {
                break;
            }
            let port = kafka::ADVERTISED_BASE + i;
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(l) => bound.push((l, SocketAddr::from(([127, 0, 0, 1], kafka::BROKER_BASE + i)))),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(Error::Internal(format!("binding the fault proxy's Kafka port {port}: {e}"))),
            }
        }
        if bound.len() == n {
            reaches_slots(&bound).await?;
            if told {
                let ms = started.elapsed().as_millis() as u64;
                Stats::add(&stats.waited_for_ports_ms, ms);
                info!(ms, "the fault proxy's Kafka ports are free; the run goes on");
            }
            return Ok(bound);
        }
        let free = bound.len();
        drop(bound);
        if Instant::now() > deadline {
            return Err(Error::Usage(format!(
                "only {free} of the fault proxy's {} Kafka slots (ports {}-{}) were free for 300 s and the run needs {n}: other runs proxy Kafka, or another program holds the ports",
                kafka::SLOTS,
                kafka::ADVERTISED_BASE,
                kafka::ADVERTISED_BASE + kafka::SLOTS - 1
            )));
        }
        if !told {
            // Said once, on stderr by default: a silent wait of a minute
            // looks like a hang.
            warn!(free, needed = n, "waiting for the fault proxy's Kafka slots: other runs proxy Kafka; up to 300 s");
            told = true;
        }
        // A second Ctrl-C ends the wait with the process.
        tokio::time::sleep(Duration::from_millis(200 + rand::thread_rng().gen_range(0..300))).await;
    }
}

/// Each slot taken has its listener on the broker: `scripts/services.sh up`
/// configures them, a broker of the user's own may lack them.
async fn reaches_slots(bound: &[(TcpListener, SocketAddr)]) -> Result<()> {
    for (_, b) in bound {
        let reached = tokio::time::timeout(crate::domain::names::CONNECT_TIMEOUT, TcpStream::connect(b)).await;
        if !matches!(reached, Ok(Ok(_))) {
            let slot = b.port() - kafka::BROKER_BASE;
            return Err(Error::Kafka {
                context: "putting the fault proxy in front of Kafka".into(),
                cause: format!(
                    "the broker has no listener SLOT{slot} at {b}; `scripts/services.sh up` configures SLOT0 to SLOT{} (docs/running.md, \"Infrastructure faults\")",
                    kafka::SLOTS - 1
                ),
            });
        }
    }
    Ok(())
}

async fn accept(
    listener: TcpListener,
    slot: Arc<Slot>,
    (upstream, wire): (SocketAddr, Wire),
    faults: Arc<FaultInjector>,
    mut shutdown: Shutdown,
) {
    loop {
        let (client, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => { warn!(slot = %slot.name, cause = %e, "fault proxy accept failed"); continue }
            },
            _ = shutdown.wait() => return,
        };
        let id = slot.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (reset, reset_rx) = watch::channel(false);
        slot.conns.lock().unwrap_or_else(|p| p.into_inner()).push(Conn { id, reset });
        let (slot, faults) = (slot.clone(), faults.clone());
        tokio::spawn(async move {
            if let Err(e) = relay_connection(client, (upstream, wire), &slot, faults, reset_rx).await {
                debug!(slot = %slot.name, cause = %e, "proxied connection ended");
            }
            slot.forget(id);
        });
    }
}

/// Why a proxied connection ended, for the debug log.
type Ended = std::result::Result<(), String>;

async fn relay_connection(
    client: TcpStream,
    (upstream, wire): (SocketAddr, Wire),
    slot: &Arc<Slot>,
    faults: Arc<FaultInjector>,
    mut reset: watch::Receiver<bool>,
) -> Ended {
    let server = tokio::time::timeout(crate::domain::names::CONNECT_TIMEOUT, TcpStream::connect(upstream))
        .await
        .map_err(|_| "upstream connect timed out".to_string())?
        .map_err(|e| format!("upstream connect: {e}"))?;
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_r, mut client_w) = client.into_split();
    let (server_r, mut server_w) = server.into_split();
    let in_flight = kafka::InFlight::default();
    // The Kafka wire is read for its own points, and for what a kill after
    // a database commit reaches: the messages its process fetched.
    let watch_produce = FaultPoint::ALL
        .iter()
        .filter(|p| p.on_kafka_wire() || **p == FaultPoint::DbKillAfterCommit)
        .any(|p| faults.probability(*p) > 0.0);
    let outcome = match wire {
        Wire::Postgres => {
            let startup_left = opening(&mut client_r, &mut client_w, &mut server_w).await?;
            let holds = [FaultPoint::DbHoldCommit, FaultPoint::DbPauseInTransaction]
                .iter()
                .any(|p| faults.probability(*p) > 0.0);

            // Whether the connection's open transaction has changed rows, as
            // the server's tags show: only such a COMMIT may be held.
            let writing = std::sync::atomic::AtomicBool::new(false);
            let up = async {
                match holds {
                    true => pump_client(&mut client_r, server_w, startup_left, slot, &faults, &writing).await,
                    false => pump_bytes(&mut client_r, server_w, slot, &faults, None).await,
                }
            };
            let down = pump_server(server_r, &mut client_w, slot, &faults, &writing);
            tokio::select! {
                r = up => r,
                r = down => r,
                _ = reset.wait_for(|r| *r) => Err("reset by net.reset".into()),
            }
        }
        Wire::Kafka => {
            let up = pump_bytes(&mut client_r, server_w, slot, &faults, watch_produce.then_some(&in_flight));
            let down = pump_broker(server_r, &mut client_w, slot, &faults, watch_produce.then_some(&in_flight));
            tokio::select! {
                r = up => r,
                r = down => r,
                _ = reset.wait_for(|r| *r) => Err("reset by net.reset".into()),
            }
        }
    };
    if let Err(why) = &outcome {
        if why.starts_with("reset") {
            // An RST, as a broken network gives, rather than a clean close.
            // A zero linger never blocks the drop (the deprecation's
            // concern is a positive one).
            #[allow(deprecated)]
            let _ = client_w.as_ref().set_linger(Some(Duration::ZERO));
            // Dropping a write half sends a FIN first; forgetting it leaves
            // the close to the read half, which then sends the RST alone.
            client_w.forget();
            drop(client_r);
            return outcome;
        }
    }
    outcome
}

/// The client's first bytes: encryption requests answered `N` here, then
/// the startup message's first 8 bytes passed on. Gives how many bytes of
/// the startup message are still to come, before its first typed message.
async fn opening(
    client_r: &mut OwnedReadHalf,
    client_w: &mut OwnedWriteHalf,
    server_w: &mut OwnedWriteHalf,
) -> std::result::Result<usize, String> {
    loop {
        let mut first = [0u8; 8];
        client_r.read_exact(&mut first).await.map_err(|e| format!("reading the startup: {e}"))?;
        match pg::opening(&first) {
            pg::Opening::Encryption => client_w.write_all(b"N").await.map_err(|e| e.to_string())?,
            pg::Opening::Startup => {
                server_w.write_all(&first).await.map_err(|e| e.to_string())?;
                let len = u32::from_be_bytes([first[0], first[1], first[2], first[3]]) as usize;
                return Ok(len.saturating_sub(8));
            }
        }
    }
}

/// Starts a blackhole when this read is its occurrence and it fires,
/// waits out a blackhole, then the slot's latency and bandwidth for `n`
/// bytes.
async fn shape(slot: &Slot, n: usize, rng: &mut rand::rngs::StdRng, faults: &FaultInjector) {
    let struck = slot.armed.swap(false, Ordering::Relaxed)
        && faults.strike(FaultPoint::NetBlackhole, &slot.name, || {
            format!(
                "{} ms from a read of {n} bytes, {} open connection(s)",
                slot.blackhole_for.as_millis(),
                slot.open()
            )
        });
    if struck {
        slot.blackhole_until(Instant::now() + slot.blackhole_for);
    }
    // The sender keeps the latest blackhole whether or not anyone watches;
    // a new one set while this read waits extends the wait.
    let mut held = false;
    loop {
        let until = *slot.blackhole.borrow();
        match until {
            Some(t) if t > Instant::now() => {
                if !std::mem::replace(&mut held, true) {
                    // Counted, and a firing confirmed, as the read starts
                    // to wait: a reset may end the connection, and drop
                    // this wait, before the blackhole does.
                    slot.held.fetch_add(1, Ordering::Relaxed);
                    if struck {
                        faults.confirm(FaultPoint::NetBlackhole, 1);
                    }
                }
                tokio::time::sleep_until(t).await
            }
            _ => break,
        }
    }
    let s = &slot.shaping;
    if s.is_none() {
        return;
    }
    let mut delay = s.latency;
    if !s.jitter.is_zero() {
        let j = rng.gen_range(0..=2 * s.jitter.as_micros() as u64) as i64 - s.jitter.as_micros() as i64;
        delay = Duration::from_micros((delay.as_micros() as i64 + j).max(0) as u64);
    }
    if s.bytes_per_sec > 0 {
        delay += Duration::from_secs_f64(n as f64 / s.bytes_per_sec as f64);
    }
    tokio::time::sleep(delay).await;
}

/// The next read of one direction, shaped (a blackhole waited out, latency
/// and bandwidth) and counted for the slot; None at the end of the stream,
/// once the other side is told. Every pump reads through it.
async fn read_shaped(
    from: &mut OwnedReadHalf,
    buf: &mut [u8],
    to: &mut OwnedWriteHalf,
    slot: &Slot,
    rng: &mut rand::rngs::StdRng,
    faults: &FaultInjector,
) -> std::result::Result<Option<usize>, String> {
    let n = from.read(buf).await.map_err(|e| e.to_string())?;
    if n == 0 {
        let _ = to.shutdown().await;
        return Ok(None);
    }
    shape(slot, n, rng, faults).await;
    slot.moved.fetch_add(n as u64, Ordering::Relaxed);
    Ok(Some(n))
}

/// Client to server: bytes as they come, shaped. On Kafka's wire, with a
/// `kafka.*` point set, each request is noted before its bytes go on, so
/// that its response, which cannot come sooner, finds it.
async fn pump_bytes(
    from: &mut OwnedReadHalf,
    mut to: OwnedWriteHalf,
    slot: &Slot,
    faults: &FaultInjector,
    mut requests: Option<&kafka::InFlight>,
) -> Ended {
    let mut buf = vec![0u8; 64 * 1024];
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut framing = kafka::Requests::default();
    loop {
        let Some(n) = read_shaped(from, &mut buf, &mut to, slot, &mut rng, faults).await? else { return Ok(()) };
        if let Some(in_flight) = requests {
            match framing.feed(&buf[..n]) {
                Ok(seen) => {
                    if slot.relay && seen.iter().any(|r| r.api_key == kafka::PRODUCE) {
                        slot.relay_produces.send_modify(|n| *n += 1);
                    }
                    seen.into_iter().for_each(|r| in_flight.sent(r));
                    framing.commits().into_iter().for_each(|(c, p)| in_flight.commits(c, p));
                }
                Err(at) => {
                    warn!(slot = %slot.name, at, "the client's stream is not Kafka framing; passing it on unread");
                    requests = None;
                }
            }
        }
        to.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
    }
}

/// Broker to client, with a `kafka.*` point set: each response's header is
/// read, and a `Produce` response (the broker's acknowledgement) may be
/// withheld (`kafka.produce_ack_lost`) or followed by a kill
/// (`kafka.kill_after_produce_ack`), an `OffsetCommit` response
/// followed by a kill (`kafka.kill_after_offset_commit`), and a `Fetch`
/// response that carries records followed by a kill
/// (`kafka.kill_after_fetch`). Without one, bytes as they come.
async fn pump_broker(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    slot: &Slot,
    faults: &FaultInjector,
    mut requests: Option<&kafka::InFlight>,
) -> Ended {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut framing = kafka::Responses::default();
    // A kill claimed for an acknowledgement whose end has not come yet.
    // Dropped, however this pump ends, it kills: a reset or a failed write
    // must not leave a fired kill undone.
    let mut kill_at_end: Option<Claimed<'_>> = None;
    let reads = FetchReads::of(faults);
    // A fetch response begun in an earlier read, not yet decided.
    let mut fetching: Option<kafka::Fetched> = None;
    loop {
        let Some(n) = read_shaped(&mut from, &mut chunk, to, slot, &mut rng, faults).await? else { return Ok(()) };
        let Some(in_flight) = requests else {
            to.write_all(&chunk[..n]).await.map_err(|e| e.to_string())?;
            continue;
        };
        buf.extend_from_slice(&chunk[..n]);
        let left_before = framing.continuing();
        let scan = match framing.scan(&buf) {
            Ok(s) => s,
            Err(at) => {
                warn!(slot = %slot.name, at, "the broker's stream is not Kafka framing; passing it on unread");
                to.write_all(&buf).await.map_err(|e| e.to_string())?;
                requests = None;
                continue;
            }
        };
        // A fetch begun in an earlier read: its next bytes head this buffer.
        if let Some(f) = fetching.take() {
            let strike = reads.strike && kill_at_end.is_none();
            let (rest, claimed) = fetch_continued(f, &buf, left_before, strike, slot, faults);
            fetching = rest;
            kill_at_end = kill_at_end.or(claimed);
        }
        // An acknowledgement begun in an earlier read ends in this one.
        let mut kill = if left_before <= scan.safe { kill_at_end.take() } else { None };
        for f in &scan.frames {
            // Responses after a claimed kill go to a process about to die:
            // no occurrence of any point.
            if kill.is_some() || kill_at_end.is_some() {
                break;
            }
            let Some((point, what, reach)) = occurrence(f, &buf, in_flight, slot, reads, &mut fetching) else {
                continue;
            };
            if point == FaultPoint::KafkaKillAfterProduceAck
                && faults.strike(FaultPoint::KafkaProduceAckLost, &slot.name, || "a produce's acknowledgement".into())
            {
                return withhold_ack(to, &buf[..f.start], faults).await;
            }
            let claimed = slot.process.claim_kill_reaching(
                faults,
                point,
                &slot.name,
                || format!("the process, once {what}"),
                move || reach,
            );
            match f.end {
                Some(_) => kill = claimed,
                None => kill_at_end = claimed,
            }
        }
        // An acknowledgement's kill lands before it is written (see
        // `Claimed::before_write`); a fetch's once its records are.
        let kill = kill.and_then(Claimed::before_write);
        to.write_all(&buf[..scan.safe]).await.map_err(|e| e.to_string())?;
        buf.drain(..scan.safe);
        drop(kill);
    }
}

/// Which fetch responses the proxy reads. They are read only when a point
/// needs them: a consumer's reads are most of its bytes. Their kill needs
/// their first bytes; a kill after a database commit and a zombie, what
/// each one delivered (read whole): a zombie is made only of a transaction
/// with fetched messages in hand.
#[derive(Clone, Copy)]
struct FetchReads {
    /// `kafka.kill_after_fetch` may strike.
    strike: bool,
    /// Each is read whole, for what it delivered.
    whole: bool,
}

impl FetchReads {
    fn of(faults: &FaultInjector) -> Self {
        Self {
            strike: faults.probability(FaultPoint::KafkaKillAfterFetch) > 0.0,
            whole: [FaultPoint::DbKillAfterCommit, FaultPoint::DbPauseInTransaction]
                .iter()
                .any(|p| faults.probability(*p) > 0.0),
        }
    }

    fn any(&self) -> bool {
        self.strike || self.whole
    }
}

/// `kafka.produce_ack_lost`: the broker appended the batches, and the
/// client never hears. What came before the acknowledgement is written,
/// then the connection is reset.
async fn withhold_ack(to: &mut OwnedWriteHalf, before: &[u8], faults: &FaultInjector) -> Ended {
    to.write_all(before).await.map_err(|e| e.to_string())?;
    faults.confirm(FaultPoint::KafkaProduceAckLost, 1);
    Err("reset after withholding a produce's acknowledgement (kafka.produce_ack_lost)".into())
}

/// A fetch response begun in an earlier read, fed the bytes of it that
/// head this buffer (`left_before` of them, or all the buffer). Returns it
/// when more of it is wanted, and the kill claimed when it turned out to
/// carry records and `strike` says a fetch may be struck.
fn fetch_continued<'a>(
    mut f: kafka::Fetched,
    buf: &[u8],
    left_before: usize,
    strike: bool,
    slot: &'a Slot,
    faults: &'a FaultInjector,
) -> (Option<kafka::Fetched>, Option<Claimed<'a>>) {
    let mine = left_before.min(buf.len());
    let undecided = !f.decided();
    let mut claimed = None;
    match f.feed(&buf[..mine]) {
        Some(true) if undecided && strike => {
            claimed = slot.process.claim_kill(faults, FaultPoint::KafkaKillAfterFetch, &slot.name, || {
                "the process, once a fetch with records reached it".into()
            })
        }
        Some(_) => {}
        None if left_before > buf.len() => {}
        None => {
            debug!(slot = %slot.name, version = f.version(), head = %f.head_hex(), "a fetch response the proxy could not read; no occurrence")
        }
    }
    match left_before > buf.len() {
        true if f.wants_more() => return (Some(f), claimed),
        true => {}
        false => slot.delivered(f.delivered()),
    }
    (None, claimed)
}

/// The kill point a response is an occurrence of, the words for what the
/// process saw, and what the kill reaches; `None` for a response of no
/// point. An offset commit's answer moves the slot's count and positions
/// whether or not it is struck; a fetch read in part is followed into the
/// next reads through `fetching`.
fn occurrence(
    f: &kafka::Frame,
    buf: &[u8],
    in_flight: &kafka::InFlight,
    slot: &Slot,
    reads: FetchReads,
    fetching: &mut Option<kafka::Fetched>,
) -> Option<(FaultPoint, &'static str, Reach)> {
    let mut reach = Reach::default();
    let (point, what) = match in_flight.answered(f.correlation).map(|r| (r.api_key, r.api_version)) {
        Some((kafka::PRODUCE, _)) => (FaultPoint::KafkaKillAfterProduceAck, "its produce was acknowledged"),
        Some((kafka::OFFSET_COMMIT, version)) => {
            // The coordinator answered: the group's position moved,
            // whether or not the client reads the answer, except
            // for the partitions it refused (a fenced zombie's).
            slot.offset_commits.send_modify(|n| *n += 1);
            let refused =
                f.end.and_then(|end| kafka::offset_commit_refused(version, &buf[f.start..end])).unwrap_or_default();
            reach = slot.committing(in_flight.positions(f.correlation).unwrap_or_default(), &refused);
            (FaultPoint::KafkaKillAfterOffsetCommit, "its offset commit was acknowledged")
        }
        Some((kafka::FETCH, version)) if reads.any() => {
            // Decided by the bytes in this buffer, or followed into
            // the next reads until its first record set's length
            // (or its end, when it is read whole).
            let mut fetched = kafka::Fetched::new(version, reads.whole);
            let decided = fetched.feed(&buf[f.start..f.end.unwrap_or(buf.len())]);
            match f.end {
                Some(_) => slot.delivered(fetched.delivered()),
                None if fetched.wants_more() => *fetching = Some(fetched),
                None => {}
            }
            match decided {
                Some(true) if reads.strike => (FaultPoint::KafkaKillAfterFetch, "a fetch with records reached it"),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some((point, what, reach))
}

/// How long `db.hold_commit` holds a `COMMIT`: longer than the 5 s
/// auto-commit interval of librdkafka and of the Java client, so that a
/// consumer committing in the background does so during the hold.
const COMMIT_HOLD: Duration = Duration::from_secs(6);

/// How long a writer's held COMMIT waits, after [`COMMIT_HOLD`], for a
/// relay to send a batch before it goes on anyway.
const RELAY_WAIT: Duration = Duration::from_secs(3);

/// Client to server on PostgreSQL's wire, with `db.hold_commit` set: each
/// `BEGIN` notes how many offset commits the slot had, and each `COMMIT`
/// of a process is an occurrence. A fired one kills the process, the
/// `COMMIT` unsent, if an offset commit was answered since the `BEGIN`, or
/// is answered within [`COMMIT_HOLD`]; otherwise it goes on.
async fn pump_client(
    from: &mut OwnedReadHalf,
    mut to: OwnedWriteHalf,
    startup_left: usize,
    slot: &Slot,
    faults: &FaultInjector,
    writing: &std::sync::atomic::AtomicBool,
) -> Ended {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut queries = pg::Queries::after(startup_left);
    let mut began = *slot.offset_commits.borrow();
    loop {
        let Some(n) = read_shaped(from, &mut chunk, &mut to, slot, &mut rng, faults).await? else { return Ok(()) };
        buf.extend_from_slice(&chunk[..n]);
        let scan = match queries.scan(&buf) {
            Ok(s) => s,
            Err(at) => {
                warn!(slot = %slot.name, at, "the client's stream is not PostgreSQL framing; passing it on unread");
                to.write_all(&buf).await.map_err(|e| e.to_string())?;
                return pump_bytes(from, to, slot, faults, None).await;
            }
        };
        let mut passed = 0;
        for (at, block) in scan.blocks {
            match block {
                pg::Block::Begin => began = *slot.offset_commits.borrow(),
                pg::Block::Commit => {
                    to.write_all(&buf[passed..at]).await.map_err(|e| e.to_string())?;
                    passed = at;
                    // An empty or read-only transaction holds no work to
                    // lose: its COMMIT is no occurrence.
                    // The hold occupies the process (nemesis::signal): no
                    // other fault draws on it until the hold resolves.
                    let occupied = match writing.load(Ordering::Relaxed) {
                        true => slot.process.occupant.occupy(FaultPoint::DbHoldCommit, || {
                            faults.strike(FaultPoint::DbHoldCommit, &slot.name, || "a COMMIT, held".into())
                        }),
                        false => None,
                    };
                    if let Some(serial) = occupied {
                        match hold_commit(slot, faults, began, serial).await {
                            Held::GoOn => {}
                            Held::Killed => return Err("the process killed, its COMMIT held (db.hold_commit)".into()),
                            // A dead process's COMMIT must not reach the
                            // server: its connection drops, and the
                            // server rolls the transaction back.
                            Held::Ended => {
                                return Err(
                                    "the process ended during the hold; its COMMIT dropped (db.hold_commit)".into()
                                )
                            }
                        }
                    }
                    began = *slot.offset_commits.borrow();
                }
            }
        }
        to.write_all(&buf[passed..scan.safe]).await.map_err(|e| e.to_string())?;
        buf.drain(..scan.safe);
    }
}

/// `db.pause_in_transaction` in a scan of the server's stream: a zombie is
/// stopped before its block's first statement's answer reaches it (what
/// comes before is written), unless a commit's acknowledgement, to be seen
/// first, comes before it. Returns how much of `buf` was written.
async fn stop_zombie(
    slot: &Slot,
    faults: &FaultInjector,
    buf: &[u8],
    scan: &pg::Scan,
    to: &mut OwnedWriteHalf,
) -> std::result::Result<usize, String> {
    let at = scan.firsts.first().copied().filter(|at| {
        *at <= scan.safe
            && scan.acks.iter().all(|a| a.start >= *at)
            && faults.probability(FaultPoint::DbPauseInTransaction) > 0.0
    });
    let Some((at, quiet)) = at.and_then(|at| Some((at, zombie_drawn(slot, faults)?))) else { return Ok(0) };
    to.write_all(&buf[..at]).await.map_err(|e| e.to_string())?;
    match zombie(slot, faults, quiet).await {
        true => Ok(at),
        false => Err("the process ended during its pause (db.pause_in_transaction)".into()),
    }
}

/// A consumer's block just had its first statement that read or wrote
/// rows answered (the inbox's read, or its claim): the incarnation
/// `db.pause_in_transaction` struck and occupies, when the draw fired. The
/// zombie is stopped before the answer reaches it.
///
/// Only while every other consumer is free of faults, which it then keeps
/// from them until the zombie has acted (returned after its own serial):
/// a new owner killed, or a zombie itself, would hand the messages on
/// again before anyone handled them.
fn zombie_drawn(slot: &Slot, faults: &FaultInjector) -> Option<Vec<(Arc<Occupant>, u64)>> {
    if !slot.consumer || slot.zombies.resting() {
        return None;
    }
    // With Kafka's wire read, only a transaction with fetched messages in
    // hand is an occurrence: one that makes the program's tables, or an
    // idle poll's, holds nothing a new owner could handle too.
    let occupant = &slot.process.occupant;
    let reach = slot.uncommitted(occupant.current());
    if slot.kafka.is_some() && reach.spans.is_empty() {
        return None;
    }
    let point = FaultPoint::DbPauseInTransaction;
    let mut quiet = Vec::new();
    for (_, other) in slot.zombies.consumers.get().into_iter().flatten().filter(|(name, _)| *name != slot.name) {
        match other.occupy(point, || true) {
            Some(serial) => quiet.push((other.clone(), serial)),
            None => {
                quiet.iter().for_each(|(o, s): &(Arc<Occupant>, u64)| o.release(*s));
                return None;
            }
        }
    }
    let hit = || "a transaction, its first statement sent".into();
    match occupant.occupy(point, || faults.strike_reaching(point, &slot.name, hit, || reach)) {
        Some(serial) => {
            quiet.insert(0, (occupant.clone(), serial));
            Some(quiet)
        }
        None => {
            quiet.iter().for_each(|(o, s)| o.release(*s));
            None
        }
    }
}

/// Longest wait for the keeper to wake a paused process: past any pause
/// a scenario sets, so a keeper gone is not a proxy stuck.
const PAUSE_BOUND: Duration = Duration::from_secs(120);

/// A fired `db.pause_in_transaction` on the incarnation it occupies (the
/// first of `quiet`; the other consumers follow): the keeper stops the
/// process (its group gives its partitions away while its transaction is
/// open) and wakes it after the scenario's pause, confirmed here. All are
/// released [`crate::nemesis::signal::PAUSE_AFTERMATH`] after the wake. False when the
/// incarnation ended first: its next statement must not reach the server.
async fn zombie(slot: &Slot, faults: &FaultInjector, quiet: Vec<(Arc<Occupant>, u64)>) -> bool {
    let (occupant, drawn) = (&slot.process.occupant, tokio::time::Instant::now());
    let serial = quiet[0].1;
    let mut wakes = occupant.wakes();
    wakes.borrow_and_update();
    let told = match &*slot.process.keeper.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(keeper) => keeper.send((FaultPoint::DbPauseInTransaction, serial, None)).is_ok(),
        None => false,
    };
    let woke = told && tokio::time::timeout(PAUSE_BOUND, wakes.changed()).await.is_ok_and(|r| r.is_ok());
    let alive = occupant.current() == Some(serial);
    match (woke, alive) {
        (true, true) => {
            info!(slot = %slot.name, "db.pause_in_transaction: the zombie woke with its transaction open");
            faults.confirm(FaultPoint::DbPauseInTransaction, 1);
            let zombies = slot.zombies.clone();
            tokio::spawn(async move {
                tokio::time::sleep(crate::nemesis::signal::PAUSE_AFTERMATH).await;
                quiet.iter().for_each(|(o, s)| o.release(*s));
                zombies.rest(drawn);
            });
            return true;
        }
        (false, true) => {
            faults.preempt(FaultPoint::DbPauseInTransaction, &slot.name, "the process was not seen stopped")
        }
        (_, false) => {
            faults.preempt(FaultPoint::DbPauseInTransaction, &slot.name, "the process ended during its pause")
        }
    }
    quiet.iter().for_each(|(o, s)| o.release(*s));
    slot.zombies.rest(drawn);
    alive
}

/// How a fired `db.hold_commit` ended.
enum Held {
    /// The offsets did not move during the hold (confirmed): the COMMIT goes on.
    GoOn,
    /// The offsets moved while the transaction was open: the process killed.
    Killed,
    /// The incarnation the hold was struck on ended, or another kill claimed
    /// it, first: the firing is pre-empted, and the COMMIT is dropped.
    Ended,
}

/// A fired hold not yet resolved. Dropped so (its pump ended mid-hold: a
/// reset, the run's stop), the firing is pre-empted: it had no effect of
/// its own to see. Dropped either way, it releases the process it
/// occupied, so the other faults draw on it again.
struct Hold<'a> {
    faults: &'a FaultInjector,
    slot: &'a Slot,
    serial: u64,
    open: bool,
}

impl Hold<'_> {
    fn preempted(&mut self, why: &str) {
        self.open = false;
        self.faults.preempt(FaultPoint::DbHoldCommit, &self.slot.name, why);
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if self.open {
            self.preempted("the connection ended during the hold");
        }
        self.slot.process.occupant.release(self.serial);
    }
}

/// A fired `db.hold_commit` on the slot's incarnation `serial`, which it
/// occupies ([`crate::nemesis::signal::Occupant::occupy`]): killed because
/// the slot's offsets moved after `began`; or the hold ended with them
/// unmoved (confirmed here); or the incarnation ended on its own first
/// (pre-empted). No other fault strikes it meanwhile.
async fn hold_commit(slot: &Slot, faults: &FaultInjector, began: u64, serial: u64) -> Held {
    let mut hold = Hold { faults, slot, serial, open: true };
    let writers_before = slot.writer_commits.load(Ordering::Relaxed);
    let mut commits = slot.offset_commits.subscribe();
    let moved = tokio::time::timeout(COMMIT_HOLD, commits.wait_for(|n| *n != began)).await.is_ok();
    if !moved && slot.writer {
        // A writer's row is let through as a relay sends a batch: that
        // relay has claimed rows inserted after it and not yet marked
        // them, so a mark by range (every row up to the highest sent)
        // takes this one too. A correct relay's mark names its rows.
        let mut produces = slot.relay_produces.subscribe();
        produces.borrow_and_update();
        let _ = tokio::time::timeout(RELAY_WAIT, produces.changed()).await;
    }
    let occupant = &slot.process.occupant;
    if !moved {
        if occupant.current() != Some(serial) {
            hold.preempted("the process ended on its own during the hold");
            return Held::Ended;
        }
        hold.open = false;
        info!(slot = %slot.name, "db.hold_commit: no offset commit during the hold; the COMMIT goes on");
        faults.confirm(FaultPoint::DbHoldCommit, 1);
        if slot.writer {
            slot.overtaken(writers_before);
        }
        if slot.consumer {
            Stats::add(&slot.stats.consumer_holds, 1);
        }
        return Held::GoOn;
    }
    match slot.process.claim_occupied(serial, FaultPoint::DbHoldCommit) {
        Some(kill) => {
            hold.open = false;
            Stats::add(&slot.stats.consumer_holds, 1);
            info!(slot = %slot.name, "db.hold_commit: the offsets moved while the transaction was open; killing");
            drop(kill);
            Held::Killed
        }
        None => {
            hold.preempted("the offsets moved, but the process had ended on its own");
            Held::Ended
        }
    }
}

/// Server to client: whole messages, so that a commit's acknowledgement
/// can be seen, withheld or followed by a kill. A commit's
/// `CommandComplete` waits in the buffer until its `ReadyForQuery` comes.
async fn pump_server(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    slot: &Slot,
    faults: &FaultInjector,
    writing: &std::sync::atomic::AtomicBool,
) -> Ended {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut acks = pg::Acks::default();
    let watch_commits = [FaultPoint::DbCommitAckLost, FaultPoint::DbKillAfterCommit, FaultPoint::DbHoldCommit]
        .iter()
        .any(|p| faults.probability(*p) > 0.0);
    loop {
        let Some(n) = read_shaped(&mut from, &mut chunk, to, slot, &mut rng, faults).await? else { return Ok(()) };
        if !watch_commits {
            to.write_all(&chunk[..n]).await.map_err(|e| e.to_string())?;
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        let scan = match acks.scan(&buf) {
            Ok(s) => s,
            Err(at) => {
                warn!(slot = %slot.name, at, "the server's stream is not PostgreSQL framing; passing it on unread");
                to.write_all(&buf).await.map_err(|e| e.to_string())?;
                buf.clear();
                acks = pg::Acks::default();
                continue;
            }
        };
        writing.store(acks.writing(), Ordering::Relaxed);
        let written = stop_zombie(slot, faults, &buf, &scan, to).await?;
        let mut kill = None;
        for ack in &scan.acks {
            // Acknowledgements after a claimed kill go to a process about
            // to die: no occurrence of either point.
            if kill.is_some() {
                break;
            }
            let start = &ack.start;
            let kind = if ack.wrote { &slot.stats.commits_written } else { &slot.stats.commits_empty };
            Stats::add(kind, 1);
            if ack.wrote && slot.writer {
                slot.writer_commits.fetch_add(1, Ordering::Relaxed);
            }
            if faults.strike(FaultPoint::DbCommitAckLost, &slot.name, || "a commit's acknowledgement".into()) {
                // Everything before the acknowledgement goes through; the
                // acknowledgement and what follows it never do.
                to.write_all(&buf[written..*start]).await.map_err(|e| e.to_string())?;
                faults.confirm(FaultPoint::DbCommitAckLost, 1);
                return Err("reset after withholding a commit's acknowledgement (db.commit_ack_lost)".into());
            }
            if !ack.wrote {
                // An empty or read-only commit (an idle poll) holds no work:
                // no occurrence of an aimed kill.
                continue;
            }
            // What it reaches: the messages its process fetched past the
            // group's position, which the group delivers again.
            let serial = slot.process.occupant.current();
            kill = slot.process.claim_kill_reaching(
                faults,
                FaultPoint::DbKillAfterCommit,
                &slot.name,
                || "the process, once its commit was acknowledged".into(),
                || slot.uncommitted(serial),
            );
        }
        // The commit is done on the server: the claimed kill lands before
        // its acknowledgement is written. Written first, a process the
        // machine schedules before the proxy could act on it (a mark-first
        // relay producing what it had just marked) and hide the window.
        drop(kill);
        to.write_all(&buf[written.min(scan.safe)..scan.safe]).await.map_err(|e| e.to_string())?;
        buf.drain(..scan.safe);
        acks.consumed(scan.safe);
    }
}

impl ProcessHandle {
    /// The decision of a kill after an acknowledgement: an occurrence only
    /// while the slot has a process no other kill has claimed. The two
    /// wires of a slot, and the keeper, decide under the occupant's lock,
    /// so one process is claimed once.
    fn claim_kill(
        &self,
        faults: &FaultInjector,
        point: FaultPoint,
        slot: &str,
        what: impl FnOnce() -> String,
    ) -> Option<Claimed<'_>> {
        self.claim_kill_reaching(faults, point, slot, what, Reach::default)
    }

    /// [`ProcessHandle::claim_kill`], logging what the window reached: an
    /// offset commit's messages, or those a killed process had fetched
    /// and the group had not committed. `reach` runs under the occupant's
    /// lock, only for a firing: it must not take that lock again.
    fn claim_kill_reaching(
        &self,
        faults: &FaultInjector,
        point: FaultPoint,
        slot: &str,
        what: impl FnOnce() -> String,
        reach: impl FnOnce() -> Reach,
    ) -> Option<Claimed<'_>> {
        let claim = self.occupant.claim(|| faults.strike_reaching(point, slot, what, reach))?;
        Some(Claimed { process: self, claim: Some(claim), point })
    }

    /// The kill of a lasting fault that occupies incarnation `serial`
    /// (`db.hold_commit`): None when the slot no longer holds it.
    fn claim_occupied(&self, serial: u64, point: FaultPoint) -> Option<Claimed<'_>> {
        let claim = self.occupant.claim_occupied(serial, point)?;
        Some(Claimed { process: self, claim: Some(claim), point })
    }
}

/// A fired kill after a response (`db.kill_after_commit`,
/// `kafka.kill_after_produce_ack`, `kafka.kill_after_offset_commit`,
/// `kafka.kill_after_fetch`): its drop sends SIGKILL to the claimed
/// incarnation, which the pump does the moment the acknowledgement is
/// written, and which also happens when the pump ends first. The keeper is
/// told first, so that it takes the end it sees for this kill, and
/// confirms it.
struct Claimed<'a> {
    process: &'a ProcessHandle,
    claim: Option<Claim>,
    point: FaultPoint,
}

impl<'a> Claimed<'a> {
    /// Lands the kill now unless it follows a fetch. Once an
    /// acknowledgement is written, a process the machine schedules before
    /// the proxy could act on it (produce what it had just marked) and hide
    /// the window; the server has done the work either way. A fetch's
    /// records must reach the process first: it is kept for after.
    fn before_write(self) -> Option<Self> {
        (self.point == FaultPoint::KafkaKillAfterFetch).then_some(self)
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else { return };
        if let Some(keeper) = &*self.process.keeper.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = keeper.send((self.point, claim.serial(), None));
        }
        self.process.occupant.signal_claimed(&claim, libc::SIGKILL);
    }
}

/// A slot's `net.reset` and `net.blackhole`: once a second at a random
/// instant, while the run is acting and the slot has a connection open
/// that carried bytes in the last second (an idle slot is no occurrence),
/// a reset strikes, and the blackhole is armed for the slot's next read.
/// With `[nemesis] aimed = "per-second"`, each aimed kill draws at the
/// same instant for the slot's process, busy or idle, as long as it has a
/// connection open (it lives): an armed process is struck at one of its next
/// four windows ([`FaultInjector::arm`]).
async fn nemesis(
    slot: Arc<Slot>,
    faults: Arc<FaultInjector>,
    mut acting: watch::Receiver<bool>,
    mut rng: rand::rngs::StdRng,
    struck: Vec<FaultPoint>,
    mut shutdown: Shutdown,
) {
    let mut second = Instant::now();
    let mut moved = 0;
    loop {
        let at = second + Duration::from_millis(rng.gen_range(0..1000));
        second += Duration::from_secs(1);
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = shutdown.wait() => return,
        }
        let now = slot.moved.load(Ordering::Relaxed);
        let busy = now != moved;
        moved = now;
        let live = *acting.borrow_and_update() && slot.open() > 0;
        // A consumer is not armed while its group rebalances: a kill then
        // only makes it rebalance again.
        let aimed = struck.iter().any(|p| p.aimed());
        if live && aimed {
            match faults.waits_for_group(&slot.name) {
                true => Stats::add(&slot.stats.group_waits, 1),
                false => struck.iter().filter(|p| p.aimed()).for_each(|p| {
                    faults.arm(*p, &slot.name);
                }),
            }
        }
        if !live || !busy {
            tokio::select! {
                _ = tokio::time::sleep_until(second) => continue,
                _ = shutdown.wait() => return,
            }
        }
        let open = slot.open();
        if struck.contains(&FaultPoint::NetReset)
            && faults.strike(FaultPoint::NetReset, &slot.name, || format!("{open} open connection(s)"))
        {
            let n = slot.reset_all();
            if n > 0 {
                faults.confirm(FaultPoint::NetReset, 1);
            }
        }
        if struck.contains(&FaultPoint::NetBlackhole) {
            slot.armed.store(true, Ordering::Relaxed);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(second) => {}
            _ = shutdown.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A zombie takes every consumer from the other faults for its span;
    /// the next one waits as long again, so those faults keep half.
    #[tokio::test(start_paused = true)]
    async fn a_zombie_is_followed_by_a_rest_as_long_as_it() {
        let z = Zombies::default();
        assert!(!z.resting(), "no zombie yet, no rest");
        let drawn = tokio::time::Instant::now();
        tokio::time::advance(Duration::from_secs(17)).await;
        z.rest(drawn);
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(z.resting(), "16 s after a 17 s zombie");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!z.resting(), "18 s after it");
    }

    /// A zombie needs each fetch's delivered messages (read whole) as a kill
    /// after a commit does: set alone, `db.pause_in_transaction` met no
    /// window behind the Kafka proxy (a probe of a Java system: 5 arms, no
    /// window), since only the other point turned the whole reads on.
    #[test]
    fn every_point_that_reaches_fetched_messages_reads_fetches_whole() {
        let rates = |p: FaultPoint| FaultInjector::new(1, &crate::faults::FaultRates::none().with(p, 0.1));
        for p in [FaultPoint::DbKillAfterCommit, FaultPoint::DbPauseInTransaction] {
            assert!(FetchReads::of(&rates(p)).whole, "{}", p.name());
        }
        let only_kill = FetchReads::of(&rates(FaultPoint::KafkaKillAfterFetch));
        assert!(only_kill.strike && !only_kill.whole, "a fetch's kill needs only its first bytes");
        assert!(!FetchReads::of(&rates(FaultPoint::ProcessKill)).any(), "no point that reads fetches");
    }

    /// Issue 41's cause: `(pgid > 0).then_some(Claimed { .. })` built the
    /// kill eagerly, and on an empty or claimed slot dropped it at once:
    /// its drop told the keeper of a kill and sent `kill(-0, SIGKILL)`,
    /// chaos's own process group. A claim that fails must build nothing.
    #[test]
    fn a_claim_on_an_empty_or_claimed_slot_strikes_nothing() {
        let h = ProcessHandle::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        *h.keeper.lock().unwrap() = Some(tx);
        assert!(h.claim_occupied(1, FaultPoint::DbHoldCommit).is_none(), "an empty slot has no process to kill");
        assert!(rx.try_recv().is_err(), "a failed claim told the keeper of a kill");
        let faults = FaultInjector::new(1, &crate::faults::FaultRates::none().with(FaultPoint::DbKillAfterCommit, 1.0));
        assert!(h.claim_kill(&faults, FaultPoint::DbKillAfterCommit, "notifier-1", || "x".into()).is_none());
        assert_eq!(faults.reached(FaultPoint::DbKillAfterCommit), 0, "no process, no occurrence");
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let lease = h.occupant.enter(child.id() as i32).unwrap();
        let first = h.claim_kill(&faults, FaultPoint::DbKillAfterCommit, "notifier-1", || "x".into()).expect("claimed");
        assert!(h.claim_occupied(lease.serial(), FaultPoint::DbHoldCommit).is_none(), "one kill per incarnation");
        assert!(
            h.claim_occupied(lease.serial() + 1, FaultPoint::DbHoldCommit).is_none(),
            "never on another incarnation"
        );
        assert!(rx.try_recv().is_err(), "a failed claim told the keeper of a kill");
        drop(first);
        let (point, serial, claim) = rx.try_recv().expect("the kill is told to the keeper");
        assert_eq!((point, serial, claim.is_none()), (FaultPoint::DbKillAfterCommit, lease.serial(), true));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    /// A held COMMIT ends one of three ways: the offsets moved (a kill on
    /// the incarnation it was struck on), the hold ran out with them
    /// unmoved (confirmed), or the incarnation went first (pre-empted,
    /// never a kill of the next one and never counted unconfirmed).
    #[tokio::test]
    async fn a_hold_keeps_its_process_from_other_faults_and_ends_one_of_three_ways() {
        let faults = Arc::new(FaultInjector::new(1, &crate::faults::FaultRates::none()));
        let (_trigger, shutdown) = crate::context::shutdown_pair();
        let settings = Settings {
            upstream_url: "postgres://u:p@127.0.0.1:9/db",
            slots: vec!["notifier-1".into()],
            shaping: Shaping::default(),
            blackhole: Duration::from_secs(1),
            kafka: false,
            stats: Default::default(),
        };
        let proxy = Proxy::start(settings, faults.clone(), shutdown).await.unwrap();
        let slot = proxy.slot("notifier-1").unwrap();
        let spawn = || std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        use std::os::unix::process::ExitStatusExt;

        // The offsets move during the hold: the held incarnation is killed.
        let occupy = |serial| slot.process.occupant.occupy(FaultPoint::DbHoldCommit, || true) == Some(serial);
        let mut child = spawn();
        let lease = slot.process.occupant.enter(child.id() as i32).unwrap();
        assert!(occupy(lease.serial()));
        slot.offset_commits.send_modify(|n| *n += 1);
        assert!(matches!(hold_commit(slot, &faults, 0, lease.serial()).await, Held::Killed));
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        lease.ended();
        drop(lease);

        // Another striker during the hold draws nothing and claims
        // nothing: the hold keeps its own kill, and nothing is pre-empted.
        let mut child = spawn();
        let lease = slot.process.occupant.enter(child.id() as i32).unwrap();
        assert!(occupy(lease.serial()));
        let mut drawn = false;
        let other = slot.process.occupant.claim(|| {
            drawn = true;
            true
        });
        assert!(other.is_none(), "another fault claimed a held process");
        assert!(!drawn, "a kill drawn on a held process");
        slot.offset_commits.send_modify(|n| *n += 1);
        assert!(matches!(hold_commit(slot, &faults, 1, lease.serial()).await, Held::Killed));
        assert_eq!(faults.preempted(FaultPoint::DbHoldCommit), 0);
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        lease.ended();
        drop(lease);

        // The incarnation ends during the hold, the offsets unmoved: its
        // COMMIT is dropped and the firing pre-empted, not confirmed.
        let mut child = spawn();
        let lease = slot.process.occupant.enter(child.id() as i32).unwrap();
        let serial = lease.serial();
        assert!(occupy(serial));
        let ender = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            child.kill().unwrap();
            child.wait().unwrap();
            lease.ended();
        };
        let (held, ()) = tokio::join!(hold_commit(slot, &faults, 2, serial), ender);
        assert!(matches!(held, Held::Ended));
        assert_eq!(faults.preempted(FaultPoint::DbHoldCommit), 1);
        assert_eq!(faults.confirmed(FaultPoint::DbHoldCommit), 0);
        let why = faults.summary().into_iter().find(|f| f.point == "db.hold_commit").unwrap().preempted_why;
        assert!(why.iter().all(|w| w.starts_with("notifier-1 at ")), "{why:?}");
    }

    /// What a kill after a database commit reaches: the messages the
    /// incarnation fetched past the group's committed position. A refused
    /// offset commit (a zombie's) does not move that position, and another
    /// incarnation's fetches are not this one's.
    #[tokio::test]
    async fn a_kill_reaches_what_its_process_fetched_past_the_groups_position() {
        let faults = Arc::new(FaultInjector::new(1, &crate::faults::FaultRates::none()));
        let (_trigger, shutdown) = crate::context::shutdown_pair();
        let settings = Settings {
            upstream_url: "postgres://u:p@127.0.0.1:9/db",
            slots: vec!["consumer-1".into(), "consumer-2".into()],
            shaping: Shaping::default(),
            blackhole: Duration::from_secs(1),
            kafka: false,
            stats: Default::default(),
        };
        let proxy = Proxy::start(settings, faults, shutdown).await.unwrap();
        let (one, two) = (proxy.slot("consumer-1").unwrap(), proxy.slot("consumer-2").unwrap());
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let lease = one.process.occupant.enter(child.id() as i32).unwrap();
        let serial = Some(lease.serial());
        assert_eq!(one.uncommitted(serial), Reach::default(), "nothing fetched yet");
        one.delivered(Some(vec![(0, 14), (1, 3)]));
        one.delivered(Some(vec![(0, 9), (2, 40)]));
        // The group committed partition 0 up to 10 and partition 1 past
        // what this process fetched of it, through the other slot.
        assert_eq!(two.committing(vec![(0, 10), (1, 5)], &[]).spans, vec![(0, 0, 9), (1, 0, 4)]);
        assert_eq!(one.uncommitted(serial).spans, vec![(0, 10, 14), (2, 0, 40)]);
        // A refused commit moves nothing and covers nothing.
        assert!(two.committing(vec![(0, 15), (2, 41)], &[0, 2]).spans.is_empty());
        assert_eq!(one.uncommitted(serial).spans, vec![(0, 10, 14), (2, 0, 40)]);
        assert_eq!(two.committing(vec![(0, 15), (2, 41)], &[2]).spans, vec![(0, 10, 14)]);
        assert_eq!(one.uncommitted(serial).spans, vec![(2, 0, 40)]);
        assert!(one.uncommitted(Some(lease.serial() + 1)).spans.is_empty(), "another incarnation fetched nothing");
        assert!(one.uncommitted(None).spans.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn urls_point_at_the_slot_and_keep_their_credentials() {
        let addr: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        assert_eq!(
            with_address("postgres://chaos:pw@127.0.0.1:5432/chaos?sslmode=disable", addr),
            "postgres://chaos:pw@127.0.0.1:40123/chaos?sslmode=disable"
        );
        assert_eq!(with_address("postgresql://h/db", addr), "postgresql://127.0.0.1:40123/db");
        assert_eq!(upstream_of("postgres://u:p@127.0.0.1:5433/db").unwrap(), "127.0.0.1:5433".parse().unwrap());
        assert_eq!(upstream_of("postgres://u@localhost/db").unwrap(), "127.0.0.1:5432".parse().unwrap());
        let e = upstream_of("postgres://u:secret@db.example/db").unwrap_err().to_string();
        assert!(e.contains("db.example") && !e.contains("secret"), "{e}");
    }
}
