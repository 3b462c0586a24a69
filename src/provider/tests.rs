//! The provider's idempotency, record and faults, seen from the wire.

use super::testing::Scripted;
use super::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn quick() -> ProviderSettings {
    ProviderSettings { slow_for: Duration::from_secs(30), ..ProviderSettings::default() }
}

async fn start(settings: ProviderSettings, nemesis: Arc<dyn Nemesis>) -> Provider {
    Provider::start(settings, nemesis).await.expect("provider starts")
}

/// One answer from the provider: status, whether replayed, JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    body: Value,
}

impl Answer {
    fn id(&self) -> &str {
        self.body["id"].as_str().unwrap_or_else(|| panic!("no id in {self:?}"))
    }

    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_else(|| panic!("no error code in {self:?}"))
    }
}

/// Posts `body` as raw text, so tests control its bytes exactly.
async fn post(p: &Provider, key: Option<&str>, body: &str) -> Answer {
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let mut req = http.post(format!("{}/v1/emails", p.base_url())).body(body.to_string());
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let res = req.send().await.expect("an answer");
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let body = res.json().await.expect("a JSON answer");
    Answer { status, replayed, body }
}

fn sent_ids(p: &Provider) -> Vec<String> {
    p.record().emails_sent().iter().map(|r| r.outcome.sent().unwrap().to_string()).collect()
}

fn tally(p: &Provider, fault: Fault) -> (u64, u64) {
    let t = p.faults()[&fault];
    (t.fired, t.confirmed)
}

