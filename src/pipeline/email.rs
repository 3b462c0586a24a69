//! The pipeline's client for the email provider: one `POST /v1/emails` per
//! call, with an optional idempotency key, every wait bounded by a timeout.
//!
//! Its errors keep apart what a sender must treat differently: a timeout or
//! a lost connection leaves it unknown whether the email went out (retry
//! with the same idempotency key), an error status says it did not.

use serde_json::Value;
use std::time::Duration;

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
#[derive(Debug, Clone)]
pub struct EmailClient {
    /// The HTTP client, which bounds every request by the timeout.
    http: reqwest::Client,
    /// `<base_url>/v1/emails`, parsed once: given as text, every request
    /// parsed it again (with IDNA), a measurable share of an email's cost.
    url: reqwest::Url,
    /// The provider's address, handed on to component processes.
    base: String,
}

impl EmailClient {
    /// A client for the provider at `base_url` (`http://127.0.0.1:<port>`);
    /// `timeout` bounds each send, from connecting to the answer's last byte.
    pub fn new(base_url: &str, timeout: Duration) -> Result<EmailClient, EmailError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // The provider is on 127.0.0.1: a proxy from the environment must not be in the way.
            .no_proxy()
            .build()
            .map_err(|e| EmailError::Other(e.to_string()))?;
        let base = base_url.trim_end_matches('/').to_string();
        let url = reqwest::Url::parse(&format!("{base}/v1/emails"))
            .map_err(|e| EmailError::Other(format!("the provider's URL {base_url:?} is not a URL: {e}")))?;
        Ok(EmailClient { http, url, base })
    }

    /// The provider's base URL, as given.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Asks the provider to send one email with this body, under `key` if
    /// given (a retry must repeat both for the provider to send only once).
    pub async fn send(&self, key: Option<&str>, body: &Value) -> Result<EmailSent, EmailError> {
        let mut request = self.http.post(self.url.clone()).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let answer = request.send().await.map_err(classify)?;
        let status = answer.status();
        let replayed = answer.headers().get("Idempotent-Replayed").is_some_and(|v| v.as_bytes() == b"true");
        let bytes = answer.bytes().await.map_err(classify)?;
        let text = || String::from_utf8_lossy(&bytes).into_owned();
        if !status.is_success() {
            return Err(EmailError::Status(status.as_u16(), text()));
        }
        // Only the id is read: no tree of the answer is built.
        #[derive(serde::Deserialize)]
        struct Accepted {
            id: Option<String>,
        }
        match serde_json::from_slice::<Accepted>(&bytes) {
            Ok(Accepted { id: Some(id) }) => Ok(EmailSent { id, replayed }),
            Ok(Accepted { id: None }) => Err(EmailError::Other(format!("answer without an id: {}", text()))),
            Err(e) => Err(EmailError::Other(format!("answer {:?}: {e}", text()))),
        }
    }
}

/// Sorts a transport error into what the sender must do about it.
fn classify(err: reqwest::Error) -> EmailError {
    if err.is_timeout() {
        return EmailError::Timeout;
    }
    if err.is_connect() {
        return EmailError::Other(format!("cannot connect to the email provider: {}", chain(&err)));
    }
    // Walk the causes: hyper says "incomplete message" for EOF before any
    // answer; the socket may instead report a reset.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = cause {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
                return EmailError::ConnectionLost(chain(&err));
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(io.kind(), ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe) {
                return EmailError::ConnectionLost(chain(&err));
            }
        }
        cause = e.source();
    }
    EmailError::Other(chain(&err))
}

/// The error and its causes on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testing::Scripted;
    use crate::provider::{Fault, Nemesis, NoFaults, Outcome, Provider, ProviderSettings};
    use serde_json::json;
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
