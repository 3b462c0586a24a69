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
use futures::StreamExt;
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
    /// Run only this shard's seeds (`--shard K/N`), so that N machines
    /// share a sweep; `chaos merge` puts their summaries back together.
    pub shard: Option<Shard>,
    /// Seeds run at once (`--jobs N`), each with its own schema, topic and
    /// group as every run has; 1 runs them one after the other.
    pub jobs: u32,
}

/// One of `count` shares of a sweep's seeds: the seeds whose index from
/// the first seed is `index - 1` modulo `count` (round robin, so every
/// shard gets early and late seeds alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 1-based.
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Parses "K/N", 1 <= K <= N <= 10000.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let (k, n) =
            s.split_once('/').ok_or_else(|| format!("{s:?}: write K/N, e.g. 2/8 for the second of 8 shards"))?;
        let (k, n): (u32, u32) = match (k.trim().parse(), n.trim().parse()) {
            (Ok(k), Ok(n)) => (k, n),
            _ => return Err(format!("{s:?}: K and N are whole numbers, e.g. 2/8")),
        };
        if n == 0 || n > 10_000 || k == 0 || k > n {
            return Err(format!("{s:?}: expected 1 <= K <= N <= 10000"));
        }
        Ok(Self { index: k, count: n })
    }

    /// Whether the seed at `i` (0-based from the first seed) is this shard's.
    pub fn owns(&self, i: u64) -> bool {
        i % self.count as u64 == (self.index - 1) as u64
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
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
    /// The shard this summary covers (`--shard`); None for a whole sweep
    /// and for a merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// A merge's parts: each shard's sweep id, in shard order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<String>,
    /// A merge's shards whose summaries were not given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_shards: Vec<u32>,
    /// What the seeds ran: the `chaos` version and a digest of the
    /// validated scenario, the command line's changes included. Shards
    /// merge only when theirs are equal: the same file path on two
    /// machines may hold two scenarios. Empty in summaries from before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
}

/// The fingerprint of a sweep of `sc` ([`Summary::fingerprint`]): the
/// version, and an FNV-1a digest of the scenario as JSON with its seed at
/// 0 (each seed sets its own). FNV, not the standard hasher, because it is
/// the same in every build.
pub fn fingerprint(sc: &crate::scenario::Scenario) -> String {
    let json = serde_json::to_string(&sc.clone().with_seed(0)).unwrap_or_default();
    let digest = json.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("chaos {} ({}) · scenario {digest:016x}", env!("CARGO_PKG_VERSION"), env!("CHAOS_COMMIT"))
}

impl Summary {
    /// A summary with no seed run yet, under a new id `<prefix>-<run id>`.
    fn empty(prefix: &str, scenario: &str, swarm: bool, first_seed: u64, seeds_asked: u32) -> Self {
        Self {
            sweep_id: format!("{prefix}-{}", crate::domain::names::RunNames::new().run_id),
            scenario: scenario.to_string(),
            backend: String::new(),
            swarm,
            first_seed,
            seeds_asked,
            rows: vec![],
            passed: 0,
            failed: 0,
            inconclusive: 0,
            incomplete: 0,
            interrupted: false,
            shrink: None,
            seconds: 0.0,
            shard: None,
            merged: vec![],
            missing_shards: vec![],
            fingerprint: String::new(),
        }
    }

    /// The seeds this summary was asked to run: its shard's, or every one.
    pub fn seeds_owned(&self) -> Vec<u64> {
        (0..self.seeds_asked as u64)
            .filter(|i| self.shard.is_none_or(|s| s.owns(*i)))
            .filter(|i| {
                // A merge misses the seeds of the shards it was not given.
                let count = self.merged_count();
                !self.missing_shards.iter().any(|k| Shard { index: *k, count }.owns(*i))
            })
            .map(|i| self.first_seed + i)
            .collect()
    }

    fn merged_count(&self) -> u32 {
        (self.merged.len() + self.missing_shards.len()).max(1) as u32
    }
}