#[tokio::test]
async fn a_repeated_key_and_body_replays_the_first_answer_and_sends_once() {
    let p = start(quick(), Arc::new(NoFaults)).await;
    let first = post(&p, Some("k1"), r#"{"to":"a@example.com","payment_id":"p1"}"#).await;
    // The same JSON value in other bytes: key order and spacing do not matter.
    let again = post(&p, Some("k1"), r#"{ "payment_id": "p1", "to": "a@example.com" }"#).await;
    assert_eq!((first.status, first.replayed, first.id()), (200, false, "em_1"));
    assert_eq!((again.status, again.replayed, again.id()), (200, true, "em_1"));
    assert_eq!(sent_ids(&p), ["em_1"]);
    assert_eq!(p.record().outcomes(), [&Outcome::Sent { id: EmailId(1) }, &Outcome::Replayed { id: EmailId(1) }]);
}

#[tokio::test]
async fn a_repeated_key_with_another_body_is_refused_and_sends_nothing() {
    let p = start(quick(), Arc::new(NoFaults)).await;
    assert_eq!(post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await.status, 200);
    let other = post(&p, Some("k1"), r#"{"payment_id":"p2"}"#).await;
    assert_eq!((other.status, other.code()), (409, "idempotency_key_reused"));
    assert_eq!(sent_ids(&p), ["em_1"]);
    assert_eq!(p.record().requests[1].outcome, Outcome::Conflict);
}

#[tokio::test]
async fn requests_without_a_key_send_every_time() {
    let p = start(quick(), Arc::new(NoFaults)).await;
    let a = post(&p, None, r#"{"payment_id":"p1"}"#).await;
    let b = post(&p, None, r#"{"payment_id":"p1"}"#).await;
    assert_eq!((a.id(), b.id(), b.replayed), ("em_1", "em_2", false));
    assert_eq!(sent_ids(&p), ["em_1", "em_2"]);
}

#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_refused_and_its_key_not_kept() {
    let p = start(quick(), Arc::new(NoFaults)).await;
    assert_eq!(post(&p, Some("k1"), "[1, 2]").await.code(), "invalid_request");
    let garbled = post(&p, None, "not json").await;
    assert_eq!((garbled.status, garbled.code()), (400, "invalid_request"));
    // The refused request did not claim its key: a good body under it sends.
    assert_eq!(post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await.id(), "em_1");
    let record = p.record();
    let keep = &ProviderSettings::default().keep;
    assert_eq!(record.requests[0].body, Body::of_json(&json!([1, 2]), keep));
    assert_eq!(record.requests[0].body.form, Form::OtherJson);
    assert_eq!(record.requests[1].body, Body::not_json("not json", keep));
    assert_eq!(record.requests[1].body.form, Form::NotJson);
    assert_eq!(record.outcomes()[..2], [&Outcome::BadRequest, &Outcome::BadRequest]);
    assert_eq!(sent_ids(&p), ["em_1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_one_key_send_one_email() {
    // With sending instant (checked and claimed under one lock) and with a
    // send that takes a while (the key in progress meanwhile).
    for send_takes in [Duration::ZERO, Duration::from_millis(200)] {
        let p = Arc::new(start(ProviderSettings { send_takes, ..quick() }, Arc::new(NoFaults)).await);
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move { post(&p, Some("same"), r#"{"payment_id":"p1"}"#).await })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert_eq!(sent_ids(&p), ["em_1"], "send_takes {send_takes:?}");
        let fresh = answers.iter().filter(|a| a.status == 200 && !a.replayed).count();
        assert_eq!(fresh, 1, "{answers:?}");
        for a in &answers {
            match a.status {
                200 => assert_eq!(a.id(), "em_1"),
                409 => assert_eq!(a.code(), "idempotency_key_in_use"),
                other => panic!("status {other}: {a:?}"),
            }
        }
        if !send_takes.is_zero() {
            assert!(p.record().outcomes().contains(&&Outcome::InUse), "a duplicate meets the key in progress");
        }
        assert_eq!(p.record().requests.len(), 10);
    }
}

#[tokio::test]
async fn the_error_fault_refuses_before_sending_and_its_retry_sends_and_confirms_it() {
    let nemesis = Arc::new(Scripted::new([Some(Fault::Error)]));
    let p = start(quick(), nemesis.clone()).await;
    let refused = post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await;
    assert_eq!((refused.status, refused.code()), (503, "unavailable"));
    assert!(sent_ids(&p).is_empty());
    assert_eq!(tally(&p, Fault::Error), (1, 0));
    // The key was not stored: the retry sends, once.
    let retry = post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await;
    assert_eq!((retry.status, retry.replayed, retry.id()), (200, false, "em_1"));
    assert_eq!(sent_ids(&p), ["em_1"]);
    assert_eq!(tally(&p, Fault::Error), (1, 1));
    assert_eq!(nemesis.seen_confirmed(), [Fault::Error]);
    assert_eq!(p.record().outcomes(), [&Outcome::Unavailable, &Outcome::Sent { id: EmailId(1) }]);
}

#[tokio::test]
async fn a_keyless_error_is_confirmed_by_a_request_with_the_same_body() {
    let nemesis = Arc::new(Scripted::new([Some(Fault::Error)]));
    let p = start(quick(), nemesis.clone()).await;
    assert_eq!(post(&p, None, r#"{"payment_id":"p1"}"#).await.status, 503);
    assert_eq!(post(&p, None, r#"{"payment_id":"p2"}"#).await.status, 200);
    assert_eq!(tally(&p, Fault::Error), (1, 0), "another body is not the retry");
    assert_eq!(post(&p, None, r#"{ "payment_id": "p1" }"#).await.status, 200);
    assert_eq!(tally(&p, Fault::Error), (1, 1));
    assert_eq!(nemesis.seen_confirmed(), [Fault::Error]);
}

/// Posts over a bare socket and returns every byte the provider sent back
/// before closing.
async fn raw_post(addr: SocketAddr, key: &str, body: &str) -> std::io::Result<Vec<u8>> {
    let mut socket = TcpStream::connect(addr).await?;
    let request = format!(
        "POST /v1/emails HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut got)).await.expect("the provider closes")?;
    Ok(got)
}

#[tokio::test]
async fn response_lost_sends_then_closes_the_connection_without_a_byte() {
    let nemesis = Arc::new(Scripted::new([Some(Fault::ResponseLost)]));
    let p = start(quick(), nemesis.clone()).await;
    let got = raw_post(p.addr(), "k1", r#"{"payment_id":"p1"}"#).await.expect("EOF, not an error");
    assert!(got.is_empty(), "no response bytes at all, got {:?}", String::from_utf8_lossy(&got));
    assert_eq!(p.record().outcomes(), [&Outcome::SentResponseLost { id: EmailId(1) }]);
    assert_eq!(tally(&p, Fault::ResponseLost), (1, 0));
    // The retry gets the stored answer: one email in all.
    let retry = post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await;
    assert_eq!((retry.status, retry.replayed, retry.id()), (200, true, "em_1"));
    assert_eq!(sent_ids(&p), ["em_1"]);
    assert_eq!(tally(&p, Fault::ResponseLost), (1, 1));
    assert_eq!(nemesis.seen_confirmed(), [Fault::ResponseLost]);
}

#[tokio::test]
async fn the_record_keeps_arrival_order_and_every_outcome() {
    let nemesis = Arc::new(Scripted::new([None, Some(Fault::Error), None]));
    let p = start(quick(), nemesis).await;
    post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await;
    post(&p, Some("k1"), r#"{"payment_id":"p1"}"#).await;
    post(&p, Some("k1"), r#"{"payment_id":"other"}"#).await;
    post(&p, Some("k2"), r#"{"payment_id":"p2"}"#).await;
    post(&p, Some("k2"), r#"{"payment_id":"p2"}"#).await;
    post(&p, None, "[]").await;
    let record = p.record();
    let seqs: Vec<u64> = record.requests.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4, 5]);
    assert!(record.requests.windows(2).all(|w| w[0].arrived() <= w[1].arrived()));
    let keys: Vec<Option<String>> = record.requests.iter().map(|r| r.key.as_ref().map(|k| k.to_string())).collect();
    let k = |t: &str| Some(t.to_string());
    assert_eq!(keys, [k("k1"), k("k1"), k("k1"), k("k2"), k("k2"), None]);
    assert_eq!(
        record.outcomes(),
        [
            &Outcome::Sent { id: EmailId(1) },
            &Outcome::Replayed { id: EmailId(1) },
            &Outcome::Conflict,
            &Outcome::Unavailable,
            &Outcome::Sent { id: EmailId(2) },
            &Outcome::BadRequest,
        ]
    );
    let sent: Vec<u64> = record.emails_sent().iter().map(|r| r.seq).collect();
    assert_eq!(sent, [0, 4]);
    assert_eq!(record.requests[0].body, Body::of_json(&json!({"payment_id": "p1"}), &record.keep));
    assert_eq!(record.field(&record.requests[0], "payment_id"), Some(Scalar::Text("p1".into())));
    // The record is a document a verifier can read back.
    let text = serde_json::to_string(&record).unwrap();
    assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), record);
    // Taken for the verifier: the same record, moved out, not copied.
    assert_eq!(p.take_record(), record);
    assert!(p.record().requests.is_empty());
    assert_eq!(p.faults()[&Fault::Error].fired, 1, "the tallies stay");
}

#[tokio::test]
async fn it_binds_only_loopback_and_shutdown_drops_every_connection() {
    let nemesis = Arc::new(Scripted::new([Some(Fault::Slow)]));
    let p = Arc::new(start(quick(), nemesis.clone()).await);
    assert_eq!(p.addr().ip(), std::net::IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(p.base_url(), format!("http://127.0.0.1:{}", p.addr().port()));

    // A request held by `Slow` (for 30 s) is cut when the provider stops.
    let held = {
        let p = p.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::builder().no_proxy().build().unwrap();
            http.post(format!("{}/v1/emails", p.base_url()))
                .header("Idempotency-Key", "k1")
                .body(r#"{"a":1}"#)
                .send()
                .await
        })
    };
    while p.record().requests.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(p.record().outcomes(), [&Outcome::SentSlow { id: EmailId(1) }]);
    tokio::time::timeout(Duration::from_secs(5), p.shutdown()).await.expect("shutdown does not wait for the hold");
    let cut = tokio::time::timeout(Duration::from_secs(5), held).await.expect("the held request ends").unwrap();
    assert!(cut.is_err(), "no answer after shutdown: {cut:?}");
    assert!(TcpStream::connect(p.addr()).await.is_err(), "nothing listens after shutdown");
    // The email went out: the hold's end (here, the cut) confirms it.
    assert_eq!(tally(&p, Fault::Slow), (1, 1));
    assert_eq!(nemesis.seen_confirmed(), [Fault::Slow]);
    assert_eq!(p.record().emails_sent().len(), 1, "the record outlives the server");
}

/// A repeated key is compared by fingerprint: equal JSON, whatever its key
/// order, matches; any change of a value, a type or an order within an
/// array does not.
#[test]
fn a_bodys_fingerprint_ignores_key_order_and_nothing_else() {
    let f = |s: &str| fingerprint(&serde_json::from_str(s).unwrap());
    assert_eq!(
        f(r#"{"a": 1, "b": [1, 2], "c": {"x": null, "y": true}}"#),
        f(r#"{"c": {"y": true, "x": null}, "b": [1,2], "a": 1}"#)
    );
    let base = f(r#"{"a": 1, "b": [1, 2]}"#);
    for other in [
        r#"{"a": 1, "b": [2, 1]}"#,
        r#"{"a": "1", "b": [1, 2]}"#,
        r#"{"a": 1, "b": [1, 2], "c": 0}"#,
        r#"{"b": [1, 2]}"#,
        r#"{"a": 2, "b": [1, 2]}"#,
    ] {
        assert_ne!(f(other), base, "{other}");
    }
}
