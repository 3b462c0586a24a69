//! The message envelope. The relay builds it from an outbox row, the notifier
//! and the verifier decode it with the same function, so "malformed" means the
//! same thing to both.
//!
//! On the wire: key = payment id; header `event_id` = the outbox row id (the
//! producer-assigned id the inbox deduplicates on); header `event_type`;
//! value = the outbox payload (JSON).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A fresh id, time-ordered (the layout of a version 7 uuid: 48 bits of
/// milliseconds, then random bits), as payment services mint them. Ids are
/// still unique and still made by their producer; being ordered, the
/// payment and outbox primary keys, the inbox key, the projection and the
/// receipts grow at their right edge, so a batch dirties a few index pages
/// instead of one random page per row.
pub fn time_ordered_id() -> Uuid {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    // A thread-local generator: `Uuid::new_v4` asks the kernel for every id,
    // one system call per payment and per event.
    let tail: [u8; 10] = rand::random();
    uuid::Builder::from_unix_timestamp_millis(ms, &tail).into_uuid()
}

pub const AUTHORIZED: &str = "payment.authorized";
pub const CAPTURED: &str = "payment.captured";
pub const HEADER_EVENT_ID: &str = "event_id";
pub const HEADER_EVENT_TYPE: &str = "event_type";

/// A fingerprint of what a message says: its key, its type and its payload,
/// each length-prefixed (so no two splits of the same bytes agree). Every
/// verifier takes it of each outbox row and of each message on the topic,
/// and a message whose fingerprint differs from its row's was changed on
/// the way. A JSON payload counts as its canonical form
/// ([`crate::domain::canonical`]): a relay that re-serialises it with other
/// key order or spacing says the same thing and passes; a changed value,
/// or a number in another form (`100.0` for `100`), is a `message
/// mismatch`.
/// Any other payload counts as its bytes. FNV-1a, folded to 32 bits: a
/// corrupted message slips through with odds of one in four billion, and
/// a million payments keep four bytes per event.
pub fn fingerprint(key: &[u8], event_type: &[u8], payload: &[u8]) -> u32 {
    let canonical = crate::domain::canonical::of_bytes(payload).map(u64::to_le_bytes);
    let payload: &[u8] = canonical.as_ref().map_or(payload, |c| c.as_slice());
    // The form's tag, so a non-JSON payload never equals a JSON one's digest.
    let form: &[u8] = if canonical.is_some() { b"j" } else { b"b" };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [key, event_type, form, payload] {
        for b in (part.len() as u64).to_le_bytes().iter().chain(part) {
            h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    (h ^ (h >> 32)) as u32
}

/// What happened to a payment. Ordered so that a state-based projection can
/// refuse to go backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Authorized,
    Captured,
}

impl EventKind {
    pub fn from_type(t: &str) -> Option<Self> {
        match t {
            AUTHORIZED => Some(EventKind::Authorized),
            CAPTURED => Some(EventKind::Captured),
            _ => None,
        }
    }

    pub fn event_type(self) -> &'static str {
        match self {
            EventKind::Authorized => AUTHORIZED,
            EventKind::Captured => CAPTURED,
        }
    }

    /// The status the projection shows after this event.
    pub fn status(self) -> &'static str {
        match self {
            EventKind::Authorized => "authorized",
            EventKind::Captured => "captured",
        }
    }
}

/// The payload of a payment event, as stored in `outbox.payload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentEvent {
    pub payment_id: Uuid,
    pub account_id: i32,
    pub amount_cents: i64,
}

/// A receipt email's body, as the reference notifier asks the provider to
/// send it. A struct, not a `serde_json::Value`: serialized straight onto
/// the wire, with no tree built and dropped per email.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReceiptEmail {
    pub to: String,
    pub subject: &'static str,
    pub payment_id: Uuid,
    pub message_id: Uuid,
    pub amount_cents: i64,
}

impl ReceiptEmail {
    /// The receipt of `payment`'s event, delivered as message `message`.
    pub fn of(payment: Uuid, message: Uuid, event: &PaymentEvent) -> ReceiptEmail {
        ReceiptEmail {
            to: format!("account-{}@customers.example", event.account_id),
            subject: "Your receipt",
            payment_id: payment,
            message_id: message,
            amount_cents: event.amount_cents,
        }
    }
}

/// The payload the `workload.poison` fault writes instead: valid JSON, but not
/// a payment event, exactly what a buggy producer emits.
pub fn poison_payload() -> serde_json::Value {
    serde_json::json!({ "poison": true, "amount_cents": "twelve" })
}

