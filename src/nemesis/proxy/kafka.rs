//! Kafka's wire protocol, as far as the fault proxy reads it: the framing
//! and the request header, never a payload it would rewrite.
//!
//! Every request and every response is a big-endian `int32` size, then
//! that many bytes. A request's first bytes are its header: `api_key`
//! (`int16`), `api_version` (`int16`), `correlation_id` (`int32`). A
//! response starts with the correlation id of its request, and a broker
//! answers a connection's requests in the order they came. The proxy so
//! notes each request's API key and correlation id on the way up
//! ([`Requests`]) and knows, for each response on the way down
//! ([`Responses`]), which request it answers. A `Produce` response (API key
//! 0) is the broker's acknowledgement that it appended the batches of its
//! request: the moment `kafka.produce_ack_lost` withholds and
//! `kafka.kill_after_produce_ack` follows with a kill. An `OffsetCommit`
//! response (API key 8) is the coordinator's word that the group's
//! position moved: `kafka.kill_after_offset_commit` follows it with a
//! kill. A `Fetch` response (API key 1) is read further, by the version
//! its request asked for ([`fetch_carries_records`]): one whose record
//! sets are all empty is a long poll that found nothing, and one that
//! carries records is the start of a delivery, which
//! `kafka.kill_after_fetch` follows with a kill. A `Produce` with
//! `acks=0` gets no response at all; its entry is dropped when a later
//! response shows it was skipped.
//!
//! **Attribution.** The broker tells a client, in its metadata, where to
//! connect next: a proxy that stood only in front of the bootstrap address
//! would lose the client after its first request. So the broker has one
//! listener per proxy slot (`SLOT0` … on [`BROKER_BASE`] + i), each
//! advertised at the slot's proxy port ([`ADVERTISED_BASE`] + i): a client
//! that bootstraps through slot i is sent back to slot i for every
//! connection it opens. This needs no help from the client, which a
//! user's black-box relay would not give; the other way, reading the
//! `client.id` of each request header, would need every program to set a
//! distinct one. `scripts/services.sh` writes these listeners.

use crate::broker::Stretch;
use std::collections::VecDeque;
use std::sync::Mutex;

/// How many proxy slots the broker has listeners for.
pub const SLOTS: u16 = 20;
/// The proxy's port of slot i is this plus i: the port the broker
/// advertises on its listener `SLOT<i>`.
pub const ADVERTISED_BASE: u16 = 19100;
/// The broker's listener `SLOT<i>` listens on this plus i.
pub const BROKER_BASE: u16 = 19200;

/// The `Produce` API.
pub const PRODUCE: i16 = 0;
/// The `OffsetCommit` API: a consumer's committed position, answered by
/// the group coordinator.
pub const OFFSET_COMMIT: i16 = 8;
/// The `Fetch` API: a consumer's read of its partitions, answered by each
/// partition's leader with the records it has, or none after a long poll.
pub const FETCH: i16 = 1;

/// Larger than any frame a broker or client sends (their limits are 100
/// MiB for a request and 50 MiB for a fetch): a size beyond it means the
/// stream is not Kafka.
const MAX_FRAME: usize = 1 << 30;

/// A request's header fields, as the proxy notes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub api_key: i16,
    /// Which version of the API the response is written in: a `Fetch`
    /// response is read by it.
    pub api_version: i16,
    pub correlation: i32,
}

/// Reads the client's stream as it passes, whatever the cuts between its
/// reads, and gives the header of each request once its first 12 bytes are
/// in. The bytes themselves pass on at once.
#[derive(Debug, Default)]
pub struct Requests {
    /// The current request's first bytes, until its header is whole.
    head: Vec<u8>,
    /// The bytes of the current request after its header still to come.
    left: usize,
    /// An `OffsetCommit` being read whole (its version, correlation id and
    /// the bytes after its fixed header so far): the positions it commits
    /// are what a kill after its answer reaches.
    commit: Option<(i16, i32, Vec<u8>)>,
    /// Read `OffsetCommit`s not yet taken: correlation id and positions.
    commits: Vec<(i32, Positions)>,
}

impl Requests {
    /// Reads `bytes`, the next of the stream. `Err` with the offset of a
    /// size no Kafka client sends.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Request>, usize> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            if self.left > 0 {
                let n = self.left.min(bytes.len() - at);
                if let Some((_, _, body)) = &mut self.commit {
                    body.extend_from_slice(&bytes[at..at + n]);
                }
                self.left -= n;
                at += n;
                if self.left == 0 {
                    self.commit_read();
                }
                continue;
            }
            let n = (12 - self.head.len()).min(bytes.len() - at);
            self.head.extend_from_slice(&bytes[at..at + n]);
            at += n;
            if self.head.len() < 12 {
                break;
            }
            let h = &self.head;
            let size = i32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            if size < 8 || size as usize > MAX_FRAME {
                return Err(at - 12);
            }
            let r = Request {
                api_key: i16::from_be_bytes([h[4], h[5]]),
                api_version: i16::from_be_bytes([h[6], h[7]]),
                correlation: i32::from_be_bytes([h[8], h[9], h[10], h[11]]),
            };
            out.push(r);
            self.left = size as usize + 4 - 12;
            self.head.clear();
            if r.api_key == OFFSET_COMMIT && self.left <= COMMIT_MAX {
                self.commit = Some((r.api_version, r.correlation, Vec::with_capacity(self.left)));
                if self.left == 0 {
                    self.commit_read();
                }
            }
        }
        Ok(out)
    }

    /// The `OffsetCommit`s read whole since the last call: each one's
    /// correlation id and the positions it commits, (partition, offset).
    pub fn commits(&mut self) -> Vec<(i32, Positions)> {
        std::mem::take(&mut self.commits)
    }

    fn commit_read(&mut self) {
        if let Some((version, correlation, body)) = self.commit.take() {
            match offset_commit_positions(version, &body) {
                Some(p) => self.commits.push((correlation, p)),
                None => tracing::debug!(version, "an OffsetCommit request the proxy could not read; no reach"),
            }
        }
    }
}

