//! The reads a declared system's verification streams into its books.

use super::Books;
use super::Found;
use crate::broker::{SharedBroker, Topic};
use crate::domain::events::fingerprint;
use crate::error::{Error, Result};
use crate::store::declared as rows;
use crate::store::Store;
use std::time::Duration;

/// Reads the outbox log, the leftovers, the whole topic, every declared
/// effect and check into `books` (which hold the declaration and the
/// record of intent), and verifies them.
pub async fn verify(
    store: &Store,
    broker: SharedBroker,
    topic: Topic,
    mut books: Books<'_>,
    provider: Option<&crate::provider::Record>,
) -> Result<Found> {
    let sys = books.sys;
    rows::outbox_log(store, &sys.outbox, |e| books.add_event(e)).await?;
    rows::leftovers(store, &sys.outbox, |id| books.add_leftover(id)).await?;
    // The topic is read on a blocking thread, and its messages stream into
    // the books here as they come: the books borrow the declaration and the
    // record, the read needs an owned sink, and a bounded channel keeps no
    // more than a few thousand messages in between.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Msg>(MESSAGES_IN_FLIGHT);
    let reader = tokio::task::spawn_blocking(move || {
        crate::broker::read_checked(&*broker, &topic, TOPIC_READ, &mut |m| {
            // Kept compact: the value only as its fingerprint.
            let key = m.key.unwrap_or_default();
            let msg = Msg {
                at: m.position,
                key: key.to_vec(),
                id: m.event_id.map(<[u8]>::to_vec),
                fp: fingerprint(key, m.event_type.unwrap_or_default(), m.payload.unwrap_or_default()),
            };
            // Refused only once the receiver is gone: the verification was
            // dropped, and nobody wants the rest.
            let _ = tx.blocking_send(msg);
        })
    });
    while let Some(m) = rx.recv().await {
        books.add_message(m.at, &m.key, m.id.as_deref(), m.fp);
    }
    reader.await.map_err(|e| Error::Internal(e.to_string()))??;
    for (n, e) in sys.effects.iter().enumerate().filter(|(_, e)| e.provider.is_none()) {
        rows::effect_rows(store, e, |r| books.add_effect_row(n, r)).await?;
    }
    if sys.uses_provider() {
        // No record (no provider ran) reads as one with no request.
        books.add_provider_record(provider.unwrap_or(&crate::provider::Record::default()));
    }
    for c in &sys.checks {
        let (n, examples) = rows::check_rows(store, c).await?;
        books.add_check(&c.name, n, examples);
    }
    Ok(books.finish())
}

/// How long reading the whole topic may take.
const TOPIC_READ: Duration = Duration::from_secs(120);

/// Messages read and not yet in the books, at most.
const MESSAGES_IN_FLIGHT: usize = 4096;

/// A message on its way from the read to the books.
struct Msg {
    at: crate::broker::Position,
    key: Vec<u8>,
    id: Option<Vec<u8>>,
    fp: u32,
}
