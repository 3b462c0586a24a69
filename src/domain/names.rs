//! The names of one run's private corner of each service: a schema, a
//! topic and a consumer group, all derived from the run id, and the bound
//! on every wait for a service.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every wait on a network service is bounded by this, or by less.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(8);

/// The names of everything one run creates. All derive from the run id, so
/// `chaos clean` can find them and two runs never share any.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunNames {
    pub run_id: String,
    pub schema: String,
    pub topic: String,
    pub group: String,
}

impl RunNames {
    pub fn new() -> Self {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let tag: u16 = rand::random();
        let run_id = format!("{}-{tag:04x}", utc_stamp(now.as_secs()));
        Self::from_id(&run_id)
    }

    pub fn from_id(run_id: &str) -> Self {
        let flat = run_id.replace('-', "_");
        Self {
            run_id: run_id.to_string(),
            schema: format!("chaos_{flat}"),
            topic: format!("chaos.{run_id}.payments"),
            group: format!("chaos.{run_id}.notifier"),
        }
    }
}

impl RunNames {
    /// The names of a run of a declared system called `system` (the
    /// scenario's name): its topic and its consumers' group are named after
    /// it, `chaos.<id>.orders` rather than `chaos.<id>.payments`. Characters
    /// a Kafka name cannot hold become `-`.
    pub fn for_system(mut self, system: &str) -> Self {
        let slug: String = system
            .chars()
            .take(100)
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '-' })
            .collect();
        let slug = if slug.is_empty() { "system".to_string() } else { slug };
        self.topic = format!("chaos.{}.{slug}", self.run_id);
        self.group = format!("chaos.{}.{slug}-consumers", self.run_id);
        self
    }
}

impl Default for RunNames {
    fn default() -> Self {
        Self::new()
    }
}

/// `20261130-034512`, UTC, from seconds since the epoch.
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm): no date crate for one line.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Seconds since the epoch of a run id `YYYYMMDD-HHMMSS-xxxx`, or None when
/// the text is not exactly a run id.
pub fn run_id_time(id: &str) -> Option<u64> {
    let b = id.as_bytes();
    if b.len() != 20 || b[8] != b'-' || b[15] != b'-' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = id.get(r)?;
        s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok()).flatten()
    };
    if !id[16..].bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let (y, m, d) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hh, mm, ss) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    // Days-from-civil (Howard Hinnant's algorithm), the inverse of infra::utc_stamp.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// Whether a component writes the outbox (a declared service's instance,
/// the reference workload): its held COMMIT is what reorders the outbox.
pub fn writes_outbox(component: &str) -> bool {
    component.starts_with("service") || component.starts_with("workload")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_is_utc_calendar() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(1_796_010_000), "20261130-034000");
    }

    #[test]
    fn names_derive_from_run_id() {
        let n = RunNames::from_id("20261130-034000-ab12");
        assert_eq!(n.schema, "chaos_20261130_034000_ab12");
        assert_eq!(n.topic, "chaos.20261130-034000-ab12.payments");
        let orders = RunNames::from_id("20261130-034000-ab12").for_system("orders apply/later");
        assert_eq!(orders.topic, "chaos.20261130-034000-ab12.orders-apply-later");
        assert_eq!(orders.group, "chaos.20261130-034000-ab12.orders-apply-later-consumers");
        assert_eq!((orders.schema, orders.run_id), (n.schema.clone(), n.run_id.clone()));
    }
}
