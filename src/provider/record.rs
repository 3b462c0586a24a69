//! The provider's record: every request it received and what it did with
//! each. It is the harness's ground truth for emails, held outside the
//! system under test, so a verifier can count emails without trusting the
//! database of the pipeline that sent them.
//!
//! A request is kept small: its arrival, its key, a fingerprint of its body,
//! the few body fields a verifier reads and its outcome, about a hundred
//! bytes, not the body itself. A million emails then fit in a run's memory
//! (the parsed bodies took 2.6 KB each).

use crate::domain::canonical;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use uuid::Uuid;

/// One request to `POST /v1/emails`, as the provider saw and answered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Its place in arrival order, from 0; a snapshot of the record is sorted by it.
    pub seq: u64,
    /// When it arrived (its body read in full), in ms since the provider
    /// started (saturating at 49 days): four bytes, where a `Duration`
    /// took sixteen ([`Request::at`]).
    pub at_ms: u32,
    /// Its `Idempotency-Key` header, if it had one.
    pub key: Option<IdempotencyKey>,
    /// What the record keeps of what it asked to send.
    pub body: Body,
    /// What the provider did with it.
    pub outcome: Outcome,
}

impl Request {
    /// When it arrived, since the provider started.
    pub fn arrived(&self) -> Duration {
        Duration::from_millis(u64::from(self.at_ms))
    }
}

/// An idempotency key as the record keeps it. The shape the reference
/// notifier sends (`<uuid>:<handler>`, or a bare UUID) is held inline in 32
/// bytes; any other text on the heap. As a `String` each key took about 64
/// bytes of heap besides its 24 inline: about 60 MB at a million emails,
/// the largest part left of a request.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(KeyRepr);

/// How long the text after an inline key's UUID may be (`:receipts` is 9).
const KEY_TAIL: usize = 14;

#[derive(Clone, PartialEq, Eq, Hash)]
enum KeyRepr {
    /// A UUID in its canonical form (lower case, hyphens), then the first
    /// `len` bytes of `tail` as text: the key reads back exactly as sent.
    Uuid { uuid: Uuid, len: u8, tail: [u8; KEY_TAIL] },
    /// Any other key.
    Text(Box<str>),
}

/// `s` as a UUID when it is one in its canonical form (lower case,
/// hyphens): only then does the UUID's text read back as `s`.
fn canonical_uuid(s: &str) -> Option<Uuid> {
    let uuid = Uuid::parse_str(s).ok()?;
    let mut canonical = Uuid::encode_buffer();
    (*uuid.hyphenated().encode_lower(&mut canonical) == *s).then_some(uuid)
}

impl IdempotencyKey {
    /// The key whose text is `text`, inline when it has the notifier's shape.
    pub fn new(text: &str) -> IdempotencyKey {
        const UUID_TEXT: usize = 36;
        let inline = text
            .split_at_checked(UUID_TEXT)
            .filter(|(_, rest)| rest.len() <= KEY_TAIL)
            .and_then(|(head, rest)| Some((canonical_uuid(head)?, rest)));
        match inline {
            Some((uuid, rest)) => {
                let mut tail = [0u8; KEY_TAIL];
                tail[..rest.len()].copy_from_slice(rest.as_bytes());
                IdempotencyKey(KeyRepr::Uuid { uuid, len: rest.len() as u8, tail })
            }
            None => IdempotencyKey(KeyRepr::Text(text.into())),
        }
    }

    /// The key's text, as the request sent it.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match &self.0 {
            KeyRepr::Uuid { .. } => std::borrow::Cow::Owned(self.to_string()),
            KeyRepr::Text(t) => std::borrow::Cow::Borrowed(t),
        }
    }
}

impl From<&str> for IdempotencyKey {
    fn from(text: &str) -> Self {
        IdempotencyKey::new(text)
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            KeyRepr::Uuid { uuid, len, tail } => {
                // The tail was cut from a `str` at a character boundary.
                let rest = std::str::from_utf8(&tail[..usize::from(*len)]).unwrap_or_default();
                write!(f, "{}{rest}", uuid.hyphenated())
            }
            KeyRepr::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.text(), f)
    }
}

