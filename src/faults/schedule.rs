//! Firings pinned by occurrence (`--schedule`, and what a shrink shrinks).

use super::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Fault firings pinned by occurrence, in place of the seeded decisions
/// (`chaos run --schedule`, and what `chaos sweep --shrink` shrinks): a
/// point fires at exactly the occurrences listed for it, and a point not
/// listed never fires. Occurrences count each time any component reaches
/// the point, from 0, so a schedule replays the same firings as far as the
/// threads reach the points in the same order.
///
/// In JSON it is the text `--schedule` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(into = "String", try_from = "String")]
pub struct Schedule(pub std::collections::BTreeMap<FaultPoint, std::collections::BTreeSet<u64>>);

impl From<Schedule> for String {
    fn from(s: Schedule) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Schedule::parse(&s)
    }
}

impl Schedule {
    /// Every (point, occurrence), in point then occurrence order.
    pub fn firings(&self) -> Vec<(FaultPoint, u64)> {
        self.0.iter().flat_map(|(p, ns)| ns.iter().map(move |n| (*p, *n))).collect()
    }

    pub fn from_firings(firings: impl IntoIterator<Item = (FaultPoint, u64)>) -> Self {
        let mut s = Schedule::default();
        for (p, n) in firings {
            s.0.entry(p).or_default().insert(n);
        }
        s
    }

    pub fn len(&self) -> usize {
        self.0.values().map(|ns| ns.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn fires(&self, point: FaultPoint, occurrence: u64) -> bool {
        self.0.get(&point).is_some_and(|ns| ns.contains(&occurrence))
    }

    /// Parses `relay.after_produce:3,17;notifier.mid_batch:2`, or `none`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut s = Schedule::default();
        let text = text.trim();
        if text == "none" {
            return Ok(s);
        }
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, list) = part.split_once(':').ok_or_else(|| {
                format!("{part:?} has no occurrences; write POINT:N[,N...], e.g. relay.after_produce:3,17")
            })?;
            let point = FaultPoint::named(name)?;
            if point.is_service() {
                return Err(format!(
                    "{} strikes only on the scenario's [[nemesis.timeline]]; a schedule pins the other points",
                    point.name()
                ));
            }
            for n in list.split(',').map(str::trim) {
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("{n:?} in {part:?} is not an occurrence; occurrences are integers from 0"))?;
                s.0.entry(point).or_default().insert(n);
            }
        }
        if s.is_empty() {
            return Err("the schedule is empty; write POINT:N[,N...] separated by ';', or none".into());
        }
        Ok(s)
    }
}

impl std::fmt::Display for Schedule {
    /// The form [`Schedule::parse`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(_, ns)| !ns.is_empty())
            .map(|(p, ns)| format!("{}:{}", p.name(), ns.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")))
            .collect();
        f.write_str(&parts.join(";"))
    }
}
