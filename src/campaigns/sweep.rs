//! `chaos sweep`: one scenario over many seeds, one run after the other,
//! the way CI hunts for the seed that breaks a pipeline.
//!
//! With `--swarm` each seed also draws its own fault rates ([`swarm_rates`]):
//! swarm testing, after Groce et al. and TigerBeetle's VOPR. A fault the
//! scenario sets is switched off on some seeds and turned up on others, so
//! a bug that only one fault exposes is not drowned by the others, and one
//! that needs a fault to fire often gets seeds where it does. The rates a
//! seed ran with are printed, saved, and part of its replay command.
//!
//! The sweep stops at the first failing seed unless `--keep-going`; with
//! `--shrink` that failure is then made small ([`crate::campaigns::shrink`]).

use crate::campaigns::{Listener, Progress};
use crate::error::{Error, Result};
use crate::faults::{FaultPoint, FaultRates};
use crate::harness::run::{execute, Quiet, RunOptions};
use crate::report::Report;
use crate::verifier::Verdict;
use comfy_table::{presets, Cell, Table};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

/// With `--swarm`, the chance that a fault the scenario sets is off for a seed.
pub const SWARM_OFF: f64 = 0.25;
/// With `--swarm`, a fault that stays on runs at up to this many times the
/// scenario's rate (log-uniform from 1×, so never below the rate the
/// scenario was sized for: the fault still fires as often as it expects).
pub const SWARM_MAX_FACTOR: f64 = 4.0;

/// Examples kept per anomaly in a seed's row.
const EXAMPLES: usize = 3;

/// What `chaos sweep` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The scenario, the backend and the command line's changes; its seed is
    /// each seed in turn.
    pub run: RunOptions,
    pub first_seed: u64,
    pub seeds: u32,
    pub swarm: bool,
    pub keep_going: bool,
    /// Shrink the first failure, with at most this many replays.
    pub shrink: Option<u32>,
}

/// One seed's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedRow {
    pub seed: u64,
    pub verdict: Verdict,
    pub reason: String,
    /// Messages on the topic beyond the first copy of each event.
    pub topic_duplicates: u64,
    /// Redeliveries the inbox absorbed.
    pub duplicates_absorbed: u64,
    pub faults_fired: u64,
    /// Each anomaly found, as "count × name".
    pub anomalies: Vec<String>,
    /// The first examples of each anomaly, as "name: example".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    pub seconds: f64,
    /// The rates `--swarm` drew for this seed (empty without it).
    pub rates: Vec<Rate>,
    pub replay: String,
    pub run_id: String,
}

/// One fault point's rate for one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub point: String,
    pub probability: f64,
}

/// The whole sweep, as printed and as `reports/sweep-<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub sweep_id: String,
    pub scenario: String,
    /// The database and broker the runs used.
    pub backend: String,
    pub swarm: bool,
    pub first_seed: u64,
    /// Seeds asked for; `rows` may be shorter (stopped at a failure).
    pub seeds_asked: u32,
    pub rows: Vec<SeedRow>,
    pub passed: usize,
    pub failed: usize,
    pub inconclusive: usize,
    pub incomplete: usize,
    /// Stopped by Ctrl-C or SIGTERM.
    pub interrupted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrink: Option<crate::campaigns::shrink::Shrunk>,
    pub seconds: f64,
}

/// The rates a seed runs with under `--swarm`: a pure function of the
/// scenario's rates and the seed. Every fault the scenario sets (the
/// timeline's service faults aside) is off with chance [`SWARM_OFF`], or
/// else at its rate times a log-uniform factor from 1 to
/// [`SWARM_MAX_FACTOR`], capped at 1 and rounded to 4 significant digits (the
/// replay command's rate is the rate run). At least one stays on. Faults the
/// scenario leaves at 0 stay off: what they need is not checked here.
pub fn swarm_rates(base: &FaultRates, seed: u64) -> Vec<(FaultPoint, f64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5357_4152_4d00_0000);
    let set: Vec<FaultPoint> =
        FaultPoint::ALL.iter().copied().filter(|p| base.get(*p) > 0.0 && !p.is_service()).collect();
    let mut out: Vec<(FaultPoint, f64)> = set
        .iter()
        .map(|p| {
            let off = rng.gen::<f64>() < SWARM_OFF;
            let factor = SWARM_MAX_FACTOR.powf(rng.gen::<f64>());
            // A point that interrupts work which is then tried again stays
            // below 1, where the run would never end.
            let cap = if p.repeats_work() { SWARM_CAP_REPEATING } else { 1.0 };
            (*p, if off { 0.0 } else { round4((base.get(*p) * factor).min(cap)) })
        })
        .collect();
    if !out.is_empty() && out.iter().all(|(_, r)| *r == 0.0) {
        let keep = rng.gen_range(0..out.len());
        out[keep].1 = base.get(out[keep].0);
    }
    out
}

