//! Where a message sits on a topic, in the broker's own terms, opaque to
//! everyone else. A topic has ordering lanes (Kafka's partitions): a
//! message keeps its order among those of its lane, and has a position in
//! it (Kafka's offset). The verifier, the fault log and the components
//! carry a [`Position`] or a [`Stretch`] and compare them; only this folder
//! knows that a lane is a partition and a place an offset, and only here
//! are they written out as such, in the report's text and its JSON.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// One message's place on the topic: its lane, and its place in the lane.
/// Ordered by lane, then by place: within a lane, the broker's order.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[schemars(with = "Named")]
pub struct Position {
    lane: i32,
    at: i64,
}

impl Position {
    pub fn new(lane: i32, at: i64) -> Self {
        Self { lane, at }
    }

    /// Its ordering lane: messages of one lane are read in order.
    pub fn lane(self) -> i32 {
        self.lane
    }

    /// Its place in its lane.
    pub fn at(self) -> i64 {
        self.at
    }

    /// The place a reader of its lane goes on from once it is done: what a
    /// consumer commits.
    pub fn next(self) -> Self {
        Self { lane: self.lane, at: self.at + 1 }
    }
}

/// A [`Position`] in eight bytes, for the books that keep millions of
/// them: its lane in the top 16 bits, its place in the other 48. Opaque:
/// only [`Packed::position`] opens it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packed(u64);

/// Places beyond 2^48 (and lanes beyond 2^16) do not pack; no topic a run
/// writes comes near either.
const PLACE_BITS: u32 = 48;

impl Packed {
    pub fn position(self) -> Position {
        Position { lane: (self.0 >> PLACE_BITS) as i32, at: (self.0 & ((1 << PLACE_BITS) - 1)) as i64 }
    }
}

impl Position {
    /// Itself in eight bytes ([`Packed`]).
    pub fn packed(self) -> Packed {
        let lane = (self.lane.clamp(0, u16::MAX as i32) as u64) << PLACE_BITS;
        Packed(lane | (self.at.clamp(0, (1 << PLACE_BITS) - 1) as u64))
    }

    /// The two numbers a dead letter's row records of the message it came
    /// from (`topic_partition`, `topic_offset`: docs/contract.md), the
    /// contract every consumer program writes to.
    pub fn as_row(self) -> (i32, i64) {
        (self.lane, self.at)
    }

    /// "p1@4", as a finding names a message in a line of text.
    pub fn short(self) -> String {
        format!("p{}@{}", self.lane, self.at)
    }

    /// "partition 1 offset 4", as an anomaly's example names a message.
    pub fn named(self) -> String {
        format!("partition {} offset {}", self.lane, self.at)
    }
}

/// "1:4": lane, then place, as the stories write a message.
impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.lane, self.at)
    }
}

/// As the JSON report has always written a message's place: `partition`
/// and `offset` (flattened into the message that carries it).
#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Position")]
struct Named {
    partition: i32,
    offset: i64,
}

impl Serialize for Position {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Named { partition: self.lane, offset: self.at }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Position {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = Named::deserialize(d)?;
        Ok(Self::new(n.partition, n.offset))
    }
}

/// The places `first..=last` of one lane: what a batch held (a consumer
/// reads a lane in order, so a batch holds a stretch of it). Written in
/// JSON as `[lane, first, last]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct Stretch(i32, i64, i64);

impl Stretch {
    pub fn new(lane: i32, first: i64, last: i64) -> Self {
        Self(lane, first, last)
    }

    pub fn lane(self) -> i32 {
        self.0
    }

    pub fn first(self) -> Position {
        Position::new(self.0, self.1)
    }

    /// "0:5–9" (or "0:5" for one place): a reach in a few words.
    pub fn short(self) -> String {
        match self.1 == self.2 {
            true => format!("{}:{}", self.0, self.1),
            false => format!("{}:{}–{}", self.0, self.1, self.2),
        }
    }

    pub fn contains(self, p: Position) -> bool {
        p.lane == self.0 && (self.1..=self.2).contains(&p.at)
    }