/// The positions an `OffsetCommit` commits: (partition, offset) each.
pub type Positions = Vec<(i32, i64)>;

/// The group's committed offset per partition, as the last answered
/// `OffsetCommit` of any slot set it: an offset commit covers the messages
/// from there to its own offset.
#[derive(Debug, Default)]
pub struct Committed(Mutex<std::collections::HashMap<i32, i64>>);

impl Committed {
    /// Notes the offsets of an answered `OffsetCommit` (but those of the
    /// partitions it refused); returns the messages it covered: per
    /// partition, from the group's offset before it to the message before
    /// its own.
    pub fn answered(&self, positions: Positions, refused: &[i32]) -> Vec<Stretch> {
        let mut committed = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut covered = Vec::new();
        for (partition, offset) in positions.into_iter().filter(|(p, _)| !refused.contains(p)) {
            // A group's first commit covers its partition from the start:
            // a run's topic is new.
            let before = committed.insert(partition, offset).unwrap_or(0);
            if offset > before {
                covered.push(Stretch::new(partition, before, offset - 1));
            }
        }
        covered
    }
}

/// The last offset per partition that fetches delivered to one process,
/// and which incarnation of it that is.
#[derive(Debug, Default)]
pub struct FetchedBy(Mutex<(u64, std::collections::HashMap<i32, i64>)>);

impl FetchedBy {
    /// Notes what a fetch delivered to incarnation `serial`, (partition,
    /// last offset) each; a new incarnation starts with nothing fetched.
    pub fn delivered(&self, serial: u64, last: Positions) {
        let mut fetched = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if fetched.0 != serial {
            *fetched = (serial, Default::default());
        }
        for (partition, offset) in last {
            let at = fetched.1.entry(partition).or_insert(offset);
            *at = (*at).max(offset);
        }
    }

    /// The messages incarnation `serial` fetched past the group's committed
    /// offsets, per partition: killed now, the group delivers them again.
    /// A partition another member committed past since is not among them.
    pub fn uncommitted(&self, serial: Option<u64>, committed: &Committed) -> Vec<Stretch> {
        let fetched = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if serial.is_none() || Some(fetched.0) != serial {
            return vec![];
        }
        let committed = committed.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut left = Vec::new();
        for (&partition, &last) in &fetched.1 {
            let from = committed.get(&partition).copied().unwrap_or(0);
            if last >= from {
                left.push(Stretch::new(partition, from, last));
            }
        }
        left.sort_unstable();
        left
    }
}

/// The largest `OffsetCommit` request kept to be read: one topic's
/// partitions take a few dozen bytes each.
const COMMIT_MAX: usize = 64 * 1024;

/// The `OffsetCommit` versions [`offset_commit_positions`] reads: 2 to 9
/// (librdkafka, kafkajs and the Java client of Kafka 3 send these); 8 and
/// later are flexible. Version 10 names a topic by its id, and is not read.
pub const OFFSET_COMMIT_VERSIONS: std::ops::RangeInclusive<i16> = 2..=9;

/// The positions an `OffsetCommit` request commits, (partition, offset),
/// from its bytes after the fixed header (size, api key, version,
/// correlation id): the client id, then the body. None for a version not
/// in [`OFFSET_COMMIT_VERSIONS`], or bytes that are not what it says.
pub fn offset_commit_positions(version: i16, after_header: &[u8]) -> Option<Positions> {
    if !OFFSET_COMMIT_VERSIONS.contains(&version) {
        return None;
    }
    let flexible = version >= 8;
    let mut r = Reader { buf: after_header, at: 0 };
    // The client id is a plain nullable string even in a flexible header,
    // which then has tagged fields.
    r.string(false)?;
    if flexible {
        r.tags()?;
    }
    r.string(flexible)?; // group_id
    r.skip(4)?; // generation_id
    r.string(flexible)?; // member_id
    if version >= 7 {
        r.string(flexible)?; // group_instance_id
    }
    if version <= 4 {
        r.skip(8)?; // retention_time_ms
    }
    let mut out = Vec::new();
    for _ in 0..r.array(flexible)? {
        r.string(flexible)?; // the topic's name: a run's consumers read one topic
        for _ in 0..r.array(flexible)? {
            let partition = r.i32()?;
            let offset = r.i64()?;
            if version >= 6 {
                r.skip(4)?; // committed_leader_epoch
            }
            r.string(flexible)?; // committed_metadata
            if flexible {
                r.tags()?;
            }
            out.push((partition, offset));
        }
        if flexible {
            r.tags()?;
        }
    }
    if flexible {
        r.tags()?;
    }
    Some(out)
}

