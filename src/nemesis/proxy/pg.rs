//! The PostgreSQL wire protocol, as far as the fault proxy reads it: the
//! framing only, never a payload it would rewrite.
//!
//! After the startup message every backend message is a type byte and a
//! big-endian length that counts itself. The proxy cuts the server's stream
//! into whole messages and reads two kinds: `CommandComplete` (`C`, its
//! tag) and `ReadyForQuery` (`Z`, the session's transaction status). The
//! server sends them only once a commit is durable (a failed COMMIT's tag
//! is `ROLLBACK`), so they are the moment a commit is acknowledged,
//! whatever the client library, whether it sent `COMMIT` as a simple query
//! or through the extended protocol, or wrote in autocommit with no
//! `COMMIT` at all ([`Acks`]).
//!
//! The client's stream is passed through as bytes, read only with
//! `db.hold_commit` set: then its short simple queries are cut out whole,
//! so that a `BEGIN` is noted and a `COMMIT` can be held from its first
//! byte ([`Queries`]). One exception comes before startup: a request to negotiate TLS (`SSLRequest`) or GSSAPI
//! encryption is answered `N` by the proxy itself, so that the session
//! stays readable. A client that insists on TLS (`sslmode=require`) then
//! fails to connect, with its own clear message.

/// `SSLRequest`'s and `GSSENCRequest`'s codes: a length of 8, then one of these.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// What the first 8 bytes a client sends are.
#[derive(Debug, PartialEq, Eq)]
pub enum Opening {
    /// A request to encrypt: answer `N` and read the next 8 bytes.
    Encryption,
    /// The startup message (or a cancel request): pass it on, then bytes.
    Startup,
}

pub fn opening(first8: &[u8; 8]) -> Opening {
    let len = u32::from_be_bytes([first8[0], first8[1], first8[2], first8[3]]);
    let code = u32::from_be_bytes([first8[4], first8[5], first8[6], first8[7]]);
    match (len, code) {
        (8, SSL_REQUEST | GSSENC_REQUEST) => Opening::Encryption,
        _ => Opening::Startup,
    }
}

/// A message's type byte and its extent in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Message {
    kind: u8,
    start: usize,
    end: usize,
}

/// The whole messages of `buf[from..]`, in order; bytes after the last
/// one are an incomplete message that waits for more. A length below 4 is
/// not PostgreSQL: `Err` with its offset.
fn messages(buf: &[u8], from: usize) -> Result<Vec<Message>, usize> {
    let mut out = Vec::new();
    let mut at = from;
    while buf.len() - at >= 5 {
        let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
        if len < 4 {
            return Err(at);
        }
        let end = at + 1 + len;
        if end > buf.len() {
            break;
        }
        out.push(Message { kind: buf[at], start: at, end });
        at = end;
    }
    Ok(out)
}

/// The tags of statements that write: outside a transaction block each
/// commits on its own (autocommit), with no COMMIT on the wire.
const WRITE_TAGS: [&[u8]; 5] = [b"INSERT ", b"UPDATE ", b"DELETE ", b"MERGE ", b"COPY "];

/// The tags of a statement that read or wrote rows: a block's first such
/// statement is where a consumer reads or claims its inbox.
const ROW_TAGS: [&[u8]; 6] = [b"SELECT ", b"INSERT ", b"UPDATE ", b"DELETE ", b"MERGE ", b"FETCH "];

/// Finds the moments the server acknowledges a commit, from its messages
/// alone. A commit is acknowledged by the `ReadyForQuery` that reports the
/// session idle (`I`) after a `CommandComplete` of `COMMIT`, or of a write
/// that ran outside a transaction block (autocommit). The acknowledgement
/// spans from that `CommandComplete` to the end of the `ReadyForQuery`:
/// withholding it leaves a durable commit its client never hears of.
/// Writes inside a block (`ReadyForQuery` `T`) are not commits; a
/// `ROLLBACK` clears what was pending.
///
/// Each commit says whether its transaction changed rows: a write's tag
/// (`INSERT 0 3`, `UPDATE 1`) with a count above 0 since the block began.
/// An empty or read-only commit (a poll that found nothing, then COMMIT)
/// is one no aimed kill strikes: it holds no work to lose.
#[derive(Debug, Default)]
pub struct Acks {
    /// Where the `CommandComplete` of a commit not yet followed by its
    /// `ReadyForQuery` starts.
    pending: Option<usize>,
    /// Rows changed since the session was last idle.
    wrote: bool,
    /// How far `buf` has been read into whole messages.
    parsed: usize,
    /// Inside a block a `BEGIN` opened: how many of its statements read or
    /// wrote rows so far.
    block: Option<u32>,
}