impl Serialize for IdempotencyKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(IdempotencyKey::new(&String::deserialize(d)?))
    }
}

/// What the record keeps of a request's body: how it parsed, a fingerprint
/// of all of it, and the top-level fields a verifier reads (the record's
/// [`Record::keep`], in that order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Body {
    pub form: Form,
    /// Equal for equal bodies: of the parsed JSON when it parses (key order
    /// and spacing do not matter), of the bytes otherwise. Two requests with
    /// one key and different fingerprints asked for different emails.
    pub fingerprint: u64,
    /// The kept fields' values, None where the body has no such field.
    pub kept: Kept,
}

/// How a body parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// A JSON object: what the provider sends.
    Object,
    /// JSON, but not an object (an array, a number): a `400`.
    OtherJson,
    /// Not JSON at all: a `400`.
    NotJson,
}

/// A kept field's value, compact: a UUID or an integer inline, anything else
/// as its text (a string bare, other JSON as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scalar {
    /// A string that is a UUID in its canonical form (lower case, hyphens).
    Uuid(Uuid),
    /// An integer that fits 64 bits.
    Int(i64),
    /// Any other string.
    Text(Box<str>),
    /// Any other JSON value, as JSON text.
    Json(Box<str>),
}

impl Scalar {
    pub fn of(v: &serde_json::Value) -> Scalar {
        match v {
            serde_json::Value::String(s) => match canonical_uuid(s) {
                Some(u) => Scalar::Uuid(u),
                None => Scalar::Text(s.as_str().into()),
            },
            serde_json::Value::Number(n) if n.as_i64().is_some() => Scalar::Int(n.as_i64().unwrap_or_default()),
            other => Scalar::Json(other.to_string().into()),
        }
    }

    /// The value as the effect rows show it as text: a string bare,
    /// anything else as JSON.
    pub fn text(&self) -> String {
        match self {
            Scalar::Uuid(u) => u.to_string(),
            Scalar::Int(n) => n.to_string(),
            Scalar::Text(s) | Scalar::Json(s) => s.to_string(),
        }
    }

    /// The value as a UUID, when it is a string that parses as one.
    pub fn uuid(&self) -> Option<Uuid> {
        match self {
            Scalar::Uuid(u) => Some(*u),
            Scalar::Text(s) => Uuid::parse_str(s).ok(),
            _ => None,
        }
    }

    /// The value as an integer, when it is a JSON number that is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Scalar::Int(n) => Some(*n),
            _ => None,
        }
    }
}

/// A body's kept values. Up to two, each a UUID or absent (what the
/// receipts keep: `payment_id`, `message_id`), are held inline; any other
/// list on the heap. Inline they take 40 bytes in the request, where the
/// list took 16 and 64 more on the heap: about 40 MB at a million emails.
#[derive(Clone, PartialEq, Eq)]
pub struct Kept(KeptRepr);

const INLINE: usize = 2;

#[derive(Clone, PartialEq, Eq)]
enum KeptRepr {
    /// `len` values; bit i of `present` says whether value i is there.
    Uuids {
        len: u8,
        present: u8,
        values: [[u8; 16]; INLINE],
    },
    Any(Box<[Option<Scalar>]>),
}

impl Kept {
    pub fn new(values: Vec<Option<Scalar>>) -> Kept {
        let inline = values.len() <= INLINE && values.iter().all(|v| matches!(v, None | Some(Scalar::Uuid(_))));
        if !inline {
            return Kept(KeptRepr::Any(values.into()));
        }
        let (mut present, mut bytes) = (0u8, [[0u8; 16]; INLINE]);
        for (i, v) in values.iter().enumerate() {
            if let Some(Scalar::Uuid(u)) = v {
                present |= 1 << i;
                bytes[i] = *u.as_bytes();
            }
        }
        Kept(KeptRepr::Uuids { len: values.len() as u8, present, values: bytes })
    }