    /// Positions folded into one stretch per lane (its first and last
    /// place), lanes in the order first seen, with how many positions
    /// there were.
    pub fn fold(positions: impl IntoIterator<Item = Position>) -> (Vec<Stretch>, u32) {
        let mut stretches: Vec<Stretch> = Vec::new();
        let mut n = 0u32;
        for p in positions {
            n += 1;
            match stretches.iter_mut().find(|s| s.0 == p.lane) {
                Some(s) => {
                    s.1 = s.1.min(p.at);
                    s.2 = s.2.max(p.at);
                }
                None => stretches.push(Stretch(p.lane, p.at, p.at)),
            }
        }
        (stretches, n)
    }
}

/// "partition 1, offsets 3..=4", as the attribution tells a batch.
impl fmt::Display for Stretch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {}, offsets {}", self.0, range(self.1, self.2))
    }
}

/// "3..=4"; "3" for a stretch of one; "3 onwards" for one with no end.
pub fn range(a: i64, b: i64) -> String {
    match (a == b, b == i64::MAX) {
        (true, _) => a.to_string(),
        (_, true) => format!("{a} onwards"),
        _ => format!("{a}..={b}"),
    }
}

/// Test shorthands: a position or a stretch written as a tuple.
#[cfg(test)]
impl From<(i32, i64)> for Position {
    fn from((lane, at): (i32, i64)) -> Self {
        Self::new(lane, at)
    }
}

#[cfg(test)]
impl PartialEq<(i32, i64, i64)> for Stretch {
    fn eq(&self, (lane, first, last): &(i32, i64, i64)) -> bool {
        (self.0, self.1, self.2) == (*lane, *first, *last)
    }
}

#[cfg(test)]
impl From<(i32, i64, i64)> for Stretch {
    fn from((lane, first, last): (i32, i64, i64)) -> Self {
        Self::new(lane, first, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_holds_its_lanes_places_and_no_other() {
        let s = Stretch::new(1, 3, 5);
        assert!(s.contains(Position::new(1, 3)) && s.contains(Position::new(1, 5)));
        assert!(!s.contains(Position::new(1, 6)) && !s.contains(Position::new(0, 4)));
        let (folded, n) = Stretch::fold([(1, 7), (0, 2), (1, 4), (1, 5)].map(|(l, a)| Position::new(l, a)));
        assert_eq!((folded, n), (vec![Stretch::new(1, 4, 7), Stretch::new(0, 2, 2)], 4));
    }

    #[test]
    fn positions_keep_the_reports_json_and_text() {
        let p = Position::new(2, 41);
        assert_eq!(serde_json::to_string(&p).unwrap(), r#"{"partition":2,"offset":41}"#);
        assert_eq!(serde_json::from_str::<Position>(r#"{"partition":2,"offset":41}"#).unwrap(), p);
        assert_eq!(p.to_string(), "2:41");
        assert_eq!(p.named(), "partition 2 offset 41");
        assert_eq!(p.next(), Position::new(2, 42));
        assert_eq!(serde_json::to_string(&Stretch::new(1, 3, 4)).unwrap(), "[1,3,4]");
        assert_eq!(Stretch::new(1, 3, 4).to_string(), "partition 1, offsets 3..=4");
        assert_eq!((Stretch::new(0, 5, 9).short(), Stretch::new(0, 5, 5).short()), ("0:5–9".into(), "0:5".into()));
        assert_eq!(Stretch::new(1, 3, 3).to_string(), "partition 1, offsets 3");
        assert_eq!(Stretch::new(1, 3, i64::MAX).to_string(), "partition 1, offsets 3 onwards");
    }

    #[test]
    fn a_packed_position_opens_as_itself_and_keeps_its_order() {
        let all = [(0, 0), (0, 1), (1, 0), (2, 41), (1023, (1 << 40) + 7), (u16::MAX as i32, (1 << 48) - 1)];
        for (lane, at) in all {
            let p = Position::new(lane, at);
            assert_eq!(p.packed().position(), p, "{p}");
        }
        let packed: Vec<Packed> = all.iter().map(|&(l, a)| Position::new(l, a).packed()).collect();
        assert!(packed.windows(2).all(|w| w[0] < w[1]), "lane, then place: {packed:?}");
        assert_eq!(std::mem::size_of::<Packed>(), 8);
        assert_eq!((Position::new(2, 41).short(), Position::new(2, 41).as_row()), ("p2@41".into(), (2, 41)));
    }
}
