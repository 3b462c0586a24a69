//! Reads the whole topic through the broker's checked read
//! ([`crate::broker::read_checked`]): every message, no group, no commits,
//! the read checked by the reader and again against another source. A
//! short (or long) read is an error, so the run is incomplete, never passed
//! or failed on a partial topic.

use crate::broker::{Delivery, Position, SharedBroker, Topic};
use crate::domain::events::{self, EventKind};
use crate::error::{Error, Result};
use std::time::Duration;
use uuid::Uuid;

/// One message on the topic as read, before the ledger compacts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    pub position: Position,
    /// The producer's event id from the header; None when missing or unreadable.
    pub event_id: Option<Uuid>,
    /// The payment id (the key); None when unreadable.
    pub payment_id: Option<Uuid>,
    /// None for a message that does not decode (poison).
    pub kind: Option<EventKind>,
    /// Of its raw key, type header and payload ([`events::fingerprint`]).
    pub fingerprint: u32,
}

impl TopicRecord {
    /// The compact record of a message as received.
    pub fn of(m: &Delivery<'_>) -> Self {
        let uuid = |v: Option<&[u8]>| v.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let kind = events::decode(m.event_id, m.event_type, m.payload).ok().map(|d| d.kind);
        let fingerprint = events::fingerprint(
            m.key.unwrap_or_default(),
            m.event_type.unwrap_or_default(),
            m.payload.unwrap_or_default(),
        );
        Self { position: m.position, event_id: uuid(m.event_id), payment_id: uuid(m.key), kind, fingerprint }
    }
}

/// One message as read: its compact record, and its raw key and event
/// id, for the core's books, which keep keys of any form.
pub struct Read {
    pub record: TopicRecord,
    pub key: Vec<u8>,
    pub id: Option<Vec<u8>>,
}

/// Messages read and not yet taken, at most.
const MESSAGES_IN_FLIGHT: usize = 4096;

/// The one topic read every checker takes its messages from: each message
/// in turn to `on`, as read. Gives up with an error, never hangs, if the
/// topic cannot be read to its end within `limit`.
///
/// The read runs on a blocking thread and its messages reach `on` here as
/// they come: `on` may borrow what the checkers hold, and a bounded
/// channel keeps no more than a few thousand messages in between.
pub async fn stream(broker: SharedBroker, topic: Topic, limit: Duration, mut on: impl FnMut(Read)) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Read>(MESSAGES_IN_FLIGHT);
    let reader = tokio::task::spawn_blocking(move || {
        crate::broker::read_checked(&*broker, &topic, limit, &mut |m| {
            let read = Read {
                record: TopicRecord::of(&m),
                key: m.key.unwrap_or_default().to_vec(),
                id: m.event_id.map(<[u8]>::to_vec),
            };
            // Refused only once the receiver is gone: the verification was
            // dropped, and nobody wants the rest.
            let _ = tx.blocking_send(read);
        })
    });
    while let Some(m) = rx.recv().await {
        on(m);
    }
    reader.await.map_err(|e| Error::Internal(e.to_string()))?
}