/// The highest swarm rate of a fault point that repeats work
/// ([`FaultPoint::repeats_work`]): at 1 every batch would fail for ever.
const SWARM_CAP_REPEATING: f64 = 0.9;

fn round4(x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let digits = 3 - x.log10().floor() as i32;
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Runs the sweep; `visible` draws the progress bar on stderr.
pub async fn sweep(opts: &Options, listener: &dyn Listener) -> Result<Summary> {
    if opts.seeds == 0 {
        return Err(Error::Usage("--seeds is 0; a sweep runs at least one seed".into()));
    }
    // Read the scenario once up front: a bad file or flag ends the sweep
    // before any run.
    let base = opts.run.scenario()?;
    let started = Instant::now();
    let sweep_id = format!("sweep-{}", crate::domain::names::RunNames::new().run_id);
    listener.progress(&Progress::SweepStarted { seeds: opts.seeds });
    let mut s = Summary {
        sweep_id,
        scenario: opts.run.scenario.display().to_string(),
        backend: String::new(),
        swarm: opts.swarm,
        first_seed: opts.first_seed,
        seeds_asked: opts.seeds,
        rows: vec![],
        passed: 0,
        failed: 0,
        inconclusive: 0,
        incomplete: 0,
        interrupted: false,
        shrink: None,
        seconds: 0.0,
    };
    let mut first_failure: Option<(crate::scenario::Scenario, Report)> = None;
    for i in 0..opts.seeds {
        let seed = opts.first_seed + i as u64;
        let mut sc = base.clone().with_seed(seed);
        let mut rates = vec![];
        if opts.swarm {
            for (p, r) in swarm_rates(&sc.faults, seed) {
                sc = sc.with_rate(p, r)?;
                rates.push(Rate { point: p.name().into(), probability: r });
            }
        }
        listener.progress(&Progress::SeedStarted { seed, tally: tally(&s) });
        let t = Instant::now();
        let rep =
            execute(sc.clone(), opts.run.database_url.clone(), opts.run.brokers.clone(), &opts.run.reports_dir, &Quiet)
                .await?;
        if s.backend.is_empty() {
            s.backend = format!("{} · {}", rep.infra.database, rep.infra.broker);
        }
        let row = row(seed, &rep, rates, t.elapsed().as_secs_f64());
        listener.progress(&Progress::SeedFinished {
            seed,
            verdict: row.verdict,
            seconds: row.seconds,
            reason: &row.reason,
        });
        match rep.verdict {
            Verdict::Pass => s.passed += 1,
            Verdict::Fail => s.failed += 1,
            Verdict::Inconclusive => s.inconclusive += 1,
            Verdict::Incomplete => s.incomplete += 1,
            Verdict::Interrupted => s.interrupted = true,
        }
        s.rows.push(row);
        if rep.verdict == Verdict::Fail && first_failure.is_none() {
            first_failure = Some((sc, rep));
            if !opts.keep_going {
                break;
            }
        }
        if s.interrupted {
            break;
        }
    }
    listener.progress(&Progress::SweepFinished);
    if let (Some(budget), Some((sc, rep)), false) = (opts.shrink, first_failure, s.interrupted) {
        s.shrink = Some(crate::campaigns::shrink::shrink(&sc, &rep, &opts.run.reports_dir, budget, listener).await?);
    }
    s.seconds = started.elapsed().as_secs_f64();
    Ok(s)
}

fn tally(s: &Summary) -> String {
    format!("{} pass · {} fail · {} inconclusive · {} incomplete", s.passed, s.failed, s.inconclusive, s.incomplete)
}

fn row(seed: u64, rep: &Report, rates: Vec<Rate>, seconds: f64) -> SeedRow {
    SeedRow {
        seed,
        verdict: rep.verdict,
        reason: rep.reason.clone(),
        topic_duplicates: rep.counts.topic_duplicates,
        duplicates_absorbed: rep.components.duplicates_absorbed,
        faults_fired: rep.faults.iter().map(|f| f.fired).sum(),
        anomalies: rep.anomalies.iter().map(|a| format!("{} × {}", a.count, a.name)).collect(),
        examples: rep
            .anomalies
            .iter()
            .flat_map(|a| a.examples.iter().take(EXAMPLES).map(move |e| format!("{}: {e}", a.name)))
            .collect(),
        seconds,
        rates,
        replay: rep.replay.clone(),
        run_id: rep.run_id.clone(),
    }
}

impl Summary {
    /// Reads a saved sweep summary; None when the JSON file is something
    /// else (a run's report), so `chaos report` can tell the two apart.
    pub fn load_if_sweep(path: &std::path::Path) -> Result<Option<Summary>> {
        let err = |cause: String| Error::ReportRead { path: path.into(), cause };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else { return Ok(None) };
        if value.get("sweep_id").is_none() {
            return Ok(None);
        }
        serde_json::from_value(value).map(Some).map_err(|e| err(format!("not a chaos sweep summary: {e}")))
    }

    /// Writes `<dir>/<sweep-id>.json`; returns its path.
    pub fn save(&self, dir: &std::path::Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Write { path: dir.into(), cause: e.to_string() })?;
        let path = dir.join(format!("{}.json", self.sweep_id));
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::Write { path: path.clone(), cause: e.to_string() })?;
        Ok(path)
    }
}