/// One commit's acknowledgement: its first byte, its end, and whether its
/// transaction changed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub start: usize,
    pub end: usize,
    pub wrote: bool,
}

/// What [`Acks::scan`] found in the buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Each commit acknowledgement.
    pub acks: Vec<Ack>,
    /// The bytes `buf[..safe]` may go to the client now; the rest waits
    /// (an incomplete message, or a commit's `CommandComplete` whose
    /// `ReadyForQuery` has not come).
    pub safe: usize,
    /// The `CommandComplete` of each block's first statement that read or
    /// wrote rows (`SELECT 0`, `INSERT 0 3`, ...): its first byte. A
    /// `BEGIN`'s own, a `CREATE TABLE`'s or a `SET`'s is not one.
    pub firsts: Vec<usize>,
}

impl Acks {
    /// Reads the whole messages `buf` gained since the last scan.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Scan, usize> {
        let mut acks = Vec::new();
        let mut firsts = Vec::new();
        for m in messages(buf, self.parsed)? {
            let body = &buf[m.start + 5..m.end];
            if m.kind == b'C' && self.first_in_block(body) {
                firsts.push(m.start);
            }
            match m.kind {
                b'C' if body == b"COMMIT\0" => {
                    self.pending.get_or_insert(m.start);
                }
                b'C' if WRITE_TAGS.iter().any(|t| body.starts_with(t)) => {
                    self.wrote |= rows(body) > 0;
                    self.pending.get_or_insert(m.start);
                }
                b'C' if body == b"ROLLBACK\0" => {
                    self.pending = None;
                    self.wrote = false;
                }
                b'Z' => {
                    // Idle: committed. In a block (`T`) or failed (`E`):
                    // nothing committed yet.
                    let idle = body.first() == Some(&b'I');
                    if let (Some(start), true) = (self.pending.take(), idle) {
                        acks.push(Ack { start, end: m.end, wrote: self.wrote });
                    }
                    if idle {
                        self.wrote = false;
                        self.block = None;
                    }
                }
                _ => {}
            }
            self.parsed = m.end;
        }
        Ok(Scan { acks, safe: self.pending.unwrap_or(self.parsed), firsts })
    }

    /// Notes a `CommandComplete`: whether it is its block's first that
    /// read or wrote rows.
    fn first_in_block(&mut self, tag: &[u8]) -> bool {
        // `START TRANSACTION` (node-postgres libraries with an isolation
        // level send it) is answered with its own tag, not `BEGIN`.
        if tag.starts_with(b"BEGIN") || tag.starts_with(b"START TRANSACTION") {
            self.block = Some(0);
            return false;
        }
        let Some(n) = self.block.as_mut().filter(|_| ROW_TAGS.iter().any(|t| tag.starts_with(t))) else {
            return false;
        };
        *n += 1;
        *n == 1
    }

    /// Whether the transaction open now has changed rows so far: what a
    /// `COMMIT` the client sends next would commit. (A client that sends
    /// its `COMMIT` before the answers to its writes, pipelining, is seen
    /// as not having written yet.)
    pub fn writing(&self) -> bool {
        self.wrote
    }

    /// The first `n` bytes left the buffer.
    pub fn consumed(&mut self, n: usize) {
        self.parsed -= n;
        if let Some(p) = &mut self.pending {
            *p -= n;
        }
    }
}

/// The row count a write's tag ends with (`INSERT 0 3` → 3, `UPDATE 0` → 0).
fn rows(tag: &[u8]) -> u64 {
    let text = std::str::from_utf8(tag).unwrap_or_default().trim_end_matches('\0');
    text.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// A simple query that opens or ends a transaction block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Begin,
    Commit,
}

/// The longest simple query held until it is whole: `COMMIT` and `BEGIN`
/// with their options fit many times over; longer queries pass as bytes.
const SHORT_QUERY: usize = 64;