/// The partitions an `OffsetCommit` response refused (a nonzero error
/// code, as a fenced zombie's commit gets): their positions did not move.
/// `frame` is the response whole, from its size field; None for a version
/// not in [`OFFSET_COMMIT_VERSIONS`], or bytes that are not what it says.
pub fn offset_commit_refused(version: i16, frame: &[u8]) -> Option<Vec<i32>> {
    if !OFFSET_COMMIT_VERSIONS.contains(&version) {
        return None;
    }
    let flexible = version >= 8;
    let mut r = Reader { buf: frame, at: 8 };
    if flexible {
        r.tags()?;
    }
    if version >= 3 {
        r.skip(4)?; // throttle_time_ms
    }
    let mut refused = Vec::new();
    for _ in 0..r.array(flexible)? {
        r.string(flexible)?; // the topic's name
        for _ in 0..r.array(flexible)? {
            let partition = r.i32()?;
            if r.i16()? != 0 {
                refused.push(partition);
            }
            if flexible {
                r.tags()?;
            }
        }
        if flexible {
            r.tags()?;
        }
    }
    if flexible {
        r.tags()?;
    }
    Some(refused)
}

/// A response whose header is in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub start: usize,
    pub correlation: i32,
    /// Where it ends, when its last byte is in the buffer too.
    pub end: Option<usize>,
}

/// Reads the server's stream: the buffer given to [`Responses::scan`] holds
/// the bytes not yet passed to the client.
#[derive(Debug, Default)]
pub struct Responses {
    /// The bytes of a response begun in an earlier buffer still to come.
    left: usize,
}

/// What [`Responses::scan`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The responses whose header is in the buffer, in order.
    pub frames: Vec<Frame>,
    /// `buf[..safe]` may go to the client; the rest is a response's header
    /// cut short, held until it is whole, so that a response can be
    /// withheld from its first byte.
    pub safe: usize,
}

impl Responses {
    /// The bytes still to come of a response begun in an earlier buffer.
    pub fn continuing(&self) -> usize {
        self.left
    }

    /// Reads `buf` (the bytes held since the last pass, then the new ones);
    /// the caller passes on `buf[..safe]`, or less, and drops what it
    /// passed. `Err` with the offset of a size no broker sends.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Scan, usize> {
        let mut frames = Vec::new();
        let mut at = self.left.min(buf.len());
        self.left -= at;
        while self.left == 0 && buf.len() - at >= 8 {
            let size = i32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            if size < 4 || size as usize > MAX_FRAME {
                return Err(at);
            }
            let correlation = i32::from_be_bytes([buf[at + 4], buf[at + 5], buf[at + 6], buf[at + 7]]);
            let end = at + 4 + size as usize;
            if end <= buf.len() {
                frames.push(Frame { start: at, correlation, end: Some(end) });
                at = end;
            } else {
                frames.push(Frame { start: at, correlation, end: None });
                self.left = end - buf.len();
                at = buf.len();
            }
        }
        Ok(Scan { frames, safe: at })
    }
}

/// The requests of one connection still waiting for their response, and
/// the positions of the `OffsetCommit`s among them.
#[derive(Debug, Default)]
pub struct InFlight(Mutex<VecDeque<Request>>, Mutex<Vec<(i32, Positions)>>);

impl InFlight {
    pub fn sent(&self, r: Request) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(r);
    }

    /// The positions an `OffsetCommit` request commits, once read whole.
    pub fn commits(&self, correlation: i32, positions: Positions) {
        let mut c = self.1.lock().unwrap_or_else(|p| p.into_inner());
        // A connection's answered commits are taken; a few unanswered ones
        // at most wait here.
        if c.len() >= 64 {
            c.remove(0);
        }
        c.push((correlation, positions));
    }

    /// The positions of the `OffsetCommit` request `correlation`, taken.
    pub fn positions(&self, correlation: i32) -> Option<Positions> {
        let mut c = self.1.lock().unwrap_or_else(|p| p.into_inner());
        let i = c.iter().position(|(id, _)| *id == correlation)?;
        Some(c.remove(i).1)
    }

    /// The request a response answers. Requests before it got no response
    /// (a `Produce` with `acks=0`) and are dropped.
    pub fn answered(&self, correlation: i32) -> Option<Request> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(r) = q.pop_front() {
            if r.correlation == correlation {
                return Some(r);
            }
        }
        None
    }
}

/// The `Fetch` versions [`fetch_carries_records`] reads: 4 is the oldest a
/// client of this decade sends (librdkafka and the Java client negotiate
/// up), 18 the newest Kafka 4.1 answers (its Java client sends it; the
/// response is 17's). 12 and later are "flexible": compact lengths and
/// tagged fields; 13 and later name a topic by its id.
pub const FETCH_VERSIONS: std::ops::RangeInclusive<i16> = 4..=18;

/// Whether a `Fetch` response carries records: some partition's record set
/// is not empty. `frame` is the response from its size field, whole or its
/// first bytes; `None` when the version is not one of [`FETCH_VERSIONS`] or
/// the bytes end before an answer (for a whole frame: it is not what its
/// version says).
///
/// Only the fields before each record set are read, so an empty long poll
/// (every partition's record set empty or null) is told from a delivery
/// without decoding a record.
pub fn fetch_carries_records(version: i16, frame: &[u8]) -> Option<bool> {
    let flexible = version >= 12;
    // A record set's length is enough: the answer comes before its bytes,
    // so a frame's first bytes often decide it.
    let carries = walk_fetch(version, frame, |_, r| match r.length(flexible)? {
        0 => Some(Step::Go),
        _ => Some(Step::Stop(())),
    })?;
    Some(carries.is_some())
}