/// The summary table, a line of totals, each failure's replay command, and
/// the shrunk schedule when there is one.
pub fn render(s: &Summary) -> String {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    let mut header = vec!["seed", "verdict", "duplicates on topic", "absorbed", "faults fired", "anomalies", "time"];
    if s.swarm {
        header.push("rates (--swarm)");
    }
    t.set_header(header);
    for r in &s.rows {
        let mut cells = vec![
            Cell::new(r.seed),
            Cell::new(r.verdict.as_str()),
            Cell::new(r.topic_duplicates),
            Cell::new(r.duplicates_absorbed),
            Cell::new(r.faults_fired),
            Cell::new(if r.anomalies.is_empty() { "none".to_string() } else { r.anomalies.join(", ") }),
            Cell::new(format!("{:.1} s", r.seconds)),
        ];
        if s.swarm {
            let rates: Vec<String> = r.rates.iter().map(|x| format!("{} {}", x.point, x.probability)).collect();
            cells.push(Cell::new(rates.join(", ")));
        }
        t.add_row(cells);
    }
    let mut out = format!("{t}\n");
    let ran = s.rows.len();
    out.push_str(&format!(
        "{ran} of {} seed(s) run on {}: {} pass, {} fail, {} inconclusive, {} incomplete{} in {:.0} s\n",
        s.seeds_asked,
        s.backend,
        s.passed,
        s.failed,
        s.inconclusive,
        s.incomplete,
        if s.interrupted { ", interrupted," } else { "" },
        s.seconds
    ));
    if (ran as u32) < s.seeds_asked && s.failed > 0 && !s.interrupted {
        out.push_str("stopped at the first failure (--keep-going runs every seed)\n");
    }
    for r in s.rows.iter().filter(|r| r.verdict != Verdict::Pass) {
        out.push_str(&format!("seed {} {}: {}\n  replay: {}\n", r.seed, r.verdict.as_str(), r.reason, r.replay));
    }
    if let Some(sh) = &s.shrink {
        out.push_str(&crate::campaigns::shrink::render(sh));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FaultRates {
        FaultRates::none()
            .with(FaultPoint::RelayAfterProduce, 0.09)
            .with(FaultPoint::NotifierBeforeOffsetCommit, 0.002)
            .with(FaultPoint::NotifierMidBatch, 0.5)
    }

    #[test]
    fn swarm_rates_replay_and_stay_in_their_bounds() {
        let b = base();
        let mut offs = 0;
        let mut total = 0;
        for seed in 0..500 {
            let r = swarm_rates(&b, seed);
            assert_eq!(r, swarm_rates(&b, seed), "a pure function of the seed");
            assert_eq!(r.len(), 3, "only the faults the scenario sets");
            assert!(r.iter().any(|(_, p)| *p > 0.0), "at least one stays on (seed {seed})");
            for (p, rate) in &r {
                total += 1;
                if *rate == 0.0 {
                    offs += 1;
                    continue;
                }
                let lo = b.get(*p);
                let hi = (lo * SWARM_MAX_FACTOR).min(if p.repeats_work() { SWARM_CAP_REPEATING } else { 1.0 });
                // Rounding to 4 significant digits may nudge past a bound.
                assert!(*rate >= lo * 0.9995 && *rate <= hi * 1.0005, "{} {rate} outside [{lo}, {hi}]", p.name());
            }
        }
        // Off a quarter of the time, less the seeds where all three were off.
        assert!((250..500).contains(&offs), "{offs} of {total} off");
        assert_ne!(swarm_rates(&b, 1), swarm_rates(&b, 2), "seeds differ");
    }

    #[test]
    fn swarm_leaves_service_and_unset_faults_alone() {
        let b = FaultRates::none().with(FaultPoint::BrokerPause, 1.0).with(FaultPoint::RelayAfterProduce, 0.1);
        for seed in 0..50 {
            let r = swarm_rates(&b, seed);
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].0, FaultPoint::RelayAfterProduce);
            assert!(r[0].1 > 0.0, "the only fault set stays on");
        }
        assert!(swarm_rates(&FaultRates::none(), 3).is_empty());
    }

    #[test]
    fn rates_round_to_four_significant_digits() {
        assert_eq!(round4(0.123456), 0.1235);
        assert_eq!(round4(0.00234567), 0.002346);
        assert_eq!(round4(1.0), 1.0);
        assert_eq!(round4(0.0), 0.0);
    }
}
