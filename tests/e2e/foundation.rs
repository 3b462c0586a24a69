//! Both real services, no mocks: an outbox row written in PostgreSQL is
//! published to a fresh topic, consumed in a consumer group with a manual
//! offset commit, claimed in the inbox with its effect in one transaction;
//! then the rows and the committed offset are checked.

use crate::common::*;
use chaos::broker::{kafka::Kafka, Broker, ConsumerSpec};
use chaos::domain::events::Envelope;
use chaos::scenario::{InboxMode, ProjectionMode};
use chaos::store::{postgres::PgStore, BatchFaults, Modes, NewPayment, Store};
use sqlx::Row;
use std::time::Duration;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_to_kafka_to_inbox_round_trip() {
    let names = chaos::domain::names::RunNames::new();
    let topic = format!("{}.foundation", names.topic);
    let store = Store::Postgres(PgStore::open(&database_url(), &names.schema, 4).await.expect("PostgreSQL"));
    let brokers = chaos::broker::kafka::ping(&brokers(), Duration::from_secs(8)).await.expect("Kafka");
    eprintln!("talking to PostgreSQL at {} and Kafka brokers {brokers:?}", store.endpoint());
    let kafka = Kafka::connect(&crate::common::brokers()).await.expect("Kafka");
    kafka.create_topic(&chaos::broker::Topic::new(topic.as_str(), 1)).await.unwrap();

    // 1. The outbox row, written with its payment in one transaction.
    let p = NewPayment { id: Uuid::new_v4(), account_id: 7, amount_cents: 1234 };
    store.authorize(std::slice::from_ref(&p), true).await.unwrap();

    // 2. A relay claims it, publishes it, waits for the ack, marks it.
    let mut conn = store.relay_connection().await.unwrap();
    let rows = conn.claim(10, 0).await.unwrap();
    assert_eq!(rows.len(), 1);
    let producer = kafka.producer().unwrap();
    let envelope = [Envelope::new(rows[0].id, rows[0].aggregate_id, &rows[0].event_type, &rows[0].payload)];
    producer.publish(&topic, &envelope, true).await.expect("the broker acks");
    assert_eq!(kafka.watermarks(&chaos::broker::Topic::new(topic.as_str(), 1)).unwrap(), vec![(0, 1)]);
    conn.mark_published(&[rows[0].id]).await.unwrap();
    assert_eq!(store.unpublished().await.unwrap(), 0);

    // 3. A consumer group member receives it, and the inbox transaction runs.
    let group = format!("{}.foundation", names.group);
    let spec = ConsumerSpec {
        group: group.clone(),
        topic: topic.clone(),
        member: "foundation".into(),
        session: Duration::from_secs(6),
        on_assign: std::sync::Arc::new(|_| {}),
    };
    let consumer = kafka.consumer(spec).unwrap();
    consumer.join().unwrap();
    let mut got = Vec::new();
    let mut each = |d: chaos::broker::Delivery<'_>| got.push(chaos::incoming(&d));
    let n = consumer.poll_batch(10, Duration::from_secs(30), Duration::from_millis(3), &mut each).await;
    assert_eq!(n, 1, "a message within 30 s");
    let incoming = got.remove(0);
    let incoming_at = incoming.position;
    let decoded = incoming.decoded.clone().expect("a well-formed event");
    assert_eq!(decoded.event_id, rows[0].id);
    let modes =
        Modes { inbox: InboxMode::On, projection: ProjectionMode::StateGuard, email: chaos::scenario::EmailMode::Off };
    let injector = chaos::faults::FaultInjector::new(1, &chaos::faults::FaultRates::none());
    let apply = chaos::apply_batch;
    let first =
        apply(&store, std::slice::from_ref(&incoming), modes, BatchFaults::default(), &injector, None, "notifier-1")
            .await
            .unwrap();
    assert_eq!(first.applied, 1);
    // The same message again is absorbed by the inbox.
    let again = apply(&store, &[incoming], modes, BatchFaults::default(), &injector, None, "notifier-1").await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 1));

    // 4. Commit the offset by hand and read it back from the broker.
    consumer.commit(&[incoming_at.next()], true).unwrap();
    assert_eq!(
        kafka.backlog(&group, &chaos::broker::Topic::new(topic.as_str(), 1)).await.unwrap(),
        0,
        "the group's committed offset is past the message"
    );

    // 5. The rows: one inbox claim for the projection handler, its effect, no receipt.
    let mut ledger = chaos::verifier::Ledger::new();
    store.ground_truth(&mut ledger).await.unwrap();
    let counts = ledger.reconcile(&chaos::verifier::Spec { payments: 1, outbox: true }).counts;
    assert_eq!(counts.payments, 1);
    assert_eq!(counts.inbox_rows_by_handler.get("projection"), Some(&1));
    assert_eq!(counts.projection_captured, 0, "authorized, not captured");
    assert_eq!(counts.receipts, 0);
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&database_url()).await.unwrap();
    let row = sqlx::query(&format!("SELECT status FROM \"{}\".payment_projection WHERE payment_id = $1", names.schema))
        .bind(p.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row.get::<String, _>(0), "authorized");

    drop((consumer, producer));
    kafka.close().await;
    store.close().await;
    sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", names.schema)).execute(&pool).await.unwrap();
}