/// What [`walk_fetch`]'s visitor says after a record set.
enum Step<T> {
    Go,
    Stop(T),
}

/// Walks a `Fetch` response as its version writes it, partition by
/// partition: `at_set` gets each partition's index and the reader at its
/// record set's length, reads (or only looks at) the set, and goes on or
/// stops the walk with a value. None when the version is not one of
/// [`FETCH_VERSIONS`] or the bytes end first; Some(None) when the walk went
/// through the whole response.
fn walk_fetch<T>(
    version: i16,
    frame: &[u8],
    mut at_set: impl FnMut(i32, &mut Reader<'_>) -> Option<Step<T>>,
) -> Option<Option<T>> {
    if !FETCH_VERSIONS.contains(&version) {
        return None;
    }
    let flexible = version >= 12;
    let mut r = Reader { buf: frame, at: 8 };
    if flexible {
        // A flexible response's header has tagged fields after its id.
        r.tags()?;
    }
    r.skip(4)?; // throttle_time_ms
    if version >= 7 {
        r.skip(2 + 4)?; // error_code, session_id
    }
    for _ in 0..r.array(flexible)? {
        match version >= 13 {
            true => r.skip(16)?, // topic_id
            false => r.string(flexible)?,
        }
        for _ in 0..r.array(flexible)? {
            let partition = r.i32()?;
            // error_code, high_watermark, last_stable_offset,
            // log_start_offset (5+)
            r.skip(2 + 8 + 8 + if version >= 5 { 8 } else { 0 })?;
            for _ in 0..r.array(flexible)? {
                r.skip(8 + 8)?; // producer_id, first_offset
                if flexible {
                    r.tags()?;
                }
            }
            if version >= 11 {
                r.skip(4)?; // preferred_read_replica
            }
            if let Step::Stop(t) = at_set(partition, &mut r)? {
                return Some(Some(t));
            }
            if flexible {
                r.tags()?;
            }
        }
        if flexible {
            r.tags()?;
        }
    }
    if flexible {
        r.tags()?;
    }
    Some(None)
}

/// The last message a `Fetch` response delivers of each partition, as
/// (partition, offset): the last offset of the last whole batch of its
/// record set that is not a control batch (a broker may cut a set's last
/// batch short, and a transaction's marker is never delivered). `frame` is
/// the response whole, from its size field; None when the version is not
/// one of [`FETCH_VERSIONS`] or the bytes are not what it says.
pub fn fetch_delivered(version: i16, frame: &[u8]) -> Option<Vec<(i32, i64)>> {
    let flexible = version >= 12;
    let mut out = Vec::new();
    walk_fetch::<()>(version, frame, |partition, r| {
        let n = r.length(flexible)?;
        if let Some(last) = last_delivered(r.take(n)?) {
            out.push((partition, last));
        }
        Some(Step::Go)
    })?;
    Some(out)
}

/// The last offset of a record set's last whole data batch; None when it
/// holds none. A batch is its base offset, its length, then (magic 2)
/// partition_leader_epoch, magic, crc, attributes and last_offset_delta;
/// an older message set's entry is its own offset.
fn last_delivered(records: &[u8]) -> Option<i64> {
    let mut r = Reader { buf: records, at: 0 };
    let mut last = None;
    while let (Some(base), Some(length)) = (r.i64(), r.i32()) {
        let Some(batch) = usize::try_from(length).ok().and_then(|n| r.take(n)) else { break };
        match batch.get(4) {
            Some(2) if batch.len() >= 15 => {
                let attributes = i16::from_be_bytes([batch[9], batch[10]]);
                // A control batch: a commit or abort marker.
                if attributes & 0x20 == 0 {
                    last = Some(base + i64::from(i32::from_be_bytes([batch[11], batch[12], batch[13], batch[14]])));
                }
            }
            Some(_) => last = Some(base),
            None => break,
        }
    }
    last
}

/// A `Fetch` response read across the proxy's reads. Its first bytes are
/// kept until they say whether it carries records: a record set's length
/// comes before its bytes, so that keeps headers, not records. Kept
/// `whole`, all its bytes are, up to [`FETCH_WHOLE_MAX`], to read what it
/// delivered once it ends ([`Fetched::delivered`]).
#[derive(Debug)]
pub struct Fetched {
    version: i16,
    bytes: Vec<u8>,
    whole: bool,
    /// More bytes came than were kept.
    over: bool,
    decided: Option<bool>,
}

/// Kept of one response at most to decide it: far more than the headers
/// before the first record set of any fetch a consumer of one topic gets.
const FETCH_HEAD_MAX: usize = 1 << 20;

/// Kept of one response at most to read what it delivered: a fetch of a
/// run's topic is a few MiB at most (librdkafka's and the Java client's
/// default is 1 MiB a partition). A larger one reaches nothing.
const FETCH_WHOLE_MAX: usize = 16 << 20;

impl Fetched {
    pub fn new(version: i16, whole: bool) -> Self {
        Self { version, bytes: Vec::new(), whole, over: false, decided: None }
    }

    /// Reads the response's next bytes: `Some` once the bytes so far
    /// decide whether it carries records.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<bool> {
        if self.decided.is_some() && !self.whole {
            return self.decided;
        }
        let cap = if self.whole { FETCH_WHOLE_MAX } else { FETCH_HEAD_MAX };
        let room = cap.saturating_sub(self.bytes.len());
        self.over |= bytes.len() > room;
        self.bytes.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if self.decided.is_none() {
            self.decided = fetch_carries_records(self.version, &self.bytes);
        }
        self.decided
    }

    pub fn version(&self) -> i16 {
        self.version
    }

    pub fn head_hex(&self) -> String {
        self.bytes.iter().take(160).map(|b| format!("{b:02x}")).collect()
    }

    /// Whether its bytes so far said whether it carries records.
    pub fn decided(&self) -> bool {
        self.decided.is_some()
    }

    /// Whether its next bytes are still wanted: to decide it, or kept whole.
    pub fn wants_more(&self) -> bool {
        self.whole || self.decided.is_none()
    }

    /// What it delivered, read once its last byte was fed: None unless
    /// kept whole, and within [`FETCH_WHOLE_MAX`].
    pub fn delivered(&self) -> Option<Vec<(i32, i64)>> {
        (self.whole && !self.over).then(|| fetch_delivered(self.version, &self.bytes)).flatten()
    }
}

