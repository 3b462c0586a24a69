//! The PostgreSQL wire protocol, as far as the fault proxy reads it: the
//! framing only, never a payload it would rewrite.
//!
//! After the startup message every backend message is a type byte and a
//! big-endian length that counts itself. The proxy cuts the server's stream
//! into whole messages and looks at one kind: `CommandComplete` (`C`)
//! whose tag is `COMMIT`. The server sends it only after the transaction is
//! durable (a failed COMMIT's tag is `ROLLBACK`), so that message is the
//! moment a commit is acknowledged, whatever the client library and
//! whether it sent `COMMIT` as a simple query or through the extended
//! protocol.
//!
//! The client's stream is passed through as bytes, with one exception
//! before startup: a request to negotiate TLS (`SSLRequest`) or GSSAPI
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

/// One whole backend message in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Where it starts in the buffer and where it ends (exclusive).
    pub start: usize,
    pub end: usize,
    /// The server acknowledged a COMMIT: `CommandComplete` with tag `COMMIT`.
    pub commit_ack: bool,
}

/// The whole messages at the front of `buf`, in order; the bytes after the
/// last one are an incomplete message that must wait for more. A length
/// below 4 is not PostgreSQL: `Err` with the offset, and the proxy then
/// stops reading framing on that connection (it passes bytes on).
pub fn messages(buf: &[u8]) -> Result<Vec<Message>, usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 5 {
        let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
        if len < 4 {
            return Err(at);
        }
        let end = at + 1 + len;
        if end > buf.len() {
            break;
        }
        let commit_ack = buf[at] == b'C' && &buf[at + 5..end] == b"COMMIT\0";
        out.push(Message { start: at, end, commit_ack });
        at = end;
    }
    Ok(out)
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

    /// The bytes a server sends for `COMMIT` as a simple query: its
    /// CommandComplete, then ReadyForQuery idle. Recorded from PostgreSQL 15
    /// (the same bytes `psql` and sqlx see).
    const RECORDED_COMMIT: &[u8] = b"C\x00\x00\x00\x0bCOMMIT\x00Z\x00\x00\x00\x05I";

    #[test]
    fn finds_the_commit_acknowledgement_in_a_recorded_reply() {
        let ms = messages(RECORDED_COMMIT).unwrap();
        assert_eq!(ms.len(), 2);
        assert!(ms[0].commit_ack);
        assert_eq!((ms[0].start, ms[0].end), (0, 12));
        assert!(!ms[1].commit_ack, "ReadyForQuery is not the acknowledgement");
    }

    #[test]
    fn other_tags_are_not_commits() {
        let mut buf = msg(b'C', b"INSERT 0 3\0");
        buf.extend(msg(b'C', b"ROLLBACK\0"));
        buf.extend(msg(b'C', b"COMMIT PREPARED\0"));
        buf.extend(msg(b'D', b"\x00\x01\x00\x00\x00\x06COMMIT"));
        let ms = messages(&buf).unwrap();
        assert_eq!(ms.len(), 4);
        assert!(ms.iter().all(|m| !m.commit_ack), "{ms:?}");
    }

    #[test]
    fn a_message_split_across_reads_waits_for_its_end() {
        let mut stream = msg(b'2', b"");
        stream.extend_from_slice(RECORDED_COMMIT);
        for cut in 0..stream.len() {
            let first = messages(&stream[..cut]).unwrap();
            let whole: usize = first.last().map_or(0, |m| m.end);
            let rest = messages(&stream[whole..]).unwrap();
            let acks = first.iter().chain(&rest).filter(|m| m.commit_ack).count();
            assert_eq!(acks, 1, "cut at {cut}");
            assert_eq!(first.len() + rest.len(), 3, "cut at {cut}");
        }
    }

    #[test]
    fn a_length_below_four_is_not_postgresql() {
        assert_eq!(messages(b"Z\x00\x00\x00\x02").unwrap_err(), 0);
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