/// A message as the relay and the dual write send it: the envelope built
/// from an event, in the one place that knows its layout. A broker adapter
/// puts `key` in the message key, `event_id` and `event_type` in the
/// headers named [`HEADER_EVENT_ID`] and [`HEADER_EVENT_TYPE`], and
/// `payload` in the value.
#[derive(Debug, Clone)]
pub struct Envelope<'a> {
    pub key: String,
    pub event_id: String,
    pub event_type: &'a str,
    pub payload: &'a [u8],
    /// A lane chosen by hand instead of by the key (`relay.produce_error`
    /// addresses one the topic lacks); None for the broker's choice by key.
    pub lane: Option<i32>,
}

impl<'a> Envelope<'a> {
    /// The envelope of event `event_id` of payment `payment_id`.
    pub fn new(event_id: Uuid, payment_id: Uuid, event_type: &'a str, payload: &'a [u8]) -> Self {
        Self { key: payment_id.to_string(), event_id: event_id.to_string(), event_type, payload, lane: None }
    }
}

/// A decoded, well-formed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub event_id: Uuid,
    pub kind: EventKind,
    pub body: PaymentEvent,
    /// The ordering lane it was read from (0 until the notifier sets it):
    /// the loyalty counter's stripe.
    pub lane: i32,
}

/// Decodes an event from its id, type and payload bytes. The error says what
/// was wrong; it goes into the dead-letter table verbatim.
pub fn decode(event_id: Option<&[u8]>, event_type: Option<&[u8]>, payload: Option<&[u8]>) -> Result<Decoded, String> {
    let id = event_id.ok_or("missing header event_id")?;
    let id = std::str::from_utf8(id).map_err(|_| "header event_id is not UTF-8")?;
    let event_id = Uuid::parse_str(id).map_err(|e| format!("header event_id {id:?} is not a uuid: {e}"))?;
    let t = event_type.ok_or("missing header event_type")?;
    let t = std::str::from_utf8(t).map_err(|_| "header event_type is not UTF-8")?;
    let kind = EventKind::from_type(t).ok_or_else(|| format!("unknown event_type {t:?}"))?;
    let payload = payload.ok_or("empty payload")?;
    let body: PaymentEvent =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not a payment event: {e}"))?;
    Ok(Decoded { event_id, kind, body, lane: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_ordered_ids_are_unique_and_sort_by_time() {
        let first = time_ordered_id();
        let mut ids: Vec<Uuid> = (0..10_000).map(|_| time_ordered_id()).collect();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let later = time_ordered_id();
        assert!(ids.iter().all(|i| *i > Uuid::nil()));
        assert!(later > first, "a later millisecond sorts after an earlier one");
        assert!(ids.iter().all(|i| i.as_bytes()[..6] >= first.as_bytes()[..6]));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10_000, "no two ids alike");
        assert_eq!(later.get_version_num(), 7);
    }

    #[test]
    fn a_fingerprint_sees_a_changed_value_but_not_a_reserialised_one() {
        let f = |k: &str, t: &str, v: &str| fingerprint(k.as_bytes(), t.as_bytes(), v.as_bytes());
        let row = f("k", CAPTURED, r#"{"amount_cents": 120, "account_id": 3}"#);
        assert_eq!(row, f("k", CAPTURED, r#"{"account_id":3,"amount_cents":120}"#), "key order and spacing");
        assert_ne!(row, f("k", CAPTURED, r#"{"account_id":3,"amount_cents":121}"#), "a changed value");
        assert_ne!(row, f("k2", CAPTURED, r#"{"account_id":3,"amount_cents":120}"#), "another key");
        assert_ne!(row, f("k", AUTHORIZED, r#"{"account_id":3,"amount_cents":120}"#), "another type");
        // Not JSON: its bytes, so any change counts, spacing too.
        assert_ne!(f("k", CAPTURED, "not json"), f("k", CAPTURED, "not  json"));
        assert_eq!(f("k", CAPTURED, "not json"), f("k", CAPTURED, "not json"));
        // No two splits of the same bytes agree.
        assert_ne!(f("ab", "c", "x"), f("a", "bc", "x"));
    }

    #[test]
    fn roundtrip_and_poison() {
        let id = Uuid::new_v4();
        let body = PaymentEvent { payment_id: Uuid::new_v4(), account_id: 3, amount_cents: 120 };
        let bytes = serde_json::to_vec(&body).unwrap();
        let d = decode(Some(id.to_string().as_bytes()), Some(CAPTURED.as_bytes()), Some(&bytes)).unwrap();
        assert_eq!(d.kind, EventKind::Captured);
        assert_eq!(d.body, body);
        let poison = serde_json::to_vec(&poison_payload()).unwrap();
        let e = decode(Some(id.to_string().as_bytes()), Some(CAPTURED.as_bytes()), Some(&poison)).unwrap_err();
        assert!(e.starts_with("payload is not a payment event"), "{e}");
        assert!(decode(None, Some(CAPTURED.as_bytes()), Some(&bytes)).is_err());
    }
}
