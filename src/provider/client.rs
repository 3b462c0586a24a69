//! The email provider's client, as the reference notifier sends its
//! receipts through it: one `POST /v1/emails` per
//! email, with an optional idempotency key, a call's emails pipelined on
//! one connection, every wait bounded by a timeout.
//!
//! Its errors keep apart what a sender must treat differently: a timeout or
//! a lost connection leaves it unknown whether the email went out (retry
//! with the same idempotency key), an error status says it did not.

use serde::Serialize;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The variable that gives a notifier process the provider's base URL.
pub const PROVIDER_ENV: &str = "CHAOS_PROVIDER_URL";

/// How long the reference notifier waits for the provider's answer: less
/// than `provider.slow`'s hold, so that a slow answer is a timeout.
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// An email the provider accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailSent {
    /// The provider's id for the email, `em_<n>`.
    pub id: String,
    /// True when the provider replayed the answer to an earlier request with
    /// the same idempotency key (`Idempotent-Replayed: true`): nothing new was sent.
    pub replayed: bool,
}

/// Why a send did not come back with an accepted email.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmailError {
    /// No answer within the timeout: the email may or may not have gone out.
    #[error("the email provider did not answer in time")]
    Timeout,
    /// The connection closed with no answer after the request was sent: the
    /// email may or may not have gone out.
    #[error("the email provider dropped the connection without answering: {0}")]
    ConnectionLost(String),
    /// The provider answered with an error status and this body.
    #[error("the email provider answered {0}: {1}")]
    Status(u16, String),
    /// Anything else: the provider unreachable, an answer that makes no sense.
    #[error("cannot send the email: {0}")]
    Other(String),
}

/// Sends emails through the provider at one base URL.
///
/// Over HTTP/1.1 with pipelining, written by hand: the requests of one
/// call go out in one write on a fresh connection, and their answers are
/// read back in order. Per email, a general client (a pooled connection
/// checked out, a request built, a task woken for each answer, two system
/// calls a side) cost more than the provider's own work: the pipeline with
/// emails on ran at 78% of its speed without them. Each request is still
/// its own request to the provider, with its own key and its own faults.
#[derive(Debug, Clone)]
pub struct EmailClient {
    /// `host:port`, connected to afresh for every call: a connection is
    /// never reused, so an answer that never came (the provider dropped the
    /// connection) is never taken for a stale connection and sent again.
    authority: String,
    /// `/v1/emails` under the base URL's path.
    path: String,
    /// Bounds the connection, the write, and each answer.
    timeout: Duration,
    /// The provider's address, handed on to component processes.
    base: String,
}

/// An answer's head is never longer than this: an answer that is, is not
/// the provider's.
const MAX_HEAD: usize = 16 * 1024;

impl EmailClient {
    /// A client for the provider at `base_url` (`http://127.0.0.1:<port>`);
    /// `timeout` bounds the connection, and each answer from the moment the
    /// one before it ended.
    pub fn new(base_url: &str, timeout: Duration) -> Result<EmailClient, EmailError> {
        let base = base_url.trim_end_matches('/').to_string();
        let not_url = |why: String| EmailError::Other(format!("the provider's URL {base_url:?} {why}"));
        let url = reqwest::Url::parse(&base).map_err(|e| not_url(format!("is not a URL: {e}")))?;
        if url.scheme() != "http" {
            return Err(not_url("is not http://; the provider speaks plain HTTP on 127.0.0.1".into()));
        }
        let host = url.host_str().ok_or_else(|| not_url("names no host".into()))?;
        let port = url.port_or_known_default().unwrap_or(80);
        let path = format!("{}/v1/emails", url.path().trim_end_matches('/'));
        Ok(EmailClient { authority: format!("{host}:{port}"), path, timeout, base })
    }

    /// The provider's base URL, as given.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Asks the provider to send one email with this body, under `key` if
    /// given (a retry must repeat both for the provider to send only once).
    pub async fn send<B: Serialize>(&self, key: Option<&str>, body: &B) -> Result<EmailSent, EmailError> {
        let mut all = self.send_all(&[(key, body)]).await;
        all.pop().unwrap_or_else(|| Err(EmailError::Other("no answer".into())))
    }