/// One summary from the shards of one sweep (`chaos merge`): the same
/// scenario, first seed, seed count and swarm, each shard once. The rows
/// in seed order, the totals added up, the time the longest shard took
/// (they ran side by side), the first failure's shrink. Shards not given
/// are named, and their seeds count as never run (the command then exits
/// 5 unless told to judge a partial sweep). Shards of another backend or
/// another build are refused.
pub fn merge(mut parts: Vec<Summary>) -> Result<Summary> {
    let Some(first) = parts.first().cloned() else { return Err(Error::Usage("chaos merge: no summary given".into())) };
    let first = &first;
    let count = match first.shard {
        Some(s) => s.count,
        None => {
            return Err(Error::Usage(format!(
                "chaos merge: {} is a whole sweep, not a shard (run each part with --shard K/N)",
                first.sweep_id
            )))
        }
    };
    let same = |a: &Summary, b: &Summary| {
        a.scenario == b.scenario && a.first_seed == b.first_seed && a.seeds_asked == b.seeds_asked && a.swarm == b.swarm
    };
    for p in &parts {
        let Some(s) = p.shard else {
            return Err(Error::Usage(format!("chaos merge: {} is a whole sweep, not a shard", p.sweep_id)));
        };
        if p.fingerprint != first.fingerprint {
            return Err(Error::Usage(format!(
                "chaos merge: {} ran {:?} and {} ran {:?}: another build or another scenario; run every shard with the same chaos and the same file",
                p.sweep_id, p.fingerprint, first.sweep_id, first.fingerprint
            )));
        }
        if p.backend != first.backend {
            return Err(Error::Usage(format!(
                "chaos merge: {} ran on {} and {} on {}: a sweep's shards run on one backend; run every shard against the same services",
                p.sweep_id, p.backend, first.sweep_id, first.backend
            )));
        }
        if s.count != count || !same(first, p) {
            return Err(Error::Usage(format!(
                "chaos merge: {} (shard {s} of {} from seed {}, {} seeds) is not a shard of the same sweep as {} (shard {} of {} from seed {}, {} seeds); merge the shards of one sweep",
                p.sweep_id, p.scenario, p.first_seed, p.seeds_asked, first.sweep_id,
                first.shard.map_or(String::new(), |s| s.to_string()), first.scenario, first.first_seed, first.seeds_asked
            )));
        }
    }
    parts.sort_by_key(|p| p.shard.map_or(0, |s| s.index));
    if let Some(w) = parts.windows(2).find(|w| w[0].shard == w[1].shard) {
        return Err(Error::Usage(format!(
            "chaos merge: shard {} is given twice ({} and {})",
            w[0].shard.map_or(String::new(), |s| s.to_string()),
            w[0].sweep_id,
            w[1].sweep_id
        )));
    }
    let given: Vec<u32> = parts.iter().filter_map(|p| p.shard.map(|s| s.index)).collect();
    let mut out = Summary {
        backend: first.backend.clone(),
        merged: parts.iter().map(|p| p.sweep_id.clone()).collect(),
        missing_shards: (1..=count).filter(|k| !given.contains(k)).collect(),
        fingerprint: first.fingerprint.clone(),
        ..Summary::empty("sweep-merged", &first.scenario, first.swarm, first.first_seed, first.seeds_asked)
    };
    for p in parts {
        out.passed += p.passed;
        out.failed += p.failed;
        out.inconclusive += p.inconclusive;
        out.incomplete += p.incomplete;
        out.interrupted |= p.interrupted;
        out.seconds = out.seconds.max(p.seconds);
        out.rows.extend(p.rows);
        if let Some(sh) = p.shrink {
            if out.shrink.as_ref().is_none_or(|o| sh.seed < o.seed) {
                out.shrink = Some(sh);
            }
        }
    }
    out.rows.sort_by_key(|r| r.seed);
    Ok(out)
}

