//! The workload of a declared system: `[system.operation]` as HTTP
//! requests to the user's service, each with a key `chaos` generates and
//! values drawn from the seed, and each recorded with how it ended. That
//! record of intent is what the verifier judges the system against.

use crate::context::Stats;
use crate::domain::operations::{Operation, Outcome};
use crate::faults::FaultInjector;
use crate::scenario::{OperationDecl, ValueGen};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a request that finds the service down (connection refused)
/// keeps being tried: a killed service is back within a second or two.
const DOWN_FOR: Duration = Duration::from_secs(30);
/// The pause between two tries of a request that found the service down.
const DOWN_RETRY: Duration = Duration::from_millis(100);

/// Every operation's key and values, drawn from the seed before any is
/// sent, so that a replay asks for the same ones.
pub fn plan(op: &OperationDecl, seed: u64) -> Vec<(Uuid, Vec<serde_json::Value>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6f70_6572);
    (0..op.count)
        .map(|_| {
            let key = uuid::Builder::from_random_bytes(rng.gen()).into_uuid();
            let values = op
                .values
                .iter()
                .map(|(_, g)| match g {
                    ValueGen::Range(lo, hi) => serde_json::Value::from(rng.gen_range(*lo..=*hi)),
                    ValueGen::OneOf(list) => list[rng.gen_range(0..list.len())].clone(),
                })
                .collect();
            (key, values)
        })
        .collect()
}

/// A template with its placeholders filled: a string that is exactly one
/// placeholder becomes the value with its type; one inside a longer string
/// is replaced as text.
pub fn fill(
    template: &serde_json::Value,
    op: &OperationDecl,
    key: &Uuid,
    values: &[serde_json::Value],
) -> serde_json::Value {
    use serde_json::Value;
    let lookup = |name: &str| -> Option<Value> {
        match name {
            "key" => Some(Value::String(key.to_string())),
            _ => op.value_index(name).map(|i| values[i].clone()),
        }
    };
    match template {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
                if let Some(v) = lookup(name) {
                    return v;
                }
            }
            Value::String(fill_text(s, op, key, values))
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| fill(x, op, key, values)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), fill(v, op, key, values))).collect()),
        other => other.clone(),
    }
}