    /// Sends each email as its own request, all on one connection: one
    /// outcome per email, in order. Answers come in the order of the
    /// requests, so once one is missing, the ones after it are unknown too:
    /// a dropped connection leaves them all `ConnectionLost`, a held answer
    /// leaves them all `Timeout` (retry each with its key).
    pub async fn send_all<B: Serialize>(&self, emails: &[(Option<&str>, &B)]) -> Vec<Result<EmailSent, EmailError>> {
        let mut out = Vec::with_capacity(emails.len());
        if let Err(unanswered) = self.exchange(emails, &mut out).await {
            out.resize(emails.len(), Err(unanswered));
        }
        out
    }

    /// One connection's exchange: each answer's outcome pushed to `out` in
    /// order, until all came or one could not (why is the error).
    async fn exchange<B: Serialize>(
        &self,
        emails: &[(Option<&str>, &B)],
        out: &mut Vec<Result<EmailSent, EmailError>>,
    ) -> Result<(), EmailError> {
        let requests = self.requests(emails)?;
        let mut stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| EmailError::Timeout)?
            .map_err(|e| {
                EmailError::Other(format!("cannot connect to the email provider at {}: {e}", self.authority))
            })?;
        // Small requests, answered at once: Nagle's wait would only delay.
        let _ = stream.set_nodelay(true);
        // Some requests may have gone out before a failure: lost, not refused.
        tokio::time::timeout(self.timeout, stream.write_all(&requests))
            .await
            .map_err(|_| EmailError::Timeout)?
            .map_err(|e| EmailError::ConnectionLost(format!("writing the requests: {e}")))?;
        let mut answers = Answers { stream, buf: Vec::with_capacity(4096), start: 0 };
        while out.len() < emails.len() {
            let answer =
                tokio::time::timeout(self.timeout, answers.next()).await.map_err(|_| EmailError::Timeout)??;
            out.push(answer.outcome());
        }
        Ok(())
    }

    /// The requests of `emails`, one after another, as they go on the wire.
    fn requests<B: Serialize>(&self, emails: &[(Option<&str>, &B)]) -> Result<Vec<u8>, EmailError> {
        use std::io::Write;
        let mut wire = Vec::with_capacity(emails.len() * 384);
        // One buffer for every body: its length goes in the head before it.
        let mut json = Vec::with_capacity(256);
        for (key, body) in emails {
            json.clear();
            serde_json::to_writer(&mut json, body).map_err(|e| EmailError::Other(format!("encoding an email: {e}")))?;
            let _ = write!(
                wire,
                "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                self.path,
                self.authority,
                json.len()
            );
            if let Some(key) = key {
                // A key with a line break would forge headers: refused here,
                // as a general client refuses it.
                if key.bytes().any(|b| b == b'\r' || b == b'\n') {
                    return Err(EmailError::Other(format!("the idempotency key {key:?} holds a line break")));
                }
                let _ = write!(wire, "idempotency-key: {key}\r\n");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&json);
        }
        Ok(wire)
    }
}

/// One answer: its status, whether it was replayed, its body.
struct Answer {
    status: u16,
    replayed: bool,
    body: Vec<u8>,
}

impl Answer {
    /// What the sender makes of it.
    fn outcome(self) -> Result<EmailSent, EmailError> {
        let text = || String::from_utf8_lossy(&self.body).into_owned();
        if !(200..300).contains(&self.status) {
            return Err(EmailError::Status(self.status, text()));
        }
        // Only the id is read: no tree of the answer is built.
        #[derive(serde::Deserialize)]
        struct Accepted {
            id: Option<String>,
        }
        match serde_json::from_slice::<Accepted>(&self.body) {
            Ok(Accepted { id: Some(id) }) => Ok(EmailSent { id, replayed: self.replayed }),
            Ok(Accepted { id: None }) => Err(EmailError::Other(format!("answer without an id: {}", text()))),
            Err(e) => Err(EmailError::Other(format!("answer {:?}: {e}", text()))),
        }
    }
}