/// The seeds of the shards a merge was not given, as ranges
/// ("8-9, 12"), or "none".
pub fn missing_seeds(s: &Summary) -> String {
    let owned = s.seeds_owned();
    let all: Vec<u64> = (0..s.seeds_asked as u64).map(|i| s.first_seed + i).filter(|x| !owned.contains(x)).collect();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for seed in all {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == seed => *end = seed,
            _ => ranges.push((seed, seed)),
        }
    }
    match ranges.is_empty() {
        true => "none".into(),
        false => ranges
            .iter()
            .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
            .collect::<Vec<_>>()
            .join(", "),
    }
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
    listener.progress(&Progress::SweepStarted { seeds: opts.seeds });
    let scenario = opts.run.scenario.display().to_string();
    let mut s = Summary {
        shard: opts.shard,
        fingerprint: fingerprint(&base),
        ..Summary::empty("sweep", &scenario, opts.swarm, opts.first_seed, opts.seeds)
    };
    let mut first_failure: Option<(crate::scenario::Scenario, Report)> = None;
    let jobs = opts.jobs.max(1) as usize;
    if jobs > 1 {
        shared_between_runs(&base)?;
    }
    let owned: Vec<u64> = (0..opts.seeds)
        .filter(|i| opts.shard.is_none_or(|s| s.owns(*i as u64)))
        .map(|i| opts.first_seed + i as u64)
        .collect();
    // Set once a failure (without --keep-going) or an interrupt ends the
    // sweep: the seeds not started yet are not run; those running finish.
    let stop = std::cell::Cell::new(false);
    let tallied = std::cell::RefCell::new(tally(&s));
    let run_seed = |seed: u64| {
        let (base, stop, tallied) = (&base, &stop, &tallied);
        async move {
            if stop.get() {
                return Ok(None);
            }
            let (sc, rates) = seeded(base, seed, opts.swarm)?;
            listener.progress(&Progress::SeedStarted { seed, tally: tallied.borrow().clone() });
            let t = Instant::now();
            let (db, brokers) = (opts.run.database_url.clone(), opts.run.brokers.clone());
            let rep = execute(sc.clone(), db, brokers, &opts.run.reports_dir, &Quiet).await?;
            Ok::<_, Error>(Some((seed, sc, rates, rep, t.elapsed().as_secs_f64())))
        }
    };
    let mut runs = futures::stream::iter(owned.into_iter().map(run_seed)).buffer_unordered(jobs);
    while let Some(done) = runs.next().await {
        let Some((seed, sc, rates, rep, seconds)) = done? else { continue };
        if s.backend.is_empty() {
            s.backend = format!("{} · {}", rep.infra.database, rep.infra.broker);
        }
        let row = row(seed, &rep, rates, seconds);
        listener.progress(&Progress::SeedFinished {
            seed,
            verdict: row.verdict,
            seconds: row.seconds,
            reason: &row.reason,
        });
        s.count(rep.verdict);
        s.rows.push(row);
        *tallied.borrow_mut() = tally(&s);
        // With several seeds at once, the first failure is the lowest seed's.
        if rep.verdict == Verdict::Fail && first_failure.as_ref().is_none_or(|(f, _)| sc.seed < f.seed) {
            first_failure = Some((sc, rep));
            if !opts.keep_going {
                stop.set(true);
            }
        }
        if s.interrupted {
            stop.set(true);
        }
    }
    drop(runs);
    s.rows.sort_by_key(|r| r.seed);
    listener.progress(&Progress::SweepFinished);
    if let (Some(budget), Some((sc, rep)), false) = (opts.shrink, first_failure, s.interrupted) {
        s.shrink = Some(crate::campaigns::shrink::shrink(&sc, &rep, &opts.run.reports_dir, budget, listener).await?);
    }
    s.seconds = started.elapsed().as_secs_f64();
    Ok(s)
}

/// The scenario of one seed: with `--swarm`, its fault rates drawn from
/// the seed too, and each one drawn.
fn seeded(base: &crate::scenario::Scenario, seed: u64, swarm: bool) -> Result<(crate::scenario::Scenario, Vec<Rate>)> {
    let mut sc = base.clone().with_seed(seed);
    let mut rates = vec![];
    if swarm {
        for (p, r) in swarm_rates(&sc.faults, seed) {
            sc = sc.with_rate(p, r)?;
            rates.push(Rate { point: p.name().into(), probability: r });
        }
    }
    Ok((sc, rates))
}

impl Summary {
    /// Counts one run's verdict.
    fn count(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Pass => self.passed += 1,
            Verdict::Fail => self.failed += 1,
            Verdict::Inconclusive => self.inconclusive += 1,
            Verdict::Incomplete => self.incomplete += 1,
            Verdict::Interrupted => self.interrupted = true,
        }
    }
}

