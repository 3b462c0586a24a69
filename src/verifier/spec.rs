//! The specification the verifier judges every run against, held here and
//! nowhere else: the system under test (ours or the user's) never supplies
//! it. The exactly-once effects themselves are the checks of
//! [`super::reconcile`]; this is the part they share, which handlers each
//! event type must reach: an `authorized` event moves the payment's status
//! in the read model, a `captured` one does that and sends one receipt and
//! one loyalty credit.

use crate::domain::events::EventKind;
use crate::domain::handlers::Handler;

/// The handlers an event type must reach, each with its inbox claim.
pub fn handlers_fed_by(kind: EventKind) -> &'static [Handler] {
    match kind {
        EventKind::Authorized => &[Handler::Projection],
        EventKind::Captured => &[Handler::Projection, Handler::Receipts, Handler::Loyalty],
    }
}