/// A text with each `{name}` replaced by its value as text.
pub fn fill_text(s: &str, op: &OperationDecl, key: &Uuid, values: &[serde_json::Value]) -> String {
    let mut out = s.to_string();
    out = out.replace("{key}", &key.to_string());
    for (i, (name, _)) in op.values.iter().enumerate() {
        let v = match &values[i] {
            serde_json::Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        out = out.replace(&format!("{{{name}}}"), &v);
    }
    out
}

/// How one answer (or its absence) ends an operation.
pub fn outcome_of(status: Option<u16>) -> Outcome {
    match status {
        Some(s) if (200..300).contains(&s) => Outcome::Acknowledged,
        Some(s) if (400..500).contains(&s) => Outcome::Refused,
        // A 5xx may come after a commit; no answer at all may too.
        _ => Outcome::Ambiguous,
    }
}

/// The workload's record of intent, in the plan's order: each operation
/// as it was sent (ambiguous until answered), then as it ended. Kept
/// outside the workload, so that a run cut short keeps what it sent.
pub type Record = Arc<Mutex<Vec<Option<Operation>>>>;

/// Takes what the record holds: the operations sent, in the plan's order.
pub fn take(record: &Record) -> Vec<Operation> {
    std::mem::take(&mut *record.lock().unwrap_or_else(|p| p.into_inner())).into_iter().flatten().collect()
}

/// Sends every operation, `concurrency` at a time, over the service's
/// slots, into `record`. Dropped (the run cut short), its senders stop.
pub async fn run(
    op: Arc<OperationDecl>,
    spread: Option<std::time::Duration>,
    seed: u64,
    ports: Vec<u16>,
    faults: Arc<FaultInjector>,
    stats: Arc<Stats>,
    record: Record,
) -> crate::error::Result<()> {
    let planned = Arc::new(plan(&op, seed));
    let client = reqwest::Client::builder()
        .timeout(op.timeout)
        .pool_max_idle_per_host(op.concurrency)
        .build()
        .map_err(|e| crate::Error::Internal(format!("making the workload's HTTP client: {e}")))?;
    let next = Arc::new(AtomicU64::new(0));
    *record.lock().unwrap_or_else(|p| p.into_inner()) = vec![None; planned.len()];
    let clock = Clock { origin_epoch_ms: faults.started_epoch_ms() };
    let pace = spread.map(|s| crate::pipeline::workload::Pace::new(s, op.count));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..op.concurrency {
        let (op, planned, client, next, record, ports, stats) =
            (op.clone(), planned.clone(), client.clone(), next.clone(), record.clone(), ports.clone(), stats.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some((key, values)) = planned.get(i) else { break };
                if let Some(p) = pace {
                    tokio::time::sleep(p.turn_in(i as u64)).await;
                }
                let port = ports[i % ports.len()];
                let url = format!(
                    "http://127.0.0.1:{port}{}",
                    fill_text(op.path.as_deref().unwrap_or("/"), &op, key, values)
                );
                let body = op.body.as_ref().map(|b| fill(b, &op, key, values));
                let sent_ms = clock.now();
                // Sent and not yet answered: ambiguous, if the run ends now.
                let (outcome, status, done_ms) = (Outcome::Ambiguous, 0, sent_ms);
                let sent = Operation { key: *key, values: values.clone(), outcome, status, sent_ms, done_ms };
                record.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(sent);
                let status = send(&client, &op.method, &url, body.as_ref()).await;
                let outcome = match status {
                    Sent::Answered(s) => outcome_of(Some(s)),
                    Sent::Unanswered => Outcome::Ambiguous,
                    Sent::NeverReached => Outcome::Refused,
                };
                if outcome == Outcome::Acknowledged {
                    // The service said it wrote the operation: the write
                    // stage, as a payment written is the pipeline's.
                    stats.mark(&stats.first_write_ms, &stats.last_write_ms);
                    Stats::add(&stats.payments_written, 1);
                }
                let status = if let Sent::Answered(s) = status { s } else { 0 };
                let done =
                    Operation { key: *key, values: values.clone(), outcome, status, sent_ms, done_ms: clock.now() };
                record.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(done);
            }
        });
    }
    while let Some(w) = workers.join_next().await {
        w.map_err(|e| crate::Error::Internal(format!("a workload task failed: {e}")))?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Clock {
    origin_epoch_ms: i64,
}

impl Clock {
    /// Milliseconds on the fault log's clock.
    fn now(&self) -> u64 {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        (now - self.origin_epoch_ms).max(0) as u64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Answered(u16),
    /// A timeout, or a connection that broke after the request went out.
    Unanswered,
    /// The service refused every connection for [`DOWN_FOR`].
    NeverReached,
}

async fn send(client: &reqwest::Client, method: &str, url: &str, body: Option<&serde_json::Value>) -> Sent {
    let started = Instant::now();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
    loop {
        let mut req = client.request(method.clone(), url);
        if let Some(b) = body {
            req = req.json(b);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                // The body is read so that the connection can be reused.
                let _ = resp.bytes().await;
                return Sent::Answered(status);
            }
            // Nothing was sent: the service is down (killed, restarting).
            Err(e) if e.is_connect() && started.elapsed() < DOWN_FOR => tokio::time::sleep(DOWN_RETRY).await,
            Err(e) if e.is_connect() => return Sent::NeverReached,
            Err(_) => return Sent::Unanswered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl() -> OperationDecl {
        OperationDecl {
            count: 50,
            concurrency: 2,
            method: "POST".into(),
            path: Some("/orders/{key}".into()),
            body: Some(serde_json::json!({"id": "{key}", "sku": "{sku}", "qty": "{qty}", "note": "{qty} of {sku}"})),
            timeout: Duration::from_secs(1),
            events: vec!["OrderPlaced".into()],
            values: vec![
                ("qty".into(), ValueGen::Range(1, 3)),
                ("sku".into(), ValueGen::OneOf(vec!["apple".into(), "pear".into()])),
            ],
        }
    }

    #[test]
    fn the_plan_is_the_seeds_and_keys_are_distinct() {
        let d = decl();
        let a = plan(&d, 7);
        assert_eq!(a, plan(&d, 7));
        assert_ne!(a, plan(&d, 8));
        let keys: std::collections::HashSet<_> = a.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), 50);
        assert!(a.iter().all(|(_, v)| (1..=3).contains(&v[0].as_i64().unwrap())));
        assert!(a.iter().any(|(_, v)| v[1] == "apple") && a.iter().any(|(_, v)| v[1] == "pear"));
    }

    #[test]
    fn placeholders_keep_their_type_alone_and_become_text_inside_a_string() {
        let d = decl();
        let key = Uuid::from_u128(1);
        let values = vec![serde_json::json!(2), serde_json::json!("pear")];
        let body = fill(d.body.as_ref().unwrap(), &d, &key, &values);
        assert_eq!(body["qty"], serde_json::json!(2));
        assert_eq!(body["sku"], "pear");
        assert_eq!(body["id"], key.to_string());
        assert_eq!(body["note"], "2 of pear");
        assert_eq!(fill_text(d.path.as_deref().unwrap(), &d, &key, &values), format!("/orders/{key}"));
    }

    #[test]
    fn answers_decide_the_outcome() {
        assert_eq!(outcome_of(Some(201)), Outcome::Acknowledged);
        assert_eq!(outcome_of(Some(409)), Outcome::Refused);
        assert_eq!(outcome_of(Some(503)), Outcome::Ambiguous);
        assert_eq!(outcome_of(None), Outcome::Ambiguous);
    }
}