/// The answers on one connection, read in order.
struct Answers {
    stream: TcpStream,
    /// Bytes read and not yet taken; `start` is where the next answer begins.
    buf: Vec<u8>,
    start: usize,
}

impl Answers {
    /// The next answer whole, or why none came: the connection closed or
    /// failed before its last byte (`ConnectionLost`), or what came was not
    /// an answer (`Other`).
    async fn next(&mut self) -> Result<Answer, EmailError> {
        loop {
            if let Some((answer, used)) = self.parse()? {
                self.start += used;
                return Ok(answer);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let had = self.buf.len();
            self.buf.reserve(4096);
            let read = self.stream.read_buf(&mut self.buf).await;
            match read {
                Ok(0) if had == 0 => {
                    return Err(EmailError::ConnectionLost("the provider closed the connection with no answer".into()))
                }
                Ok(0) => {
                    return Err(EmailError::ConnectionLost(
                        "the provider closed the connection in the middle of an answer".into(),
                    ))
                }
                Ok(_) => {}
                Err(e) => return Err(EmailError::ConnectionLost(format!("reading the answer: {e}"))),
            }
        }
    }

    /// An answer whole at the buffer's start, and the bytes it took; None
    /// while more must be read.
    fn parse(&self) -> Result<Option<(Answer, usize)>, EmailError> {
        let bytes = &self.buf[self.start..];
        let mut headers = [httparse::EMPTY_HEADER; 24];
        let mut head = httparse::Response::new(&mut headers);
        let bad = |why: String| EmailError::Other(format!("the provider's answer {why}"));
        let size = match head.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if bytes.len() > MAX_HEAD => return Err(bad("has a head too long".into())),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(bad(format!("is not HTTP: {e}"))),
        };
        let (mut length, mut replayed) = (None, false);
        for h in head.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<usize>().ok());
                length = Some(n.ok_or_else(|| bad("has a content-length that is not a number".into()))?);
            } else if h.name.eq_ignore_ascii_case(crate::provider::IDEMPOTENT_REPLAYED) {
                replayed = h.value == b"true";
            }
        }
        let length = length.ok_or_else(|| bad("has no content-length".into()))?;
        if bytes.len() < size + length {
            return Ok(None);
        }
        let status = head.code.unwrap_or(0);
        Ok(Some((Answer { status, replayed, body: bytes[size..size + length].to_vec() }, size + length)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testing::Scripted;
    use crate::provider::{Fault, Nemesis, NoFaults, Outcome, Provider, ProviderSettings};
    use serde_json::{json, Value};
    use std::sync::Arc;
    use std::time::Instant;

    async fn provider(slow_for: Duration, nemesis: Arc<dyn Nemesis>) -> Provider {
        Provider::start(ProviderSettings { slow_for, ..ProviderSettings::default() }, nemesis).await.unwrap()
    }

    fn receipt(payment: &str) -> Value {
        json!({"to": "payer@example.com", "subject": "Your receipt", "text": "Paid.", "payment_id": payment})
    }

    #[tokio::test]
    async fn send_returns_the_id_and_marks_a_replay() {
        let p = provider(Duration::from_secs(3), Arc::new(NoFaults)).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        let first = client.send(Some("pay-1"), &receipt("p1")).await.unwrap();
        let again = client.send(Some("pay-1"), &receipt("p1")).await.unwrap();
        let keyless = client.send(None, &receipt("p1")).await.unwrap();
        assert_eq!(first, EmailSent { id: "em_1".into(), replayed: false });
        assert_eq!(again, EmailSent { id: "em_1".into(), replayed: true });
        assert_eq!(keyless, EmailSent { id: "em_2".into(), replayed: false });
        assert_eq!(p.record().emails_sent().len(), 2);
    }

    #[tokio::test]
    async fn a_lost_response_is_connection_lost_and_the_retry_replays_it() {
        let nemesis = Arc::new(Scripted::new([Some(Fault::ResponseLost)]));
        let p = provider(Duration::from_secs(3), nemesis.clone()).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        match client.send(Some("pay-1"), &receipt("p1")).await {
            Err(EmailError::ConnectionLost(_)) => {}
            other => panic!("expected ConnectionLost, got {other:?}"),
        }
        assert_eq!(p.record().outcomes(), [&Outcome::SentResponseLost { id: crate::provider::EmailId(1) }]);
        let retry = client.send(Some("pay-1"), &receipt("p1")).await.unwrap();
        assert_eq!(retry, EmailSent { id: "em_1".into(), replayed: true });
        assert_eq!(p.record().emails_sent().len(), 1, "one email in all");
        assert_eq!(nemesis.seen_confirmed(), [Fault::ResponseLost]);
        assert_eq!(p.faults()[&Fault::ResponseLost].confirmed, 1);
    }

    #[tokio::test]
    async fn a_slow_answer_is_a_timeout_though_the_email_went_out_once() {
        let nemesis = Arc::new(Scripted::new([Some(Fault::Slow)]));
        let slow_for = Duration::from_millis(1500);
        let p = provider(slow_for, nemesis.clone()).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_millis(300)).unwrap();
        let began = Instant::now();
        assert_eq!(client.send(Some("pay-1"), &receipt("p1")).await, Err(EmailError::Timeout));
        assert!(began.elapsed() < slow_for, "the client gave up before the hold ended");
        assert_eq!(p.record().outcomes(), [&Outcome::SentSlow { id: crate::provider::EmailId(1) }]);
        let retry = client.send(Some("pay-1"), &receipt("p1")).await.unwrap();
        assert_eq!(retry, EmailSent { id: "em_1".into(), replayed: true });
        assert_eq!(p.record().emails_sent().len(), 1);
        // Confirmed when the hold ends (or the provider sees the client go).
        let deadline = Instant::now() + slow_for + Duration::from_secs(2);
        while nemesis.seen_confirmed().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(nemesis.seen_confirmed(), [Fault::Slow]);
        assert_eq!(p.faults()[&Fault::Slow].fired, 1);
    }

    #[tokio::test]
    async fn refusals_are_statuses_with_the_providers_body() {
        let nemesis = Arc::new(Scripted::new([None, Some(Fault::Error)]));
        let p = provider(Duration::from_secs(3), nemesis).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        client.send(Some("pay-1"), &receipt("p1")).await.unwrap();
        match client.send(Some("pay-1"), &receipt("p2")).await {
            Err(EmailError::Status(409, body)) => assert!(body.contains("idempotency_key_reused"), "{body}"),
            other => panic!("expected a 409, got {other:?}"),
        }
        match client.send(Some("pay-2"), &receipt("p2")).await {
            Err(EmailError::Status(503, body)) => assert!(body.contains("unavailable"), "{body}"),
            other => panic!("expected a 503, got {other:?}"),
        }
    }

    /// The outcomes of `send_all`, as ids (`em_1`, `em_1 replayed`) or errors.
    fn shown(all: Vec<Result<EmailSent, EmailError>>) -> Vec<String> {
        all.into_iter()
            .map(|r| match r {
                Ok(EmailSent { id, replayed: false }) => id,
                Ok(EmailSent { id, replayed: true }) => format!("{id} replayed"),
                Err(EmailError::ConnectionLost(_)) => "lost".into(),
                Err(EmailError::Timeout) => "timeout".into(),
                Err(e) => e.to_string(),
            })
            .collect()
    }

    #[tokio::test]
    async fn pipelined_emails_are_answered_in_order_each_its_own_request() {
        let p = provider(Duration::from_secs(3), Arc::new(NoFaults)).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        let bodies: Vec<Value> = (1..=40).map(|i| receipt(&format!("p{i}"))).collect();
        let keys: Vec<String> = (1..=40).map(|i| format!("pay-{i}")).collect();
        let emails: Vec<_> = keys.iter().zip(&bodies).map(|(k, b)| (Some(k.as_str()), b)).collect();
        let want: Vec<String> = (1..=40).map(|i| format!("em_{i}")).collect();
        assert_eq!(shown(client.send_all(&emails).await), want);
        let record = p.record();
        assert_eq!(record.emails_sent().len(), 40);
        assert_eq!(record.requests.len(), 40, "one request each");
        // Again, each is replayed by its own key.
        let again: Vec<String> = want.iter().map(|id| format!("{id} replayed")).collect();
        assert_eq!(shown(client.send_all(&emails).await), again);
        assert_eq!(p.record().emails_sent().len(), 40);
    }

    #[tokio::test]
    async fn a_lost_answer_leaves_the_ones_behind_it_unknown_and_the_retry_sends_each_once() {
        // The second of three is sent and its connection dropped: the third
        // never reached the provider, and its sender cannot know that.
        let nemesis = Arc::new(Scripted::new([None, Some(Fault::ResponseLost)]));
        let p = provider(Duration::from_secs(3), nemesis.clone()).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        let bodies: Vec<Value> = (1..=3).map(|i| receipt(&format!("p{i}"))).collect();
        let keys = ["pay-1", "pay-2", "pay-3"];
        let emails: Vec<_> = keys.iter().zip(&bodies).map(|(k, b)| (Some(*k), b)).collect();
        assert_eq!(shown(client.send_all(&emails).await), ["em_1", "lost", "lost"]);
        let outcomes: Vec<Outcome> = p.record().outcomes().into_iter().cloned().collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Sent { id: crate::provider::EmailId(1) },
                Outcome::SentResponseLost { id: crate::provider::EmailId(2) }
            ]
        );
        assert_eq!(shown(client.send_all(&emails).await), ["em_1 replayed", "em_2 replayed", "em_3"]);
        assert_eq!(p.record().emails_sent().len(), 3, "one email each");
        assert_eq!(nemesis.seen_confirmed(), [Fault::ResponseLost]);
    }

    #[tokio::test]
    async fn a_held_answer_times_out_the_ones_behind_it() {
        let nemesis = Arc::new(Scripted::new([Some(Fault::Slow)]));
        let p = provider(Duration::from_millis(1500), nemesis).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_millis(300)).unwrap();
        let (a, b) = (receipt("p1"), receipt("p2"));
        let began = Instant::now();
        assert_eq!(shown(client.send_all(&[(Some("pay-1"), &a), (Some("pay-2"), &b)]).await), ["timeout", "timeout"]);
        assert!(began.elapsed() < Duration::from_millis(1500), "the client gave up before the hold ended");
    }

    #[tokio::test]
    async fn a_key_with_a_line_break_is_refused_before_anything_is_sent() {
        let p = provider(Duration::from_secs(3), Arc::new(NoFaults)).await;
        let client = EmailClient::new(&p.base_url(), Duration::from_secs(5)).unwrap();
        let body = receipt("p1");
        match client.send(Some("pay-1\r\nx-forged: 1"), &body).await {
            Err(EmailError::Other(why)) => assert!(why.contains("line break"), "{why}"),
            other => panic!("expected Other, got {other:?}"),
        }
        assert!(p.record().requests.is_empty(), "nothing reached the provider");
    }

    #[test]
    fn a_url_that_is_not_plain_http_is_refused() {
        for url in ["https://127.0.0.1:1", "not a url", "http://"] {
            assert!(matches!(EmailClient::new(url, TIMEOUT), Err(EmailError::Other(_))), "{url}");
        }
    }

    #[tokio::test]
    async fn a_provider_that_is_not_there_is_other() {
        // A port just freed: nothing listens on it.
        let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let client = EmailClient::new(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(2)).unwrap();
        match client.send(None, &receipt("p1")).await {
            Err(EmailError::Other(why)) => assert!(why.contains("connect"), "{why}"),
            other => panic!("expected Other, got {other:?}"),
        }
    }
}