    /// The `i`th value, if the body had it.
    pub fn get(&self, i: usize) -> Option<Scalar> {
        match &self.0 {
            KeptRepr::Uuids { len, present, values } => {
                (i < usize::from(*len) && present >> i & 1 == 1).then(|| Scalar::Uuid(Uuid::from_bytes(values[i])))
            }
            KeptRepr::Any(v) => v.get(i)?.clone(),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            KeptRepr::Uuids { len, .. } => usize::from(*len),
            KeptRepr::Any(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value, in order.
    pub fn to_vec(&self) -> Vec<Option<Scalar>> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.to_vec()).finish()
    }
}

impl Serialize for Kept {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_vec().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Kept::new(Vec::deserialize(d)?))
    }
}

impl Body {
    /// Reads a request's bytes, keeping the fields named in `keep`, without
    /// building the body's tree (at a million emails the trees were a
    /// visible share of the allocator's work).
    pub fn read(bytes: &[u8], keep: &[String]) -> Body {
        match canonical::read(bytes, keep) {
            Some(doc) => Body {
                form: if doc.object { Form::Object } else { Form::OtherJson },
                fingerprint: doc.fingerprint,
                kept: Kept::new(doc.fields.iter().map(|v| v.as_ref().map(Scalar::of)).collect()),
            },
            None => {
                let fingerprint = fingerprint_bytes(bytes);
                Body { form: Form::NotJson, fingerprint, kept: Kept::new(vec![None; keep.len()]) }
            }
        }
    }

    /// A parsed body, keeping the fields named in `keep`.
    pub fn of_json(v: &serde_json::Value, keep: &[String]) -> Body {
        let form = if v.is_object() { Form::Object } else { Form::OtherJson };
        let kept = keep.iter().map(|k| v.as_object().and_then(|o| o.get(k)).map(Scalar::of)).collect();
        Body { form, fingerprint: fingerprint(v), kept: Kept::new(kept) }
    }

    /// A body that is not JSON.
    pub fn not_json(text: &str, keep: &[String]) -> Body {
        Body::read(text.as_bytes(), keep)
    }
}

/// A JSON value's fingerprint: equal values, whatever their key order or
/// spacing, give equal fingerprints; [`Body::read`] gives the same of the
/// value's bytes.
pub fn fingerprint(v: &serde_json::Value) -> u64 {
    canonical::of_value(v)
}

/// Of bytes that are not JSON: never equal to a JSON value's (the tag).
fn fingerprint_bytes(bytes: &[u8]) -> u64 {
    use std::hash::Hash;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (6u8, bytes).hash(&mut h);
    std::hash::Hasher::finish(&h)
}

/// An email's id: `em_<n>`, the n-th email the provider sent, from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EmailId(pub u32);

impl std::fmt::Display for EmailId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "em_{}", self.0)
    }
}

/// What the provider did with one request. Only the `Sent*` outcomes sent
/// an email; every other one sent nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    /// Sent an email and answered `200 {"id": id}`.
    Sent {
        /// The email's id, `em_<n>`.
        id: EmailId,
    },
    /// A repeated idempotency key with the same body: answered with the
    /// first answer again, sent nothing.
    Replayed {
        /// The id of the email the first request sent.
        id: EmailId,
    },
    /// A repeated idempotency key with a different body: `409`, sent nothing.
    Conflict,
    /// The idempotency key's first request was still being sent: `409
    /// idempotency_key_in_use`, sent nothing.
    InUse,
    /// A body that is not a JSON object (or a key that is not text): `400`,
    /// sent nothing.
    BadRequest,
    /// The `Error` fault: `503` before sending; the key was not stored.
    Unavailable,
    /// The `ResponseLost` fault: sent, then the connection was dropped
    /// without a byte of response.
    SentResponseLost {
        /// The id of the email sent; a retry with the key replays it.
        id: EmailId,
    },
    /// The `Slow` fault: sent, and the answer held back for `slow_for`.
    SentSlow {
        /// The id of the email sent.
        id: EmailId,
    },
}

