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
//! kill. A `Produce` with
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

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many proxy slots the broker has listeners for.
pub const SLOTS: u16 = 10;
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

/// Larger than any frame a broker or client sends (their limits are 100
/// MiB for a request and 50 MiB for a fetch): a size beyond it means the
/// stream is not Kafka.
const MAX_FRAME: usize = 1 << 30;

/// A request's header fields, as the proxy notes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub api_key: i16,
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
                self.left -= n;
                at += n;
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
            out.push(Request {
                api_key: i16::from_be_bytes([h[4], h[5]]),
                correlation: i32::from_be_bytes([h[8], h[9], h[10], h[11]]),
            });
            self.left = size as usize + 4 - 12;
            self.head.clear();
        }
        Ok(out)
    }
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

/// The requests of one connection still waiting for their response.
#[derive(Debug, Default)]
pub struct InFlight(Mutex<VecDeque<Request>>);

impl InFlight {
    pub fn sent(&self, r: Request) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(r);
    }

    /// The API key of the request a response answers. Requests before it
    /// got no response (a `Produce` with `acks=0`) and are dropped.
    pub fn answered(&self, correlation: i32) -> Option<i16> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(r) = q.pop_front() {
            if r.correlation == correlation {
                return Some(r.api_key);
            }
        }
        None
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
            Request { api_key: 18, correlation: 1 },
            Request { api_key: 0, correlation: 2 },
            Request { api_key: 3, correlation: 3 },
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
        f.sent(Request { api_key: 0, correlation: 7 });
        f.sent(Request { api_key: 0, correlation: 8 });
        f.sent(Request { api_key: 1, correlation: 9 });
        // 7 was an acks=0 produce: no response; 8's response comes first.
        assert_eq!(f.answered(8), Some(0));
        assert_eq!(f.answered(9), Some(1));
        assert_eq!(f.answered(10), None);
    }
}
