//! The two database backends agree: one ground truth, written through
//! PostgreSQL and through SQLite by the same calls, gives the same figures
//! (what each notifier batch reports, and everything the verifier counts).

use crate::common::*;
use chaos::domain::events::{decode, EventKind};
use chaos::scenario::{InboxMode, ProjectionMode};
use chaos::store::{postgres::PgStore, sqlite::SqliteStore, BatchFaults, Incoming, Modes, NewPayment, Store};
use chaos::verifier::{Counts, Ledger, Spec};
use uuid::Uuid;

/// Five payments, their events published by a relay, then notifier batches
/// that exercise the projection's guard: in order, out of order across
/// batches, out of order within a batch, and redelivered.
async fn one_ground_truth(store: &Store) -> (Vec<u64>, Counts) {
    let payments: Vec<NewPayment> = (0..5)
        .map(|i| NewPayment {
            id: Uuid::from_u128(0xabc0 + i),
            account_id: (i % 2) as i32 + 1,
            amount_cents: 100 * (i as i64 + 1),
        })
        .collect();
    store.authorize(&payments, true).await.unwrap();
    let captured: Vec<(NewPayment, bool)> = payments.iter().map(|p| (p.clone(), false)).collect();
    store.capture(&captured, true).await.unwrap();
    let mut conn = store.relay_connection().await.unwrap();
    let rows = conn.claim(100, 0).await.unwrap();
    assert_eq!(rows.len(), 10);
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    conn.mark_published(&ids).await.unwrap();

    // The event of payment `i` of `kind`, as a notifier receives it.
    let event = |i: usize, kind: EventKind, offset: i64| -> Incoming {
        let r = rows
            .iter()
            .find(|r| r.aggregate_id == payments[i].id && r.event_type == kind.event_type())
            .expect("the event");
        let id = r.id.to_string();
        Incoming {
            position: chaos::broker::Position::new(0, offset),
            decoded: decode(Some(id.as_bytes()), Some(r.event_type.as_bytes()), Some(&r.payload)),
            raw_event_id: None,
            raw_payload: String::new(),
        }
    };
    use EventKind::{Authorized as A, Captured as C};
    let batches: Vec<Vec<Incoming>> = vec![
        // Payment 0 in order within one batch: nothing is stale.
        vec![event(0, A, 0), event(0, C, 1)],
        // Payment 1 captured first, its authorized in the next batch: stale.
        vec![event(1, C, 2)],
        vec![event(1, A, 3)],
        // Payment 2 out of order within one batch: its authorized is stale.
        vec![event(2, C, 4), event(2, A, 5)],
        // Payments 3 and 4 in order, then the whole batch again.
        vec![event(3, A, 6), event(3, C, 7), event(4, A, 8), event(4, C, 9)],
        vec![event(3, A, 6), event(3, C, 7), event(4, A, 8), event(4, C, 9)],
    ];
    let modes =
        Modes { inbox: InboxMode::On, projection: ProjectionMode::StateGuard, email: chaos::scenario::EmailMode::Off };
    let mut figures = Vec::new();
    let injector = chaos::faults::FaultInjector::new(1, &chaos::faults::FaultRates::none());
    for b in &batches {
        let o =
            chaos::apply_batch(store, b, modes, BatchFaults::default(), &injector, None, "notifier-1").await.unwrap();
        figures.extend([o.applied, o.duplicates, o.stale, o.dead_lettered]);
    }
    let mut ledger = Ledger::new();
    for p in &payments {
        ledger.add_intended(chaos::domain::intent::Intended {
            id: p.id,
            amount_cents: p.amount_cents,
            account_id: p.account_id,
            captured: true,
            poison: false,
        });
    }
    store.ground_truth(&mut ledger).await.unwrap();
    let mut recorder = chaos::verifier::latency::LatencyRecorder::new();
    store.latencies(&mut |ms| recorder.record(ms)).await.unwrap();
    let latency = recorder.finish().expect("latency samples");
    assert_eq!(latency.events, 10, "one sample per event (projection handler)");
    (figures, ledger.reconcile(&Spec { payments: 5, outbox: true }).counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_sqlite_give_the_same_figures() {
    let names = chaos::domain::names::RunNames::new();
    let pg = Store::Postgres(PgStore::open(&database_url(), &names.schema, 4).await.expect("PostgreSQL"));
    let dir = tempfile::tempdir().unwrap();
    let lite = Store::Sqlite(SqliteStore::open(&dir.path().join("backends.sqlite"), 4).await.unwrap());
    let (pg_batches, pg_counts) = one_ground_truth(&pg).await;
    let (lite_batches, lite_counts) = one_ground_truth(&lite).await;
    assert_eq!(pg_batches, lite_batches, "applied, duplicates, stale, dead letters per batch");
    // The stale events by definition: payment 1's and payment 2's authorized.
    let stale: u64 = pg_batches.chunks(4).map(|b| b[2]).sum();
    assert_eq!(stale, 2);
    assert_eq!(pg_counts, lite_counts);
    assert_eq!(pg_counts.projection_captured, 5);
    assert_eq!(pg_counts.loyalty_credits, 5);
    pg.close().await;
    lite.close().await;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&database_url()).await.unwrap();
    sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", names.schema)).execute(&pool).await.unwrap();
}