impl Outcome {
    /// The id of the email this request sent, if it sent one.
    pub fn sent(&self) -> Option<EmailId> {
        match self {
            Outcome::Sent { id } | Outcome::SentResponseLost { id } | Outcome::SentSlow { id } => Some(*id),
            _ => None,
        }
    }
}

/// A snapshot of the provider's record, in arrival order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Every request received whose outcome is decided, sorted by `seq`.
    pub requests: Vec<Request>,
    /// When the provider started, in Unix milliseconds: each request's
    /// `at` counts from it.
    #[serde(default)]
    pub started_epoch_ms: i64,
    /// The body fields each request keeps, in the order of its
    /// [`Body::kept`].
    #[serde(default)]
    pub keep: Vec<String>,
}

impl Record {
    /// Only the requests that actually sent an email: what a verifier counts.
    pub fn emails_sent(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| r.outcome.sent().is_some()).collect()
    }

    /// The outcomes alone, in arrival order (for tests and reports).
    pub fn outcomes(&self) -> Vec<&Outcome> {
        self.requests.iter().map(|r| &r.outcome).collect()
    }

    /// A kept field of a request's body: None when the record does not keep
    /// it, or the body has no such field.
    pub fn field(&self, q: &Request, name: &str) -> Option<Scalar> {
        let i = self.keep.iter().position(|k| k == name)?;
        q.body.kept.get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_keeps_its_fingerprint_and_the_fields_asked_for_compactly() {
        let keep: Vec<String> = ["payment_id", "n", "name", "gone", "flag"].map(String::from).to_vec();
        let id = Uuid::from_u128(7);
        let a = br#"{"payment_id": "00000000-0000-0000-0000-000000000007", "n": 5, "name": "x", "flag": true, "to": "a@b"}"#;
        let body = Body::read(a, &keep);
        assert_eq!(body.form, Form::Object);
        assert_eq!(body, Body::of_json(&serde_json::from_slice(a).unwrap(), &keep), "read and parsed agree");
        let kept: Vec<Option<Scalar>> = body.kept.to_vec();
        assert!(matches!(body.kept.0, KeptRepr::Any(_)), "five values of all kinds are a list");
        assert_eq!(
            kept,
            vec![
                Some(Scalar::Uuid(id)),
                Some(Scalar::Int(5)),
                Some(Scalar::Text("x".into())),
                None,
                Some(Scalar::Json("true".into()))
            ]
        );
        // Key order and spacing do not matter; any other change does.
        let b = br#"{"to":"a@b","flag":true,"name":"x","n":5,"payment_id":"00000000-0000-0000-0000-000000000007"}"#;
        assert_eq!(Body::read(b, &keep), body);
        let c = br#"{"to":"a@c","flag":true,"name":"x","n":5,"payment_id":"00000000-0000-0000-0000-000000000007"}"#;
        assert_ne!(Body::read(c, &keep).fingerprint, body.fingerprint, "a field not kept still counts");
        // A UUID in another case stays text, so that it reads back as sent.
        let upper = Scalar::of(&serde_json::json!("00000000-0000-0000-0000-00000000000A"));
        assert_eq!(upper.text(), "00000000-0000-0000-0000-00000000000A");
        assert_eq!(upper.uuid(), Some(Uuid::from_u128(10)));
        assert_eq!(Scalar::of(&serde_json::json!(1.5)).int(), None);
        assert_eq!(Scalar::of(&serde_json::json!(null)).text(), "null");
        // Not JSON, and JSON that is no object.
        let text = Body::read(b"receipt", &keep);
        assert_eq!((text.form, text.kept.len()), (Form::NotJson, 5));
        assert!(text.kept.to_vec().iter().all(Option::is_none));
        assert_eq!(Body::read(b"receipt", &keep), text);
        assert_ne!(Body::read(b"receipts", &keep), text);
        assert_eq!(Body::read(b"[1, 2]", &keep).form, Form::OtherJson);
        // Small: the request with two kept UUIDs is about a hundred bytes,
        // on the heap nothing.
        assert!(std::mem::size_of::<Request>() <= 112, "{}", std::mem::size_of::<Request>());
        let two = ["payment_id", "message_id"].map(String::from);
        let receipt = br#"{"payment_id": "00000000-0000-0000-0000-000000000007", "to": "a@b"}"#;
        let kept = Body::read(receipt, &two).kept;
        assert!(matches!(kept.0, KeptRepr::Uuids { .. }), "a receipt's UUIDs are inline");
        assert_eq!(kept.to_vec(), vec![Some(Scalar::Uuid(id)), None]);
        assert_eq!((kept.get(2), kept.len()), (None, 2));
        let json = serde_json::to_string(&kept).unwrap();
        assert_eq!(serde_json::from_str::<Kept>(&json).unwrap(), kept, "{json}");
        assert_eq!(std::mem::size_of::<Option<IdempotencyKey>>(), 32);
        assert_eq!(std::mem::size_of::<Option<Scalar>>(), 24);
    }

    #[test]
    fn an_idempotency_key_reads_back_as_sent_whatever_its_shape() {
        let uuid = "0191d3a2-7c4e-7b1a-9f00-00000000002a";
        for text in [
            format!("{uuid}:receipts"),
            uuid.to_string(),
            format!("{uuid}:{}", "x".repeat(KEY_TAIL - 1)),
            format!("{uuid}:{}", "x".repeat(KEY_TAIL)),
            uuid.to_uppercase() + ":receipts",
            format!("{uuid}:é"),
            "k1".to_string(),
            String::new(),
            "é".repeat(30),
            format!("a{}", "é".repeat(20)),
        ] {
            let key = IdempotencyKey::new(&text);
            assert_eq!(key.to_string(), text);
            assert_eq!(key.text(), text);
            assert_eq!(serde_json::to_string(&key).unwrap(), serde_json::to_string(&text).unwrap());
            assert_eq!(serde_json::from_str::<IdempotencyKey>(&serde_json::to_string(&text).unwrap()).unwrap(), key);
        }
        // The notifier's shape is inline; a longer tail or another case is text.
        let inline = |t: &str| matches!(IdempotencyKey::new(t).0, KeyRepr::Uuid { .. });
        assert!(inline(&format!("{uuid}:receipts")) && inline(uuid));
        assert!(inline(&format!("{uuid}:{}", "x".repeat(KEY_TAIL - 1))), "a tail of {KEY_TAIL} bytes fits");
        assert!(!inline(&format!("{uuid}:{}", "x".repeat(KEY_TAIL))), "one more does not");
        assert!(!inline(&uuid.to_uppercase()) && !inline("k1"));
        // Equal texts are equal keys, different ones are not.
        assert_eq!(IdempotencyKey::new(&format!("{uuid}:a")), IdempotencyKey::new(&format!("{uuid}:a")));
        assert_ne!(IdempotencyKey::new(&format!("{uuid}:a")), IdempotencyKey::new(&format!("{uuid}:b")));
        assert_ne!(IdempotencyKey::new(uuid), IdempotencyKey::new(&format!("{uuid}:")));
    }

    #[test]
    fn a_record_finds_a_kept_field_by_its_name() {
        let keep = vec!["payment_id".to_string(), "message_id".to_string()];
        let body = Body::of_json(&serde_json::json!({"message_id": "m"}), &keep);
        let q = Request { seq: 0, at_ms: 0, key: None, body, outcome: Outcome::Sent { id: EmailId(1) } };
        let record = Record { requests: vec![], started_epoch_ms: 0, keep };
        assert_eq!(record.field(&q, "message_id"), Some(Scalar::Text("m".into())));
        assert_eq!(record.field(&q, "payment_id"), None);
        assert_eq!(record.field(&q, "to"), None, "not kept");
        assert_eq!(EmailId(12).to_string(), "em_12");
    }
}
