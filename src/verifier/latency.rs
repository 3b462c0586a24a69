//! End-to-end latency (outbox row created → inbox row processed), computed
//! once for every backend: the database only hands over one sample per
//! event, in milliseconds, and the percentiles come from an HDR histogram
//! here. (They were interpolated by PostgreSQL and nearest-rank on SQLite,
//! two different statistics under one name.)

use hdrhistogram::Histogram;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// End-to-end latency percentiles, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Latency {
    pub events: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    /// The distribution: events per latency range, the ranges doubling
    /// (from the run's HDR histogram), empty in reports from before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<LatencyBucket>,
}

/// Events whose latency was above the previous bucket's `up_to_ms` and at
/// most this one's.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct LatencyBucket {
    pub up_to_ms: u64,
    pub events: u64,
}

/// Millisecond samples, three significant digits, any range.
pub struct LatencyRecorder {
    h: Option<Histogram<u64>>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    pub fn new() -> Self {
        // Auto-resizing: a run's worst latency is not known in advance.
        Self { h: Histogram::new(3).ok() }
    }

    /// One event's latency. A negative sample (clock steps) counts as 0.
    pub fn record(&mut self, ms: i64) {
        if let Some(h) = &mut self.h {
            let _ = h.record(ms.max(0) as u64);
        }
    }

    /// The percentiles, or None without a sample.
    pub fn finish(&self) -> Option<Latency> {
        let h = self.h.as_ref().filter(|h| !h.is_empty())?;
        let at = |q: f64| h.value_at_quantile(q) as f64;
        // Doubling ranges from 1 ms: a few dozen buckets cover any run, and
        // a long tail stays readable beside the bulk.
        let buckets = h
            .iter_log(1, 2.0)
            .map(|v| LatencyBucket { up_to_ms: v.value_iterated_to(), events: v.count_since_last_iteration() })
            .collect();
        Some(Latency { events: h.len(), p50: at(0.5), p95: at(0.95), p99: at(0.99), max: h.max() as f64, buckets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut r = LatencyRecorder::new();
        assert!(r.finish().is_none());
        for ms in 1..=1000 {
            r.record(ms);
        }
        r.record(-3);
        let l = r.finish().unwrap();
        assert_eq!(l.events, 1001);
        assert_eq!(l.p50, 500.0);
        assert_eq!(l.p95, 950.0);
        assert_eq!(l.p99, 990.0);
        assert_eq!(l.max, 1000.0);
        // Doubling ranges: 0 ms (the negative sample), 1, 2-3, 4-7, ...
        let counts: Vec<(u64, u64)> = l.buckets.iter().map(|b| (b.up_to_ms, b.events)).take(4).collect();
        assert_eq!(counts, vec![(0, 1), (1, 1), (3, 2), (7, 4)]);
        assert_eq!(l.buckets.iter().map(|b| b.events).sum::<u64>(), 1001);
    }
}
