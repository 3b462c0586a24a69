//! The verifier's pass over one run: the ground truth read (the database
//! streamed into the ledger, then every message on the topic), the faults
//! the topic confirms, the reconciliation, and the anomalies dated and
//! told as stories. It reads the store, the broker and the faults' history,
//! never the system under test, and writes into nothing of the run's.

use crate::broker::SharedBroker;
use crate::domain::intent::Intended;
use crate::error::Result;
use crate::faults::{FaultHistory, FaultPoint};
use crate::scenario::Scenario;
use crate::store::Store;
use crate::verifier::declared::Books;
use crate::verifier::{attribution, compose, latency::Latency, latency::LatencyRecorder, reconcile, story, topic};
use std::collections::HashMap;
use std::time::Duration;
use tracing::warn;
use uuid::Uuid;

/// The verifier's topic read gets at least this long, and
/// [`TOPIC_READ_PER_PAYMENT`] per payment beyond it (a million payments'
/// 2.2 million messages read in about 10 s here).
const TOPIC_READ_FLOOR: Duration = Duration::from_secs(60);
const TOPIC_READ_PER_PAYMENT: Duration = Duration::from_micros(100);

/// What the verifier's pass found: the reconciliation, the topic's side of
/// the stories, and the firings whose effect the ground truth shows (for
/// the harness to confirm: the verifier never writes into the injector).
pub struct Verified {
    pub reconciliation: reconcile::Reconciliation,
    pub topic_side: TopicSide,
    pub confirmed: Vec<(FaultPoint, u64)>,
    /// What the stories show of the provider's calls, when the run sent
    /// emails.
    pub calls: Option<story::Calls>,
}

/// Reads the ground truth against the workload's record of intent, finds
/// the firings the topic and the dead letters confirm, and judges the run
/// by the core checker and the payments checker composed ([`compose`]).
/// `emails` is the provider's record when the run sends emails: then the
/// emails are checked too; `None` checks none and adds no email invariant.
#[allow(clippy::too_many_arguments)]
pub async fn verify(
    store: &Store,
    broker: &SharedBroker,
    topic_name: &str,
    sc: &Scenario,
    intent: Vec<Intended>,
    faults: &FaultHistory,
    emails: Option<crate::provider::Record>,
) -> Result<Verified> {
    // Its receipt emails are judged when the run sent emails.
    let Some(sys) = sc.payments_declaration(emails.is_some()) else {
        return Err(crate::Error::Internal("the payments pipeline's built-in declaration does not parse".into()));
    };
    let ops = compose::operations(&sys, &intent);
    let books = Books::new(&sys, ops, faults.log.clone(), faults.started_epoch_ms).with_spans(attribution::spans(sc));
    let mut truth = compose::Truth::new(&sys, intent, books);
    store.ground_truth(&mut truth).await?;
    truth.read_declared(store).await?;
    resident("the database is read");
    let calls = truth.provider_record(emails);
    resident("the emails are judged");
    let limit = TOPIC_READ_FLOOR.max(TOPIC_READ_PER_PAYMENT * sc.payments.min(u32::MAX as u64) as u32);
    let topic = sc.topic(topic_name);
    // The read re-checks the count itself; this only sizes the books.
    if let Ok(held) = broker.held(&topic) {
        truth.expect_messages(held.max(0) as usize);
    }
    topic::stream(broker.clone(), topic, limit, |m| truth.add_message(m)).await?;
    resident("the topic is read");
    let spec = reconcile::Spec { payments: sc.payments, outbox: sc.publish == crate::scenario::PublishMode::Outbox };
    let (r, mut ledger) = truth.finish(&spec);
    resident("the checkers have judged");
    let mut confirmed: Vec<(FaultPoint, u64)> = faults
        .awaited_copies
        .iter()
        .filter(|(_, event, copies)| ledger.copies(*event) >= *copies)
        .map(|(point, _, _)| (*point, 1))
        .collect();
    // A poison message's effect is its dead letter.
    confirmed.push((FaultPoint::WorkloadPoison, r.counts.dead_letters_matched));
    // What the stories need of the topic, while the ledger still holds it.
    let subjects: Vec<_> = story::wanted(&r.anomalies).into_iter().map(|(_, _, s)| s).collect();
    let topic_side = if subjects.is_empty() { TopicSide::default() } else { ledger.messages_of(&subjects) };
    Ok(Verified { reconciliation: r, topic_side, confirmed, calls })
}

/// Where the verifier's memory stands after a step: at a million payments
/// the peak is the verifier's, and these say which step makes it.
fn resident(step: &str) {
    crate::context::memory::log(tracing::Level::DEBUG, step);
}

/// For the stories: each subject's payment, and each payment's messages.
pub type TopicSide = (HashMap<Uuid, Uuid>, HashMap<Uuid, Vec<story::TopicMessage>>);

/// Each anomaly example's story ([`story`]): the topic's side from the
/// ledger, the database's dated rows read now. A failed read leaves the
/// report without stories: it never changes a verdict.
pub async fn stories(
    store: &Store,
    anomalies: &[crate::verifier::Anomaly],
    (payment_of, messages): TopicSide,
    faults: &FaultHistory,
) -> Vec<story::Story> {
    let mut payments: Vec<Uuid> = payment_of.values().copied().collect();
    if payments.is_empty() {
        return vec![];
    }
    payments.sort_unstable();
    payments.dedup();
    match store.story(&payments).await {
        Ok(rows) => story::tell(anomalies, &payment_of, &messages, &rows, &faults.deliveries, faults.started_epoch_ms),
        Err(e) => {
            warn!(cause = %e, "reading the anomalies' stories failed");
            vec![]
        }
    }
}

/// Ties each anomaly's examples to their causes ([`attribution`]): by the
/// data the fault log records, matched against the examples' stories, and
/// by their last trace in the database when no data matches. A failed
/// look-up leaves the anomalies undated: it never changes a verdict.
pub async fn attribute(
    store: &Store,
    anomalies: &mut [crate::verifier::Anomaly],
    stories: &[story::Story],
    faults: &FaultHistory,
    sc: &Scenario,
) {
    let ids = attribution::subjects(anomalies);
    if ids.is_empty() {
        return;
    }
    match store.traces(&ids).await {
        Ok(traces) => attribution::attribute(
            anomalies,
            &attribution::Evidence {
                traces: &traces,
                run_started_ms: faults.started_epoch_ms,
                log: &faults.log,
                spans: &attribution::spans(sc),
                stories,
                deliveries: &faults.deliveries,
            },
        ),
        Err(e) => warn!(cause = %e, "dating the anomalies' examples failed"),
    }
}

/// End-to-end latency percentiles, from every event's sample in the store.
pub async fn latency(store: &Store) -> Result<Option<Latency>> {
    let mut recorder = LatencyRecorder::new();
    store.latencies(&mut |ms| recorder.record(ms)).await?;
    Ok(recorder.finish())
}
