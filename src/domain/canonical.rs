//! A JSON document's fingerprint, equal for equal documents whatever their
//! key order or spacing: how the provider's record tells two emails under
//! one key apart, and how every verifier tells a message changed on its
//! way from the outbox ([`crate::domain::events::fingerprint`]).
//!
//! It is computed while the bytes are parsed, without building the
//! document's tree: at a million emails, the trees of `serde_json::Value`
//! were a visible share of the allocator's work. Each value's fingerprint
//! is a hash of its children's (objects' fields sorted by key), so the same
//! figure comes from a parsed [`serde_json::Value`] ([`of_value`]) and from
//! the bytes ([`of_bytes`]); a property test holds the two together.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// One JSON value's fingerprint, of its kind and content.
fn hashed(what: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

/// The tags of the kinds, so no two kinds agree.
const NULL: u8 = 0;
const BOOL: u8 = 1;
const NUMBER: u8 = 2;
const STRING: u8 = 3;
const ARRAY: u8 = 4;
const OBJECT: u8 = 5;

/// A number as one of three forms: what serde_json keeps it as (without
/// `arbitrary_precision`), an integer that fits i64 always the first.
fn number_i64(n: i64) -> u64 {
    hashed((NUMBER, 0u8, n))
}
fn number_u64(n: u64) -> u64 {
    match i64::try_from(n) {
        Ok(n) => number_i64(n),
        Err(_) => hashed((NUMBER, 1u8, n)),
    }
}
fn number_f64(n: f64) -> u64 {
    hashed((NUMBER, 2u8, n.to_bits()))
}

fn string(s: &str) -> u64 {
    hashed((STRING, s))
}

fn array(children: &[u64]) -> u64 {
    hashed((ARRAY, children))
}

/// An object's fields, sorted here; a key given twice keeps its last value,
/// as a parsed `Value` does.
fn object(mut fields: Vec<(Cow<'_, str>, u64)>) -> u64 {
    // Stable: of equal keys, the last given stays last.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = DefaultHasher::new();
    OBJECT.hash(&mut h);
    let mut kept = 0usize;
    for (i, (key, fp)) in fields.iter().enumerate() {
        if fields.get(i + 1).is_some_and(|next| next.0 == *key) {
            continue;
        }
        kept += 1;
        (key.as_ref(), fp).hash(&mut h);
    }
    kept.hash(&mut h);
    h.finish()
}

/// The fingerprint of a parsed value.
pub fn of_value(v: &Value) -> u64 {
    match v {
        Value::Null => hashed(NULL),
        Value::Bool(b) => hashed((BOOL, b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => number_i64(i),
            (None, Some(u)) => number_u64(u),
            _ => number_f64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => string(s),
        Value::Array(a) => array(&a.iter().map(of_value).collect::<Vec<_>>()),
        Value::Object(o) => object(o.iter().map(|(k, x)| (Cow::Borrowed(k.as_str()), of_value(x))).collect()),
    }
}

/// The fingerprint of a JSON document's bytes; None when they are not one
/// JSON document (trailing spaces allowed, nothing else).
pub fn of_bytes(bytes: &[u8]) -> Option<u64> {
    read(bytes, &[]).map(|d| d.fingerprint)
}

/// What [`read`] gives of a document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub fingerprint: u64,
    /// Whether its top level is an object.
    pub object: bool,
    /// The top-level fields asked for, in the order asked, each parsed in
    /// full (None where the document has no such field).
    pub fields: Vec<Option<Value>>,
}

/// Parses `bytes` as one JSON document: its fingerprint, and the top-level
/// fields named in `fields` parsed; None when the bytes are not JSON.
pub fn read(bytes: &[u8], fields: &[String]) -> Option<Document> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut found = vec![None; fields.len()];
    let mut object = false;
    let wanted = Wanted { names: fields, found: &mut found, object: &mut object };
    let fingerprint = Fp { wanted: Some(wanted) }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(Document { fingerprint, object, fields: found })
}

/// Deserializes one value into its fingerprint. At the top level it also
/// notes whether the value is an object and takes the fields asked for.
struct Fp<'a> {
    wanted: Option<Wanted<'a>>,
}

/// What the top level takes besides its fingerprint.
struct Wanted<'a> {
    /// The fields asked for, and where each one's value goes.
    names: &'a [String],
    found: &'a mut Vec<Option<Value>>,
    /// Set when the top level is an object.
    object: &'a mut bool,
}