/// Larger than any message a client sends (the server's limit is 1 GiB).
const MAX_MESSAGE: usize = 1 << 30;

/// Reads the client's stream after startup, whatever the cuts between its
/// reads: the caller passes on `buf[..safe]` of each [`Queries::scan`]
/// and drops it, and may hold a `COMMIT` from its first byte.
#[derive(Debug, Default)]
pub struct Queries {
    /// The bytes of a long message begun in an earlier buffer still to come.
    left: usize,
    /// Named prepared statements that open or end a block: pgjdbc, after
    /// its fifth `COMMIT` on a connection, prepares it as `S_n` once and
    /// from then on only binds and executes it.
    named: Vec<(Vec<u8>, Block)>,
}

/// What [`Queries::scan`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QueryScan {
    /// Each `BEGIN` or `COMMIT` in the buffer, whole: its first byte.
    pub blocks: Vec<(usize, Block)>,
    /// `buf[..safe]` may go to the server; the rest is a message's header,
    /// or a short simple query, cut short.
    pub safe: usize,
}

impl Queries {
    /// A reader whose stream starts with `startup_left` bytes of the
    /// startup message, which has no type byte.
    pub fn after(startup_left: usize) -> Self {
        Self { left: startup_left, named: Vec::new() }
    }

    /// `Err` with the offset of a length no client sends.
    pub fn scan(&mut self, buf: &[u8]) -> Result<QueryScan, usize> {
        let mut at = self.left.min(buf.len());
        self.left -= at;
        let mut blocks = Vec::new();
        while self.left == 0 && buf.len() - at >= 5 {
            let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
            if !(4..=MAX_MESSAGE).contains(&len) {
                return Err(at);
            }
            let end = at + 1 + len;
            if matches!(buf[at], b'Q' | b'P' | b'B' | b'C') && len <= SHORT_QUERY {
                if end > buf.len() {
                    break;
                }
                if let Some(b) = self.short(buf[at], &buf[at + 5..end]) {
                    blocks.push((at, b));
                }
                at = end;
            } else if end <= buf.len() {
                at = end;
            } else {
                self.left = end - buf.len();
                at = buf.len();
            }
        }
        Ok(QueryScan { blocks, safe: at })
    }
}

impl Queries {
    /// A short message of the client's: the block it opens or ends, if
    /// any. A simple query (`Q`) by its text. In the extended protocol (as
    /// pgjdbc sends its `BEGIN` and `COMMIT`): an unnamed statement's
    /// `Parse` (`P`) by its text; a named one's is noted, and each `Bind`
    /// (`B`) of it is the block; a `Close` (`C`) of it forgets it.
    fn short(&mut self, kind: u8, body: &[u8]) -> Option<Block> {
        let (first, rest) = cstr(body)?;
        match kind {
            b'Q' => block(first),
            b'P' => {
                let b = block(cstr(rest)?.0)?;
                if first.is_empty() {
                    return Some(b);
                }
                self.named.retain(|(n, _)| n != first);
                self.named.push((first.to_vec(), b));
                None
            }
            // A Bind names its portal, then its statement.
            b'B' => {
                let statement = cstr(rest)?.0;
                self.named.iter().find(|(n, _)| !statement.is_empty() && n == statement).map(|(_, b)| *b)
            }
            _ => {
                if let [b'S', name @ ..] = body {
                    let name = cstr(name)?.0;
                    self.named.retain(|(n, _)| n != name);
                }
                None
            }
        }
    }
}

/// A NUL-terminated string at the start of `bytes`, and what follows it.
fn cstr(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.iter().position(|b| *b == 0)?;
    Some((&bytes[..end], &bytes[end + 1..]))
}

