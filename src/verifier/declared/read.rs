//! The reads a declared system's verification streams into its books.

use super::Books;
use super::Found;
use crate::broker::{SharedBroker, Topic};
use crate::error::Result;
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
    crate::verifier::topic::stream(broker, topic, TOPIC_READ, |m| {
        books.add_message(m.record.position, &m.key, m.id.as_deref(), m.record.fingerprint)
    })
    .await?;
    effects_and_checks(store, &mut books).await?;
    if sys.uses_provider() {
        // No record (no provider ran) reads as one with no request.
        books.add_provider_record(provider.unwrap_or(&crate::provider::Record::default()));
    }
    Ok(books.finish())
}

/// Each effect's query (the provider's record apart) and each check, run
/// on the store into `books`: after the outbox is in them, so that the
/// books hold every event the rows name. The payments run's too
/// (`verifier::compose`).
pub async fn effects_and_checks(store: &Store, books: &mut Books<'_>) -> Result<()> {
    let sys = books.sys;
    for (n, e) in sys.effects.iter().enumerate().filter(|(_, e)| e.provider.is_none()) {
        rows::effect_rows(store, e, |r| books.add_effect_row(n, r)).await?;
    }
    for c in &sys.checks {
        let (n, examples) = rows::check_rows(store, c).await?;
        books.add_check(&c.name, n, examples);
    }
    Ok(())
}

/// How long reading the whole topic may take.
const TOPIC_READ: Duration = Duration::from_secs(120);