impl<'de> DeserializeSeed<'de> for Fp<'_> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Fp<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(hashed(NULL))
    }
    fn visit_bool<E>(self, b: bool) -> Result<u64, E> {
        Ok(hashed((BOOL, b)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<u64, E> {
        Ok(number_i64(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<u64, E> {
        Ok(number_u64(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<u64, E> {
        Ok(number_f64(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(string(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut children = Vec::new();
        while let Some(fp) = seq.next_element_seed(Fp { wanted: None })? {
            children.push(fp);
        }
        Ok(array(&children))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut fields = Vec::new();
        let mut wanted = self.wanted;
        if let Some(w) = &mut wanted {
            *w.object = true;
        }
        while let Some(key) = map.next_key_seed(Key)? {
            let asked = wanted.as_ref().and_then(|w| w.names.iter().position(|n| *n == *key));
            let fp = match (asked, &mut wanted) {
                (Some(i), Some(w)) => {
                    let v: Value = map.next_value()?;
                    let fp = of_value(&v);
                    w.found[i] = Some(v);
                    fp
                }
                _ => map.next_value_seed(Fp { wanted: None })?,
            };
            fields.push((key, fp));
        }
        Ok(object(fields))
    }
}

/// An object's key, borrowed from the bytes when it has no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object's key")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn key_order_and_spacing_do_not_count() {
        let a = of_bytes(br#"{"a": 1, "b": [true, null, "x"], "c": {"d": -2.5}}"#);
        let b = of_bytes(br#"{"c":{"d":-2.5},"b":[true,null,"x"],"a":1}"#);
        assert_eq!(a, b);
        assert!(a.is_some());
    }

    #[test]
    fn a_different_value_or_kind_counts() {
        let base = of_bytes(br#"{"a": 1}"#).unwrap();
        for other in
            [&br#"{"a": 2}"#[..], br#"{"a": "1"}"#, br#"{"a": 1.0}"#, br#"{"b": 1}"#, br#"[1]"#, br#"{"a": [1]}"#]
        {
            assert_ne!(of_bytes(other), Some(base), "{}", String::from_utf8_lossy(other));
        }
        // Array order counts; an empty array is not an empty object.
        assert_ne!(of_bytes(b"[1, 2]"), of_bytes(b"[2, 1]"));
        assert_ne!(of_bytes(b"[]"), of_bytes(b"{}"));
    }

    #[test]
    fn not_one_document_is_none() {
        for bad in [&b""[..], b"{", b"{} {}", b"nope", b"{\"a\": 1,}"] {
            assert_eq!(of_bytes(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(of_bytes(b" {}\n").is_some());
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_a_parsed_value_does() {
        let bytes = br#"{"a": 1, "b": 2, "a": 3}"#;
        let parsed: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(of_bytes(bytes), Some(of_value(&parsed)));
        assert_eq!(of_bytes(bytes), of_bytes(br#"{"b": 2, "a": 3}"#));
    }

    #[test]
    fn read_takes_the_top_level_fields_asked_for() {
        let names = ["payment_id".to_string(), "absent".to_string(), "n".to_string()];
        let doc = read(br#"{"n": {"x": [1]}, "payment_id": "p1", "inner": {"payment_id": "no"}}"#, &names).unwrap();
        assert!(doc.object);
        assert_eq!(doc.fields, vec![Some(json!("p1")), None, Some(json!({"x": [1]}))]);
        let not_object = read(br#"["payment_id"]"#, &names).unwrap();
        assert!(!not_object.object);
        assert_eq!(not_object.fields, vec![None, None, None]);
    }

    /// Any JSON value, nested a few levels.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e9f64..1e9).prop_map(|n| json!(n)),
            "[a-z\"\\\\\u{e9}\n ]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-c\"\\\\]{0,3}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The bytes and the parsed value agree, written compact or pretty,
        /// so a fingerprint from the wire equals one from a stored value.
        #[test]
        fn the_bytes_and_the_parsed_value_agree(v in json_value()) {
            let compact = serde_json::to_vec(&v).unwrap();
            let pretty = serde_json::to_vec_pretty(&v).unwrap();
            let reparsed: Value = serde_json::from_slice(&compact).unwrap();
            prop_assert_eq!(of_bytes(&compact), Some(of_value(&reparsed)));
            prop_assert_eq!(of_bytes(&pretty), Some(of_value(&reparsed)));
        }
    }
}
