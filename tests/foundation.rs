//! Both real services, no mocks: an outbox row written in PostgreSQL is
//! published to a fresh topic, consumed in a consumer group with a manual
//! offset commit, claimed in the inbox with its effect in one transaction;
//! then the rows and the committed offset are checked.

mod common;
use chaos::scenario::{InboxMode, ProjectionMode};
use chaos::store::{postgres::PgStore, BatchFaults, Modes, NewPayment, Store};
use common::*;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Message;
use rdkafka::{Offset, TopicPartitionList};
use sqlx::Row;
use std::time::Duration;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_to_kafka_to_inbox_round_trip() {
    let names = chaos::infra::RunNames::new();
    let topic = format!("{}.foundation", names.topic);
    let store = Store::Postgres(PgStore::open(&database_url(), &names.schema, 4).await.expect("PostgreSQL"));
    let brokers = chaos::infra::kafka_ping(&brokers(), Duration::from_secs(8)).await.expect("Kafka");
    eprintln!("talking to PostgreSQL at {} and Kafka brokers {brokers:?}", store.endpoint());
    chaos::infra::create_topic(&common::brokers(), &topic, 1).await.unwrap();

    // 1. The outbox row, written with its payment in one transaction.
    let p = NewPayment { id: Uuid::new_v4(), account_id: 7, amount_cents: 1234 };
    store.authorize(std::slice::from_ref(&p), true).await.unwrap();

    // 2. A relay claims it, publishes it, waits for the ack, marks it.
    let mut conn = store.relay_connection().await.unwrap();
    let rows = conn.claim(10).await.unwrap();
    assert_eq!(rows.len(), 1);
    let producer = chaos::relay::producer(&common::brokers()).unwrap();
    let id = rows[0].id.to_string();
    let key = rows[0].aggregate_id.to_string();
    let headers = rdkafka::message::OwnedHeaders::new()
        .insert(rdkafka::message::Header { key: "event_id", value: Some(id.as_bytes()) })
        .insert(rdkafka::message::Header { key: "event_type", value: Some(rows[0].event_type.as_bytes()) });
    let delivery = producer
        .send(
            rdkafka::producer::FutureRecord::to(&topic).key(key.as_bytes()).payload(&rows[0].payload).headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("the broker acks");
    assert_eq!(delivery.offset, 0);
    conn.mark_published(&[rows[0].id]).await.unwrap();
    assert_eq!(store.unpublished().await.unwrap(), 0);

    // 3. A consumer group member receives it, and the inbox transaction runs.
    let group = format!("{}.foundation", names.group);
    let consumer: StreamConsumer = chaos::infra::kafka_config(&common::brokers())
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
        .await
        .expect("a message within 30 s")
        .unwrap()
        .detach();
    let incoming = chaos::notifier::incoming(&msg);
    let decoded = incoming.decoded.clone().expect("a well-formed event");
    assert_eq!(decoded.event_id, rows[0].id);
    let modes = Modes { inbox: InboxMode::On, projection: ProjectionMode::StateGuard };
    let first = store.apply_batch(&[incoming.clone()], modes, BatchFaults::default()).await.unwrap();
    assert_eq!(first.applied, 1);
    // The same message again is absorbed by the inbox.
    let again = store.apply_batch(&[incoming], modes, BatchFaults::default()).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 1));

    // 4. Commit the offset by hand and read it back from the broker.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(msg.offset() + 1)).unwrap();
    tokio::task::block_in_place(|| consumer.commit(&tpl, CommitMode::Sync)).unwrap();
    let committed = tokio::task::block_in_place(|| consumer.committed(Duration::from_secs(10))).unwrap();
    assert_eq!(committed.find_partition(&topic, 0).unwrap().offset(), Offset::Offset(1));
    // Partition lists can hold references into the client; release them
    // before the consumer, or its destruction waits for them forever.
    drop((committed, tpl));

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

    tokio::task::spawn_blocking(move || {
        drop(consumer);
        drop(producer);
    })
    .await
    .unwrap();
    store.close().await;
    sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", names.schema)).execute(&pool).await.unwrap();
}