/// Whether a query's text (NUL-terminated or not) opens or ends a block.
fn block(text: &[u8]) -> Option<Block> {
    let text = std::str::from_utf8(text).ok()?.trim_end_matches('\0').trim().trim_end_matches(';').trim();
    let words: Vec<String> = text.split_whitespace().map(|w| w.to_ascii_uppercase()).collect();
    match words.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["BEGIN", ..] | ["START", "TRANSACTION", ..] => Some(Block::Begin),
        ["COMMIT"] | ["END"] | ["COMMIT" | "END", "WORK" | "TRANSACTION"] => Some(Block::Commit),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn query(text: &str) -> Vec<u8> {
        msg(b'Q', format!("{text}\0").as_bytes())
    }

    #[test]
    fn a_commit_and_a_begin_are_found_whole_whatever_the_cuts() {
        let long = format!("INSERT INTO t SELECT {}", "1,".repeat(100));
        let parse = msg(b'P', b"\0COMMIT\0\0\0");
        let stream: Vec<u8> =
            [query("BEGIN"), query(&long), parse.clone(), query(" commit; "), query("SELECT 1")].concat();
        // pgjdbc's COMMIT: parsed unnamed, with no parameter types.
        let parse_at = query("BEGIN").len() + query(&long).len();
        let commit_at = parse_at + parse.len();
        for cut in 1..stream.len() {
            let (mut q, mut held, mut passed, mut seen) = (Queries::default(), Vec::new(), 0, Vec::new());
            for piece in [&stream[..cut], &stream[cut..]] {
                held.extend_from_slice(piece);
                let s = q.scan(&held).unwrap();
                for (at, b) in &s.blocks {
                    // A block is whole in the buffer when it is found.
                    assert!(at + query("BEGIN").len().min(query(" commit; ").len()) <= held.len());
                    seen.push((passed + at, *b));
                }
                passed += s.safe;
                held.drain(..s.safe);
            }
            let want = vec![(0, Block::Begin), (parse_at, Block::Commit), (commit_at, Block::Commit)];
            assert_eq!(seen, want, "cut at {cut}");
            assert_eq!((passed, held.len()), (stream.len(), 0), "cut at {cut}");
        }
        // A short query cut short is held from its first byte.
        let s = Queries::default().scan(&stream[..commit_at + 3]).unwrap();
        assert_eq!(s.safe, commit_at);
        assert_eq!(Queries::default().scan(&[b'Q', 0, 0, 0, 2, 0]), Err(0), "a length below 4");
    }

    #[test]
    fn only_statements_that_open_or_end_a_block_are_blocks() {
        for (text, want) in [
            ("BEGIN", Some(Block::Begin)),
            ("begin isolation level serializable", Some(Block::Begin)),
            ("START TRANSACTION", Some(Block::Begin)),
            ("COMMIT", Some(Block::Commit)),
            ("end;", Some(Block::Commit)),
            ("COMMIT WORK", Some(Block::Commit)),
            ("COMMIT PREPARED 'x'", None),
            ("ROLLBACK", None),
            ("SELECT 'COMMIT'", None),
        ] {
            assert_eq!(block(format!("{text}\0").as_bytes()), want, "{text}");
            // The same text parsed in the extended protocol, with one
            // parameter type after it: unnamed, the Parse is the block;
            // named, each Bind of it is, until it is closed.
            let parse = |name: &str| [name.as_bytes(), b"\0", text.as_bytes(), b"\0\0\x01\0\0\0\x17"].concat();
            let bind = |name: &str| [b"\0", name.as_bytes(), b"\0\0\0\0\0\0\0"].concat();
            let mut q = Queries::default();
            assert_eq!(q.short(b'P', &parse("")), want, "{text}");
            assert_eq!(q.short(b'B', &bind("")), None, "{text}: the unnamed statement's Bind");
            assert_eq!(q.short(b'P', &parse("S_1")), None, "{text}: a named Parse");
            for _ in 0..2 {
                assert_eq!(q.short(b'B', &bind("S_1")), want, "{text}: a Bind of it");
            }
            assert_eq!(q.short(b'B', &bind("S_2")), None, "{text}: another statement");
            assert_eq!(q.short(b'C', b"SS_1\0"), None);
            assert_eq!(q.short(b'B', &bind("S_1")), None, "{text}: closed");
        }
        assert_eq!(Queries::default().short(b'P', b"\0no terminator"), None, "a Parse cut short is no block");
    }

    /// A whole scan of one buffer, as the proxy does it read by read.
    fn acks_of(buf: &[u8]) -> Scan {
        Acks::default().scan(buf).unwrap()
    }

    #[test]
    fn an_explicit_commit_is_acknowledged_by_its_commandcomplete_and_readyforquery() {
        // BEGIN, an INSERT in the block, COMMIT: as sqlx and psycopg send them.
        let mut buf = msg(b'C', b"BEGIN\0");
        buf.extend(msg(b'Z', b"T"));
        buf.extend(msg(b'C', b"INSERT 0 3\0"));
        buf.extend(msg(b'Z', b"T"));
        let commit_at = buf.len();
        buf.extend(msg(b'C', b"COMMIT\0"));
        buf.extend(msg(b'Z', b"I"));
        let scan = acks_of(&buf);
        assert_eq!(
            scan.acks,
            vec![Ack { start: commit_at, end: buf.len(), wrote: true }],
            "only the COMMIT, not the INSERT inside the block"
        );
        assert_eq!(scan.safe, buf.len());
    }

    #[test]
    fn an_autocommit_write_is_a_commit_and_a_read_is_not() {
        let mut buf = msg(b'1', b"");
        buf.extend(msg(b'2', b""));
        let write_at = buf.len();
        buf.extend(msg(b'C', b"UPDATE 1\0"));
        buf.extend(msg(b'Z', b"I"));
        let write_end = buf.len();
        buf.extend(msg(b'C', b"SELECT 1\0"));
        buf.extend(msg(b'Z', b"I"));
        assert_eq!(acks_of(&buf).acks, vec![Ack { start: write_at, end: write_end, wrote: true }]);
    }

    /// Issue 37: a consumer that commits every empty poll gave most aimed
    /// kills to idle commits. A commit says whether its block changed rows.
    #[test]
    fn a_commit_that_changed_no_rows_is_an_empty_one() {
        let block = |tags: &[&[u8]]| {
            let mut buf = msg(b'C', b"BEGIN\0");
            buf.extend(msg(b'Z', b"T"));
            for t in tags {
                buf.extend(msg(b'C', t));
                buf.extend(msg(b'Z', b"T"));
            }
            buf.extend(msg(b'C', b"COMMIT\0"));
            buf.extend(msg(b'Z', b"I"));
            buf
        };
        let wrote = |buf: &[u8]| acks_of(buf).acks.iter().map(|a| a.wrote).collect::<Vec<_>>();
        assert_eq!(wrote(&block(&[])), vec![false], "BEGIN; COMMIT");
        assert_eq!(wrote(&block(&[b"SELECT 0\0", b"UPDATE 0\0"])), vec![false], "a claim that found nothing");
        assert_eq!(wrote(&block(&[b"SELECT 5\0", b"UPDATE 5\0"])), vec![true], "a claim of 5 rows");
        assert_eq!(wrote(&block(&[b"INSERT 0 1\0"])), vec![true]);
        // The flag ends with the block: a writing commit, then an empty one.
        let two = [block(&[b"DELETE 2\0"]), block(&[])].concat();
        assert_eq!(wrote(&two), vec![true, false]);
        // A write that rolled back leaves the next block empty.
        let mut back = msg(b'C', b"INSERT 0 1\0");
        back.extend(msg(b'Z', b"T"));
        back.extend(msg(b'C', b"ROLLBACK\0"));
        back.extend(msg(b'Z', b"I"));
        back.extend(block(&[]));
        assert_eq!(wrote(&back), vec![false]);
        // Autocommit: a write of no rows commits nothing.
        let mut auto = msg(b'C', b"UPDATE 0\0");
        auto.extend(msg(b'Z', b"I"));
        assert_eq!(wrote(&auto), vec![false]);
        // What a COMMIT sent now would commit.
        let mut open = Acks::default();
        let mut buf = msg(b'C', b"BEGIN\0");
        buf.extend(msg(b'Z', b"T"));
        open.scan(&buf).unwrap();
        assert!(!open.writing());
        buf.extend(msg(b'C', b"INSERT 0 2\0"));
        buf.extend(msg(b'Z', b"T"));
        open.scan(&buf).unwrap();
        assert!(open.writing());
    }

    #[test]
    fn a_rollback_or_a_failed_block_acknowledges_nothing() {
        let mut buf = msg(b'C', b"INSERT 0 1\0");
        buf.extend(msg(b'Z', b"T"));
        buf.extend(msg(b'C', b"ROLLBACK\0"));
        buf.extend(msg(b'Z', b"I"));
        buf.extend(msg(b'E', b"SERROR\0"));
        buf.extend(msg(b'Z', b"E"));
        buf.extend(msg(b'C', b"COMMIT PREPARED\0"));
        buf.extend(msg(b'D', b"\x00\x01\x00\x00\x00\x06COMMIT"));
        buf.extend(msg(b'Z', b"I"));
        assert_eq!(acks_of(&buf).acks, vec![]);
    }

    #[test]
    fn a_commit_split_across_reads_is_held_until_its_readyforquery() {
        let mut stream = msg(b'2', b"");
        stream.extend(msg(b'C', b"COMMIT\0"));
        stream.extend(msg(b'Z', b"I"));
        for cut in 0..=stream.len() {
            // The proxy's loop: scan, send what is safe, drop it, read on.
            let mut acks = Acks::default();
            let mut buf = stream[..cut].to_vec();
            let mut sent = Vec::new();
            let mut found = Vec::new();
            let mut found_wrote = Vec::new();
            for more in [&stream[cut..], &[][..]] {
                let scan = acks.scan(&buf).unwrap();
                found.extend(scan.acks.iter().map(|a| (a.start + sent.len(), a.end + sent.len())));
                found_wrote.extend(scan.acks.iter().map(|a| a.wrote));
                sent.extend_from_slice(&buf[..scan.safe]);
                buf.drain(..scan.safe);
                acks.consumed(scan.safe);
                assert!(sent.len() <= 5 || found.len() == 1, "cut {cut}: the COMMIT went out before its ack was seen");
                buf.extend_from_slice(more);
            }
            assert_eq!(found, vec![(5, stream.len())], "cut at {cut}");
            assert!(found_wrote.iter().all(|w| !w), "cut at {cut}: nothing was written");
            assert_eq!(sent, stream, "cut at {cut}");
        }
    }

    /// A block's first statement that read or wrote rows is found, not its
    /// BEGIN, not a CREATE TABLE before it, and not its later statements;
    /// outside a block nothing is.
    #[test]
    fn a_blocks_first_statement_with_rows_is_found() {
        let rfq = |s: &[u8]| msg(b'Z', s);
        let buf = [
            msg(b'C', b"SELECT 1\0"),
            rfq(b"I"),
            msg(b'C', b"BEGIN\0"),
            rfq(b"T"),
            msg(b'C', b"CREATE TABLE\0"),
            rfq(b"T"),
            msg(b'C', b"SELECT 0\0"),
            rfq(b"T"),
            msg(b'C', b"UPDATE 2\0"),
            rfq(b"T"),
            msg(b'C', b"COMMIT\0"),
            rfq(b"I"),
        ];
        let at = buf[..6].iter().map(Vec::len).sum::<usize>();
        let whole = buf.concat();
        assert_eq!(acks_of(&whole).firsts, [at]);
        // The next block has its own first.
        let mut acks = Acks::default();
        let mut twice = whole.clone();
        assert_eq!(acks.scan(&twice).unwrap().firsts, [at]);
        twice.extend_from_slice(&[msg(b'C', b"BEGIN\0"), rfq(b"T"), msg(b'C', b"INSERT 0 3\0")].concat());
        assert_eq!(acks.scan(&twice).unwrap().firsts, [whole.len() + msg(b'C', b"BEGIN\0").len() + rfq(b"T").len()]);
        // A block opened by START TRANSACTION has its first too.
        let start = [msg(b'C', b"START TRANSACTION\0"), rfq(b"T")].concat();
        let block = [start.clone(), msg(b'C', b"INSERT 0 1\0"), rfq(b"T")].concat();
        assert_eq!(Acks::default().scan(&block).unwrap().firsts, [start.len()]);
    }

    #[test]
    fn a_length_below_four_is_not_postgresql() {
        assert_eq!(Acks::default().scan(b"Z\x00\x00\x00\x02").unwrap_err(), 0);
    }

    #[test]
    fn encryption_requests_are_recognised() {
        let ssl = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        let gss = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];
        let startup = [0, 0, 0, 0x54, 0, 3, 0, 0];
        assert_eq!(opening(&ssl), Opening::Encryption);
        assert_eq!(opening(&gss), Opening::Encryption);
        assert_eq!(opening(&startup), Opening::Startup);
    }
}
