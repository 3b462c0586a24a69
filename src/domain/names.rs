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
    }
}