/// Refuses `--jobs` above 1 for a scenario whose runs would share
/// something beyond the services: a service fault on the timeline (a
/// broker killed, the database restarted) would strike every run at once,
/// logged in one. The fault proxy's Kafka side is no reason: each run
/// takes free slots of the broker's twenty, and waits for them.
fn shared_between_runs(sc: &crate::scenario::Scenario) -> Result<()> {
    if let Some(t) = sc.timeline.iter().find(|t| t.point.is_service()) {
        return Err(Error::Usage(format!(
            "--jobs above 1 cannot run a scenario whose timeline has {}: it would strike every run at once; use --jobs 1, or shards on several machines (--shard K/N)",
            t.point.name()
        )));
    }
    Ok(())
}

/// The sweep's verdict in one word, as its exit code has it.
fn exit_word(s: &Summary) -> &'static str {
    match (s.interrupted, s.failed, s.incomplete, s.inconclusive) {
        (true, ..) => "INTERRUPTED",
        (_, f, ..) if f > 0 => "FAIL",
        (_, _, i, _) if i > 0 => "INCOMPLETE",
        (_, _, _, i) if i > 0 => "INCONCLUSIVE",
        _ => "PASS",
    }
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

    /// Writes `<dir>/<sweep-id>.json` and its page, `<sweep-id>.html`;
    /// returns the JSON's path.
    pub fn save(&self, dir: &std::path::Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Write { path: dir.into(), cause: e.to_string() })?;
        let path = dir.join(format!("{}.json", self.sweep_id));
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::Write { path: path.clone(), cause: e.to_string() })?;
        let page = dir.join(format!("{}.html", self.sweep_id));
        std::fs::write(&page, self.html()).map_err(|e| Error::Write { path: page, cause: e.to_string() })?;
        Ok(path)
    }

    /// The sweep as one self-contained HTML page, in a run's page's style:
    /// the totals, then a row
    /// per seed asked for (a seed never run, or of a shard not merged, says
    /// so), each run's verdict, anomalies, replay command and a link to its
    /// own page, which sits beside it when the run wrote its reports here.
    pub fn html(&self) -> String {
        use crate::report::html::esc;
        use std::fmt::Write;
        let verdict = exit_word(self);
        let class = if self.failed > 0 {
            "fail"
        } else if verdict == "PASS" {
            "pass"
        } else {
            "other"
        };
        let heading = format!("{} <span class=\"{class}\">{verdict}</span>", esc(&self.sweep_id));
        let mut out = String::new();
        let _ = write!(
            out,
            "<p>scenario <code>{scenario}</code> · {backend} · seeds {first}–{last}{swarm}{shards} · {secs:.0} s</p>\
             <p class=\"totals\">{passed} pass · {failed} fail · {inconclusive} inconclusive · {incomplete} incomplete · {never} not run</p>\
             <p>fingerprint <code>{fp}</code></p>",
            scenario = esc(&self.scenario),
            backend = esc(&self.backend),
            first = self.first_seed,
            last = self.first_seed + self.seeds_asked.max(1) as u64 - 1,
            swarm = if self.swarm { " · swarm rates" } else { "" },
            shards = if self.merged.is_empty() { String::new() } else { format!(" · {} shards merged", self.merged.len()) },
            secs = self.seconds,
            passed = self.passed,
            failed = self.failed,
            inconclusive = self.inconclusive,
            incomplete = self.incomplete,
            never = (self.seeds_asked as usize).saturating_sub(self.rows.len()),
            fp = esc(&self.fingerprint),
        );
        out.push_str("<table><thead><tr><th>seed</th><th>verdict</th><th>anomalies</th><th>faults fired</th><th>duplicates on topic</th><th>time</th><th>replay</th></tr></thead><tbody>\n");
        let owned = self.seeds_owned();
        for seed in self.first_seed..self.first_seed + self.seeds_asked as u64 {
            match self.rows.iter().find(|r| r.seed == seed) {
                Some(r) => {
                    let class = match r.verdict {
                        Verdict::Pass => "pass",
                        Verdict::Fail => "fail",
                        _ => "other",
                    };
                    let _ = writeln!(
                        out,
                        "<tr class=\"seed\"><td><a href=\"{run}.html\">{seed}</a></td><td class=\"{class}\">{v}</td><td>{a}</td><td>{f}</td><td>{d}</td><td>{t:.1} s</td><td><code>{replay}</code></td></tr>",
                        run = esc(&r.run_id),
                        v = r.verdict.as_str(),
                        a = esc(&r.anomalies.join(", ")),
                        f = r.faults_fired,
                        d = r.topic_duplicates,
                        t = r.seconds,
                        replay = esc(&r.replay),
                    );
                }
                None => {
                    let why = if owned.contains(&seed) {
                        "not run: the sweep stopped first"
                    } else {
                        "not run here: another shard's"
                    };
                    let _ = writeln!(out, "<tr class=\"seed\"><td>{seed}</td><td class=\"other\">{why}</td><td></td><td></td><td></td><td></td><td></td></tr>");
                }
            }
        }
        out.push_str("</tbody></table>\n");
        crate::report::html::page(&self.sweep_id, &heading, &out)
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
    let owned = s.seeds_owned().len();
    let part = match (&s.shard, s.merged.len()) {
        (Some(sh), _) => format!(" (shard {sh} of {} seeds)", s.seeds_asked),
        (None, n) if n > 0 => format!(" (a merge of {n} shards)"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "{ran} of {owned} seed(s){part} run on {}: {} pass, {} fail, {} inconclusive, {} incomplete{} in {:.0} s\n",
        s.backend,
        s.passed,
        s.failed,
        s.inconclusive,
        s.incomplete,
        if s.interrupted { ", interrupted," } else { "" },
        s.seconds
    ));
    if !s.missing_shards.is_empty() {
        let missing: Vec<String> = s.missing_shards.iter().map(|k| format!("{k}/{}", s.merged_count())).collect();
        out.push_str(&format!("shards not merged, their seeds not run here: {}\n", missing.join(", ")));
    }
    if ran < owned && s.failed > 0 && !s.interrupted {
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

    fn shard_summary(index: u32, count: u32, seeds: u32, failed_seed: Option<u64>) -> Summary {
        let shard = Shard { index, count };
        let rows: Vec<SeedRow> = (0..seeds as u64)
            .filter(|i| shard.owns(*i))
            .map(|i| SeedRow {
                seed: 1 + i,
                verdict: if Some(1 + i) == failed_seed { Verdict::Fail } else { Verdict::Pass },
                reason: String::new(),
                topic_duplicates: 0,
                duplicates_absorbed: 0,
                faults_fired: 1,
                anomalies: vec![],
                examples: vec![],
                seconds: 1.0 + index as f64,
                rates: vec![],
                replay: format!("chaos run s.toml --seed {}", 1 + i),
                run_id: format!("run-{i}"),
            })
            .collect();
        Summary {
            sweep_id: format!("sweep-{index}"),
            scenario: "s.toml".into(),
            backend: "sqlite · mock".into(),
            swarm: false,
            first_seed: 1,
            seeds_asked: seeds,
            passed: rows.iter().filter(|r| r.verdict == Verdict::Pass).count(),
            failed: rows.iter().filter(|r| r.verdict == Verdict::Fail).count(),
            rows,
            inconclusive: 0,
            incomplete: 0,
            interrupted: false,
            shrink: None,
            seconds: 1.0 + index as f64,
            shard: Some(shard),
            merged: vec![],
            missing_shards: vec![],
            fingerprint: "chaos 0.1.0 · scenario 00000000000000aa".into(),
        }
    }

    #[test]
    fn shards_share_the_seeds_each_once() {
        assert_eq!(Shard::parse("2/8"), Ok(Shard { index: 2, count: 8 }));
        for bad in ["0/8", "9/8", "1/0", "a/b", "3", "1/20000"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        let shards: Vec<Shard> = (1..=3).map(|k| Shard { index: k, count: 3 }).collect();
        for i in 0..100u64 {
            assert_eq!(shards.iter().filter(|s| s.owns(i)).count(), 1, "seed index {i}");
        }
    }

    #[test]
    fn a_merge_is_the_whole_sweep_and_names_what_is_missing() {
        let m = merge(vec![shard_summary(2, 2, 5, Some(4)), shard_summary(1, 2, 5, None)]).unwrap();
        assert_eq!(m.rows.iter().map(|r| r.seed).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!((m.passed, m.failed), (4, 1));
        assert_eq!(m.seconds, 3.0, "the longest shard, not the sum");
        assert_eq!(m.merged, vec!["sweep-1", "sweep-2"]);
        assert!(m.missing_shards.is_empty() && m.shard.is_none());
        assert_eq!(m.seeds_owned(), vec![1, 2, 3, 4, 5]);

        let part = merge(vec![shard_summary(1, 3, 9, None), shard_summary(3, 3, 9, None)]).unwrap();
        assert_eq!(part.missing_shards, vec![2]);
        assert_eq!(part.seeds_owned(), vec![1, 3, 4, 6, 7, 9], "shard 2/3's seeds are not owned");
        assert!(render(&part).contains("shards not merged, their seeds not run here: 2/3"), "{}", render(&part));
    }

    #[test]
    fn a_sweeps_page_has_a_row_per_seed_asked_for() {
        let part = merge(vec![shard_summary(1, 3, 9, Some(4)), shard_summary(3, 3, 9, None)]).unwrap();
        let page = part.html();
        assert_eq!(page.matches("<tr class=\"seed\">").count(), 9, "{page}");
        assert!(page.contains("<span class=\"fail\">FAIL</span>"), "{page}");
        assert_eq!(page.matches("not run here: another shard's").count(), 3, "shard 2/3's seeds 2, 5, 8: {page}");
        assert!(page.contains("<a href=\"run-3.html\">4</a></td><td class=\"fail\">fail"), "{page}");
        assert!(page.contains("5 pass · 1 fail"), "{page}");
        assert!(!page.contains("src=") && !page.contains("<script"), "the page loads nothing");
    }

    #[test]
    fn a_merge_refuses_parts_of_different_sweeps() {
        let e = |parts| merge(parts).unwrap_err().to_string();
        assert!(
            e(vec![shard_summary(1, 2, 5, None), shard_summary(1, 2, 5, None)]).contains("shard 1/2 is given twice")
        );
        assert!(e(vec![shard_summary(1, 2, 5, None), shard_summary(2, 2, 6, None)])
            .contains("not a shard of the same sweep"));
        assert!(e(vec![shard_summary(1, 2, 5, None), shard_summary(2, 3, 5, None)])
            .contains("not a shard of the same sweep"));
        // Another build or another scenario behind the same path: refused,
        // naming both.
        let mut other = shard_summary(2, 2, 5, None);
        other.fingerprint = "chaos 0.2.0 · scenario 00000000000000aa".into();
        let refused = e(vec![shard_summary(1, 2, 5, None), other]);
        assert!(refused.contains("sweep-2 ran \"chaos 0.2.0") && refused.contains("sweep-1 ran"), "{refused}");
        let mut whole = shard_summary(1, 1, 5, None);
        whole.shard = None;
        assert!(e(vec![whole]).contains("is a whole sweep, not a shard"));
        assert!(e(vec![]).contains("no summary given"));
        // An embedded shard beside one of the real services: refused,
        // naming both backends.
        let mut real = shard_summary(2, 2, 5, None);
        real.backend = "PostgreSQL + Kafka".into();
        let refused = e(vec![shard_summary(1, 2, 5, None), real]);
        assert!(refused.contains("ran on PostgreSQL + Kafka") && refused.contains("one backend"), "{refused}");
    }

    /// A merge missing shards names the seeds that never ran, as ranges.
    #[test]
    fn the_missing_shards_seeds_are_named() {
        let part = merge(vec![shard_summary(1, 3, 9, None)]).unwrap();
        assert_eq!(missing_seeds(&part), "2-3, 5-6, 8-9");
        let whole = merge(vec![shard_summary(1, 2, 4, None), shard_summary(2, 2, 4, None)]).unwrap();
        assert_eq!(missing_seeds(&whole), "none");
    }

    /// Two builds of one version are told apart: the fingerprint carries
    /// the commit the binary was built from.
    #[test]
    fn the_fingerprint_names_the_build() {
        let sc = crate::scenario::parse("name = \"x\"\n", std::path::Path::new("x.toml")).unwrap();
        assert!(fingerprint(&sc).contains(env!("CHAOS_COMMIT")), "{}", fingerprint(&sc));
    }
}