/// Kafka's primitive types, read from a frame's bytes; `None` past their end.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.buf.len())?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Some(out)
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Option<i64> {
        self.take(8).map(|b| i64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// A length: compact ones are stored plus one, 0 meaning null; a
    /// null (or empty) one is 0 here.
    fn length(&mut self, compact: bool) -> Option<usize> {
        match compact {
            true => self.uvarint().map(|n| n.saturating_sub(1) as usize),
            false => self.i32().map(|n| n.max(0) as usize),
        }
    }

    /// An array's element count.
    fn array(&mut self, compact: bool) -> Option<usize> {
        let n = self.length(compact)?;
        // Each element takes a byte at least: a count beyond the frame is
        // not Kafka, and would spin the caller's loop.
        (n <= self.buf.len() - self.at).then_some(n)
    }

    fn string(&mut self, compact: bool) -> Option<()> {
        let n = match compact {
            true => self.length(true)?,
            false => self.i16()?.max(0) as usize,
        };
        self.skip(n)
    }

    /// A tagged-field section: a count, then tag, size and bytes each.
    fn tags(&mut self) -> Option<()> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let n = self.uvarint()? as usize;
            self.skip(n)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(api_key: i16, correlation: i32, body: usize) -> Vec<u8> {
        let mut v = ((8 + body) as i32).to_be_bytes().to_vec();
        v.extend(api_key.to_be_bytes());
        v.extend(9i16.to_be_bytes());
        v.extend(correlation.to_be_bytes());
        v.extend(std::iter::repeat_n(0xAB, body));
        v
    }

    fn response(correlation: i32, body: usize) -> Vec<u8> {
        let mut v = ((4 + body) as i32).to_be_bytes().to_vec();
        v.extend(correlation.to_be_bytes());
        v.extend(std::iter::repeat_n(0xCD, body));
        v
    }

    #[test]
    fn requests_are_found_whatever_the_cuts() {
        let stream: Vec<u8> = [request(18, 1, 0), request(0, 2, 300), request(3, 3, 5)].concat();
        let want = vec![
            Request { api_key: 18, api_version: 9, correlation: 1 },
            Request { api_key: 0, api_version: 9, correlation: 2 },
            Request { api_key: 3, api_version: 9, correlation: 3 },
        ];
        for cut in 1..stream.len() {
            let mut r = Requests::default();
            let mut got = r.feed(&stream[..cut]).unwrap();
            got.extend(r.feed(&stream[cut..]).unwrap());
            assert_eq!(got, want, "cut at {cut}");
        }
        let mut r = Requests::default();
        let bytewise: Vec<Request> = stream.chunks(1).flat_map(|b| r.feed(b).unwrap()).collect();
        assert_eq!(bytewise, want);
        assert_eq!(
            Requests::default().feed(&[0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(0),
            "a size too small for a header"
        );
    }

    #[test]
    fn responses_are_held_only_while_their_header_is_cut() {
        let stream: Vec<u8> = [response(1, 10), response(2, 0), response(3, 40)].concat();
        for cut in 1..stream.len() {
            let (mut r, mut held, mut passed, mut seen) = (Responses::default(), Vec::new(), 0, Vec::new());
            for piece in [&stream[..cut], &stream[cut..]] {
                held.extend_from_slice(piece);
                let s = r.scan(&held).unwrap();
                seen.extend(s.frames.iter().map(|f| (passed + f.start, f.correlation)));
                passed += s.safe;
                held.drain(..s.safe);
            }
            assert_eq!(seen, vec![(0, 1), (18, 2), (26, 3)], "cut at {cut}");
            assert_eq!((passed, held.len()), (stream.len(), 0), "cut at {cut}");
        }
        let s = Responses::default().scan(&stream[..response(1, 10).len() + 5]).unwrap();
        assert_eq!(s.safe, response(1, 10).len(), "the second header is cut: held from its first byte");
        assert_eq!(Responses::default().scan(&[0, 0, 0, 1, 0, 0, 0, 0]), Err(0));
    }

    #[test]
    fn a_response_answers_the_oldest_request_with_its_id() {
        let f = InFlight::default();
        f.sent(Request { api_key: 0, api_version: 9, correlation: 7 });
        f.sent(Request { api_key: 0, api_version: 9, correlation: 8 });
        f.sent(Request { api_key: 1, api_version: 13, correlation: 9 });
        // 7 was an acks=0 produce: no response; 8's response comes first.
        assert_eq!(f.answered(8).map(|r| r.api_key), Some(0));
        assert_eq!(f.answered(9), Some(Request { api_key: 1, api_version: 13, correlation: 9 }));
        assert_eq!(f.answered(10), None);
    }

    /// A partition of a built `Fetch` response: its aborted transactions
    /// and its record set (`None`: null).
    struct Part {
        aborted: usize,
        records: Option<usize>,
        /// Record batches to send instead of `records` filler bytes.
        set: Option<Vec<u8>>,
    }

    fn uvarint(v: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            v.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        v.push(n as u8);
    }

    /// A length as `version` writes it; a flexible one is stored plus one.
    fn len(v: &mut Vec<u8>, flexible: bool, n: Option<usize>) {
        match (flexible, n) {
            (true, n) => uvarint(v, n.map_or(0, |n| n as u64 + 1)),
            (false, n) => v.extend(n.map_or(-1, |n| n as i32).to_be_bytes()),
        }
    }

    /// A tagged-field section with one field of `n` bytes, so that the
    /// reader must skip it, not just a zero count.
    fn tags(v: &mut Vec<u8>, n: usize) {
        uvarint(v, 1);
        uvarint(v, 0);
        uvarint(v, n as u64);
        v.extend(std::iter::repeat_n(0xEE, n));
    }

    /// A whole `Fetch` response of `version`, written from the message's
    /// schema: one entry of `topics` per topic, with its partitions.
    fn fetch(version: i16, topics: &[Vec<Part>]) -> Vec<u8> {
        let flexible = version >= 12;
        let mut v = 42i32.to_be_bytes().to_vec();
        if flexible {
            tags(&mut v, 3);
        }
        v.extend(0i32.to_be_bytes());
        if version >= 7 {
            v.extend(0i16.to_be_bytes());
            v.extend(77i32.to_be_bytes());
        }
        len(&mut v, flexible, Some(topics.len()));
        for parts in topics {
            if version >= 13 {
                v.extend([0xAA; 16]);
            } else {
                let name = b"chaos-payments";
                match flexible {
                    true => uvarint(&mut v, name.len() as u64 + 1),
                    false => v.extend((name.len() as i16).to_be_bytes()),
                }
                v.extend(name);
            }
            len(&mut v, flexible, Some(parts.len()));
            for (i, p) in parts.iter().enumerate() {
                v.extend((i as i32).to_be_bytes());
                v.extend(0i16.to_be_bytes());
                v.extend([0x11; 16]);
                if version >= 5 {
                    v.extend([0x22; 8]);
                }
                len(&mut v, flexible, (p.aborted > 0).then_some(p.aborted));
                for _ in 0..p.aborted {
                    v.extend([0x33; 16]);
                    if flexible {
                        tags(&mut v, 2);
                    }
                }
                if version >= 11 {
                    v.extend((-1i32).to_be_bytes());
                }
                match &p.set {
                    Some(set) => {
                        len(&mut v, flexible, Some(set.len()));
                        v.extend(set);
                    }
                    None => {
                        len(&mut v, flexible, p.records);
                        v.extend(std::iter::repeat_n(0x44, p.records.unwrap_or(0)));
                    }
                }
                if flexible {
                    tags(&mut v, 5);
                }
            }
            if flexible {
                tags(&mut v, 0);
            }
        }
        if flexible {
            tags(&mut v, 7);
        }
        let mut frame = (v.len() as i32).to_be_bytes().to_vec();
        frame.extend(v);
        frame
    }

    #[test]
    fn a_fetch_carries_records_only_when_a_record_set_is_not_empty() {
        let empty = |aborted| Part { aborted, records: Some(0), set: None };
        let null = || Part { aborted: 0, records: None, set: None };
        let full = |aborted, n| Part { aborted, records: Some(n), set: None };
        for version in FETCH_VERSIONS {
            let says = |topics: &[Vec<Part>]| fetch_carries_records(version, &fetch(version, topics));
            assert_eq!(says(&[]), Some(false), "v{version}: no topics");
            assert_eq!(says(&[vec![empty(0), null()]]), Some(false), "v{version}: an empty long poll");
            assert_eq!(says(&[vec![empty(2)], vec![null(), empty(1)]]), Some(false), "v{version}: aborted, no records");
            assert_eq!(says(&[vec![empty(1), null(), full(0, 300)]]), Some(true), "v{version}: the third partition");
            assert_eq!(says(&[vec![null()], vec![empty(0), full(2, 61)]]), Some(true), "v{version}: the second topic");
            // A frame cut short of its answer is not what its version says.
            let whole = fetch(version, &[vec![empty(1), full(0, 10)]]);
            assert_eq!(fetch_carries_records(version, &whole[..30]), None, "v{version}: cut in its first topic");
        }
        assert_eq!(fetch_carries_records(3, &fetch(4, &[vec![full(0, 9)]])), None, "a version it does not read");
        assert_eq!(fetch_carries_records(19, &fetch(17, &[vec![full(0, 9)]])), None, "a version it does not read");
        // The first 160 bytes of a Fetch v18 response as Kafka 4.1.1 sent
        // it to Spring Kafka's consumer (kafka-clients 4.1): one topic by
        // id, partition 2, one record batch. Before v18 was read, a Java
        // consumer met no fetch window at all.
        let recorded = "000002ae0000000b000000000000004be5db3302a8411da47d694af09f05e0ea45e3b09d02000000020000000000000000\
                        00020000000000000002000000000000000000ffffffffe60400000000000000000000025900000000027e028f3f000000\
                        000001000001a25322ca7d000001a25322ca7e00000000000015cc00000000000000000002a4040000004863656161303664\
                        632d616666642d343966632d";
        let bytes: Vec<u8> =
            (0..recorded.len()).step_by(2).map(|i| u8::from_str_radix(&recorded[i..i + 2], 16).unwrap()).collect();
        assert_eq!(fetch_carries_records(18, &bytes), Some(true), "Kafka 4.1's v18 response, recorded");
        // Read across the proxy's reads, whatever the cuts: decided once the
        // first non-empty record set's length is in, never `true` for an
        // empty poll.
        for version in [4, 11, 12, 16] {
            let with = fetch(version, &[vec![empty(1), full(0, 500)]]);
            let without = fetch(version, &[vec![empty(1), null()]]);
            for cut in 1..without.len() {
                let mut f = Fetched::new(version, false);
                assert!(f.feed(&with[..cut.min(with.len())]).unwrap_or(true), "v{version} cut {cut}");
                assert_eq!(f.feed(&with[cut.min(with.len())..]), Some(true), "v{version} cut {cut}");
                let mut f = Fetched::new(version, false);
                assert_ne!(f.feed(&without[..cut]), Some(true), "v{version} cut {cut}: an empty poll");
                assert_eq!(f.feed(&without[cut..]), Some(false), "v{version} cut {cut}");
            }
        }
        // A count that runs past the frame is not Kafka: None, at once, not
        // a million turns of the loop.
        let mut huge = fetch(4, &[]);
        huge.truncate(huge.len() - 4);
        huge.extend(1_000_000i32.to_be_bytes());
        assert_eq!(fetch_carries_records(4, &huge), None);
    }

    /// Record batches of magic 2, (base offset, last offset delta,
    /// control) each, 20 bytes of records after each header.
    fn batches(spec: &[(i64, i32, bool)]) -> Vec<u8> {
        let mut v = Vec::new();
        for &(base, delta, control) in spec {
            v.extend(base.to_be_bytes());
            let body: i32 = 4 + 1 + 4 + 2 + 4 + 20;
            v.extend(body.to_be_bytes());
            v.extend(0i32.to_be_bytes()); // partition_leader_epoch
            v.push(2); // magic
            v.extend([0x55; 4]); // crc
            v.extend((if control { 0x20i16 } else { 0 }).to_be_bytes());
            v.extend(delta.to_be_bytes());
            v.extend([0x66; 20]);
        }
        v
    }

    #[test]
    fn a_fetch_delivers_the_last_offset_of_its_last_whole_data_batch() {
        let set = |spec: &[(i64, i32, bool)]| Part { aborted: 0, records: None, set: Some(batches(spec)) };
        let cut = |spec: &[(i64, i32, bool)], less: usize| {
            let mut b = batches(spec);
            b.truncate(b.len() - less);
            Part { aborted: 0, records: None, set: Some(b) }
        };
        let null = || Part { aborted: 0, records: None, set: None };
        for version in FETCH_VERSIONS {
            let says = |topics: &[Vec<Part>]| fetch_delivered(version, &fetch(version, topics));
            assert_eq!(says(&[vec![null(), null()]]), Some(vec![]), "v{version}: an empty long poll");
            assert_eq!(
                says(&[vec![set(&[(0, 9, false), (10, 4, false)]), null(), set(&[(40, 0, false)])]]),
                Some(vec![(0, 14), (2, 40)]),
                "v{version}: two partitions with records"
            );
            // A last batch cut short is not delivered; a control batch never is.
            assert_eq!(
                says(&[vec![cut(&[(5, 2, false), (8, 3, false)], 7)]]),
                Some(vec![(0, 7)]),
                "v{version}: the last batch cut short"
            );
            assert_eq!(says(&[vec![set(&[(5, 2, false), (8, 0, true)])]]), Some(vec![(0, 7)]), "v{version}: a marker");
            assert_eq!(says(&[vec![cut(&[(5, 2, false)], 1)]]), Some(vec![]), "v{version}: no whole batch");
            let whole = fetch(version, &[vec![set(&[(0, 3, false)])]]);
            assert_eq!(fetch_delivered(version, &whole[..whole.len() - 30]), None, "v{version}: the frame cut short");
            if version >= 12 {
                assert_eq!(fetch_delivered(version, &whole[..whole.len() - 3]), None, "v{version}: its last tags cut");
            }
            // Kept whole across the proxy's reads, whatever the cuts.
            for at in [1, 9, 20, whole.len() - 1] {
                let mut f = Fetched::new(version, true);
                f.feed(&whole[..at]);
                assert!(f.wants_more(), "v{version} cut {at}: kept whole");
                assert_eq!(f.feed(&whole[at..]), Some(true), "v{version} cut {at}");
                assert_eq!(f.delivered(), Some(vec![(0, 3)]), "v{version} cut {at}");
            }
            // Not kept whole, it reads no delivery, and wants nothing once decided.
            let mut f = Fetched::new(version, false);
            assert_eq!(f.feed(&whole), Some(true));
            assert!(!f.wants_more());
            assert_eq!(f.delivered(), None);
        }
    }

    /// An `OffsetCommit` response at `version`: one topic, these
    /// (partition, error code) answers.
    fn offset_commit_answer(version: i16, answers: &[(i32, i16)]) -> Vec<u8> {
        let flexible = version >= 8;
        let mut v = 7i32.to_be_bytes().to_vec();
        if flexible {
            tags(&mut v, 2);
        }
        if version >= 3 {
            v.extend(0i32.to_be_bytes());
        }
        len(&mut v, flexible, Some(1));
        let name = b"chaos.orders";
        match flexible {
            true => uvarint(&mut v, name.len() as u64 + 1),
            false => v.extend((name.len() as i16).to_be_bytes()),
        }
        v.extend(name);
        len(&mut v, flexible, Some(answers.len()));
        for &(partition, error) in answers {
            v.extend(partition.to_be_bytes());
            v.extend(error.to_be_bytes());
            if flexible {
                tags(&mut v, 1);
            }
        }
        if flexible {
            tags(&mut v, 0);
            tags(&mut v, 4);
        }
        let mut frame = (v.len() as i32).to_be_bytes().to_vec();
        frame.extend(v);
        frame
    }

    #[test]
    fn an_offset_commits_refused_partitions_are_read_at_every_version() {
        for version in OFFSET_COMMIT_VERSIONS {
            let answer = offset_commit_answer(version, &[(0, 0), (1, 22), (2, 0), (3, 25)]);
            // 22 (ILLEGAL_GENERATION) and 25 (UNKNOWN_MEMBER_ID): a zombie's commit.
            assert_eq!(offset_commit_refused(version, &answer), Some(vec![1, 3]), "v{version}");
            assert_eq!(offset_commit_refused(version, &offset_commit_answer(version, &[(0, 0)])), Some(vec![]));
            assert_eq!(offset_commit_refused(version, &answer[..answer.len() - 5]), None, "v{version}: cut short");
        }
        assert_eq!(offset_commit_refused(10, &offset_commit_answer(9, &[(0, 0)])), None, "a version it does not read");
    }

    /// An `OffsetCommit` request as a client writes it, at `version`:
    /// group "g", one topic, these (partition, offset) positions.
    fn offset_commit(version: i16, correlation: i32, positions: &[(i32, i64)]) -> Vec<u8> {
        let flexible = version >= 8;
        let string = |v: &mut Vec<u8>, text: &str| match flexible {
            true => {
                v.push(text.len() as u8 + 1);
                v.extend(text.as_bytes());
            }
            false => {
                v.extend((text.len() as i16).to_be_bytes());
                v.extend(text.as_bytes());
            }
        };
        let count = |v: &mut Vec<u8>, n: usize| match flexible {
            true => v.push(n as u8 + 1),
            false => v.extend((n as i32).to_be_bytes()),
        };
        let mut b = Vec::new();
        b.extend(8i16.to_be_bytes());
        b.extend(version.to_be_bytes());
        b.extend(correlation.to_be_bytes());
        b.extend(6i16.to_be_bytes());
        b.extend(b"rdkafk");
        if flexible {
            b.push(0); // the header's tagged fields
        }
        string(&mut b, "g");
        b.extend(7i32.to_be_bytes()); // generation_id
        string(&mut b, "member-1");
        if version >= 7 {
            string(&mut b, "notifier-1");
        }
        if version <= 4 {
            b.extend((-1i64).to_be_bytes());
        }
        count(&mut b, 1);
        string(&mut b, "chaos.run.orders");
        count(&mut b, positions.len());
        for (p, o) in positions {
            b.extend(p.to_be_bytes());
            b.extend(o.to_be_bytes());
            if version >= 6 {
                b.extend(3i32.to_be_bytes());
            }
            string(&mut b, "");
            if flexible {
                b.push(0);
            }
        }
        if flexible {
            b.push(0);
            b.push(0);
        }
        let mut v = (b.len() as i32).to_be_bytes().to_vec();
        v.extend(b);
        v
    }

    /// A kill right after an offset commit reaches the messages it covered:
    /// so the proxy reads the positions of every `OffsetCommit` it passes,
    /// at every version clients send, whatever the cuts in the stream.
    #[test]
    fn an_offset_commits_positions_are_read_at_every_version_and_cut() {
        let positions = [(0, 42), (2, 7)];
        for version in OFFSET_COMMIT_VERSIONS {
            let frame = offset_commit(version, 5, &positions);
            assert_eq!(offset_commit_positions(version, &frame[12..]), Some(positions.to_vec()), "v{version}");
            assert_eq!(offset_commit_positions(version, &frame[12..frame.len() - 3]), None, "v{version}: cut short");
            let stream = [request(3, 4, 10), frame, request(1, 6, 30)].concat();
            for cut in 1..stream.len() {
                let mut r = Requests::default();
                let mut seen = r.feed(&stream[..cut]).unwrap();
                seen.extend(r.feed(&stream[cut..]).unwrap());
                assert_eq!(seen.iter().map(|q| q.correlation).collect::<Vec<_>>(), [4, 5, 6], "v{version} cut {cut}");
                assert_eq!(r.commits(), vec![(5, positions.to_vec())], "v{version} cut {cut}");
            }
        }
        // A version it does not read gives no positions, and no error.
        assert_eq!(offset_commit_positions(10, &offset_commit(9, 1, &positions)[12..]), None);
        let mut r = Requests::default();
        r.feed(&offset_commit(1, 1, &positions)).unwrap();
        assert!(r.commits().is_empty());
    }
}
