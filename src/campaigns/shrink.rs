//! `chaos sweep --shrink`: a failure made small enough to understand.
//!
//! A failing run's report lists every firing by occurrence (`fired`, a
//! [`Schedule`]). The shrinker replays the same seed with that schedule
//! pinned, then with fewer payments (halving while the failure stays), then
//! with groups of firings switched off: delta debugging (Zeller's ddmin,
//! complements only), keeping each smaller schedule that still fails with
//! one of the original anomalies. It ends when no single firing can go, or
//! when its replay budget is spent (then a smaller schedule may exist, and
//! it says so).
//!
//! Every replay runs on the embedded backend (SQLite and librdkafka's mock
//! cluster), whatever the sweep ran on: there, replay is closest to
//! deterministic. It is not fully so: occurrences are counted as the
//! threads reach the points, and which relay's batch is the 7th can change
//! between runs. So the first replay checks that the failure reproduces at
//! all, and the minimal schedule is replayed once more at the end; the
//! result says when either did not.

use crate::campaigns::{Listener, Progress};
use crate::error::Result;
use crate::faults::{FaultPoint, Schedule};
use crate::harness::run::{execute, Quiet};
use crate::report::Report;
use crate::scenario::Scenario;
use crate::verifier::Verdict;
use comfy_table::{presets, Cell, Table};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// The replays `--shrink` may take when `--shrink-runs` is not given.
pub const DEFAULT_BUDGET: u32 = 40;

/// Replays of the minimal schedule at the end, whose tally is reported:
/// how reliably the small failure comes back.
pub const CONFIRMATIONS: u32 = 3;

/// Of the [`CONFIRMATIONS`], how many must fail the same way for a step to
/// be given. A majority, not one: with a few payments a firing pinned to a
/// late occurrence may be reached in one replay of three, and a minimal
/// replay that rarely fires is no use to the one who runs it.
pub const CONFIRMED_ENOUGH: u32 = 2;

/// A shrunk failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shrunk {
    pub seed: u64,
    /// The anomalies a replay must show to count as the same failure (any
    /// one of them); empty when the failure had none (only an invariant).
    pub anomalies: Vec<String>,
    /// The first replay, with every original firing, failed as the original did.
    pub reproduced: bool,
    /// Of [`CONFIRMATIONS`] more replays of the minimal schedule, how many
    /// failed the same way.
    pub confirmed: u32,
    pub confirmations: u32,
    /// Replays taken, and whether the budget ran out before the end.
    pub runs: u32,
    pub budget_spent: bool,
    pub seconds: f64,
    pub from_firings: usize,
    pub from_payments: u64,
    pub payments: u64,
    /// The minimal schedule, as `--schedule` reads it.
    pub schedule: String,
    /// Each firing of the minimal schedule, as its last replay saw it.
    pub firings: Vec<Firing>,
    /// What the minimal failure's last replay found, as "count × name".
    pub found: Vec<String>,
    /// The command that replays the minimal failure (embedded backend).
    pub replay: String,
    /// Where the replays' reports are.
    pub reports: String,
    pub note: String,
}

/// One firing of a shrunk schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Firing {
    pub point: String,
    pub occurrence: u64,
    pub component: String,
    pub at_ms: u64,
    pub hit: String,
}

struct Shrinker<'a> {
    base: Scenario,
    anomalies: &'a [String],
    dir: std::path::PathBuf,
    runs: u32,
    budget: u32,
    listener: &'a dyn Listener,
    /// Ctrl-C came during a replay: no more replays.
    interrupted: bool,
}

impl Shrinker<'_> {
    /// Halves the payments while the failure stays. Each halving gets two
    /// replays, as the first reproduction does: on a busy machine one
    /// replay of a timing-dependent failure can miss it, and one miss
    /// would end the shrinking of the payments there.
    async fn fewer_payments(&mut self, best: &mut Schedule, payments: &mut u64, last: &mut Report) -> Result<()> {
        while *payments > 1 {
            let mut found = None;
            for _ in 0..2 {
                found = self.trial(best, *payments / 2).await?;
                if found.is_some() {
                    break;
                }
            }
            let Some(rep) = found else { return Ok(()) };
            *payments /= 2;
            *best = rep.fired.clone();
            *last = rep;
        }
        Ok(())
    }

    /// Fewer firings: ddmin over the complements. Keeps any smaller
    /// schedule that still fails with one of the original anomalies.
    async fn fewer_firings(&mut self, best: &mut Schedule, payments: u64, last_rep: &mut Report) -> Result<()> {
        let mut n = 2usize;
        loop {
            let items = best.firings();
            if items.is_empty() || self.runs >= self.budget {
                break;
            }
            let chunks = split(&items, n.min(items.len()));
            let mut reduced = false;
            for chunk in &chunks {
                let rest = Schedule::from_firings(items.iter().copied().filter(|f| !chunk.contains(f)));
                if let Some(rep) = self.trial(&rest, payments).await? {
                    *best = rep.fired.clone();
                    *last_rep = rep;
                    n = n.saturating_sub(1).max(2);
                    reduced = true;
                    break;
                }
            }
            if !reduced {
                if chunks.len() >= items.len() {
                    break;
                }
                n = (n * 2).min(items.len());
            }
        }
        Ok(())
    }

    /// Each firing moved to an earlier occurrence while the failure stays.
    async fn earlier_occurrences(&mut self, best: &mut Schedule, payments: u64, last_rep: &mut Report) -> Result<()> {
        // Earlier occurrences: a firing at the 40th batch needs a run that
        // reaches 40 batches, which a replay with other timing may not; the
        // first batch is in every run. Each firing is tried at 0, then halfway.
        for (p, n) in best.firings() {
            for earlier in [0, n / 2] {
                if earlier >= n {
                    continue;
                }
                let moved =
                    Schedule::from_firings(
                        best.firings().into_iter().map(|f| if f == (p, n) { (p, earlier) } else { f }),
                    );
                if moved.len() < best.len() {
                    continue;
                }
                if let Some(rep) = self.trial(&moved, payments).await? {
                    *best = rep.fired.clone();
                    *last_rep = rep;
                    break;
                }
            }
        }
        Ok(())
    }

    /// One replay; the report when it failed as the original did, None
    /// when it did not (or the budget is spent).
    async fn trial(&mut self, schedule: &Schedule, payments: u64) -> Result<Option<Report>> {
        if self.runs >= self.budget {
            return Ok(None);
        }
        self.runs += 1;
        let sc = self.base.clone().with_payments(payments)?.with_schedule(schedule.clone())?;
        let rep = execute(sc, None, None, &self.dir, &Quiet).await?;
        let same = rep.verdict == Verdict::Fail
            && (self.anomalies.is_empty()
                || rep.anomalies.iter().any(|a| !a.allowed && self.anomalies.contains(&a.name)));
        self.listener.progress(&Progress::Replayed {
            run: self.runs,
            budget: self.budget,
            firings: schedule.len(),
            payments,
            outcome: if same { "fails the same way" } else { rep.verdict.as_str() },
        });
        if rep.verdict == Verdict::Interrupted {
            // Stop here: no more replays after Ctrl-C.
            self.budget = self.runs;
            self.interrupted = true;
        }
        Ok(same.then_some(rep))
    }
}

impl Shrinker<'_> {
    /// Replays the failure with every original firing pinned, twice at
    /// most: does it come back at all?
    async fn reproduce(&mut self, fired: &Schedule, payments: u64) -> Result<Option<Report>> {
        for _ in 0..2 {
            if let Some(rep) = self.trial(fired, payments).await? {
                return Ok(Some(rep));
            }
        }
        Ok(None)
    }

    /// The minimal failure a few times more: how reliably does it come
    /// back? When in fewer than [`CONFIRMED_ENOUGH`] of them, the step
    /// before it, and so on back to the first: the schedule given (`best`)
    /// is the smallest one that failed again in most of its replays, when
    /// there is one. These replays are not charged to the budget.
    /// Returns the smaller steps that did not.
    async fn confirm_smallest(
        &mut self,
        mut steps: Vec<(Schedule, u64, Report)>,
        out: &mut Shrunk,
        (best, payments, last_rep): (&mut Schedule, &mut u64, &mut Report),
    ) -> Result<Vec<String>> {
        let mut unconfirmed: Vec<String> = Vec::new();
        while let Some((schedule, at, rep)) = steps.pop() {
            if out.confirmations > 0 {
                unconfirmed.push(format!("{best} with {payments} payments"));
            }
            (*best, *payments, *last_rep) = (schedule, at, rep);
            self.budget = self.budget.max(self.runs + CONFIRMATIONS);
            (out.confirmed, out.confirmations) = (0, 0);
            for _ in 0..CONFIRMATIONS {
                out.confirmations += 1;
                if let Some(rep) = self.trial(best, *payments).await? {
                    out.confirmed += 1;
                    *last_rep = rep;
                }
            }
            if out.confirmed >= CONFIRMED_ENOUGH || self.interrupted {
                break;
            }
        }
        Ok(unconfirmed)
    }
}

/// Shrinks the failure of `failed`, a run of `sc`, with at most `budget`
/// replays written under `reports_dir`.
pub async fn shrink(
    sc: &Scenario,
    failed: &Report,
    reports_dir: &Path,
    budget: u32,
    listener: &dyn Listener,
) -> Result<Shrunk> {
    let started = Instant::now();
    let anomalies: Vec<String> = failed.anomalies.iter().filter(|a| !a.allowed).map(|a| a.name.clone()).collect();
    let dir = reports_dir.join(format!("shrink-{}", failed.run_id));
    let mut s = Shrinker {
        base: sc.clone().embedded(),
        anomalies: &anomalies,
        dir: dir.clone(),
        runs: 0,
        budget,
        listener,
        interrupted: false,
    };
    let mut out = Shrunk::start(sc, failed, &anomalies, &dir);
    if let Some(why) = unshrinkable(sc) {
        out.note = why.into();
        return Ok(out);
    }

    // Does the failure come back at all, with every original firing pinned?
    let mut payments = sc.payments;
    let Some(mut last_rep) = s.reproduce(&failed.fired, payments).await? else {
        out.runs = s.runs;
        out.seconds = started.elapsed().as_secs_f64();
        out.note = format!(
            "not reproduced: {} replay(s) of seed {} with its {} firing(s) pinned did not fail the same way on the embedded backend; the failure depends on timing the seed does not control (or on the backend it ran on)",
            s.runs,
            sc.seed,
            failed.fired.len()
        );
        return Ok(out);
    };
    out.reproduced = true;
    let mut best = last_rep.fired.clone();
    // Each step's result, smallest last: a step is kept when one replay
    // failed, and on a busy machine one failure may be luck. If the
    // smallest never fails again, the one before it is confirmed instead.
    let mut steps = vec![(best.clone(), payments, last_rep.clone())];
    let mut keep = |best: &Schedule, payments: u64, rep: &Report| {
        if steps.last().is_none_or(|(b, p, _)| b != best || *p != payments) {
            steps.push((best.clone(), payments, rep.clone()));
        }
    };

    // Fewer payments: halve while the failure stays.
    s.fewer_payments(&mut best, &mut payments, &mut last_rep).await?;
    keep(&best, payments, &last_rep);

    // Fewer firings: ddmin over the complements.
    s.fewer_firings(&mut best, payments, &mut last_rep).await?;
    keep(&best, payments, &last_rep);

    // Earlier occurrences.
    s.earlier_occurrences(&mut best, payments, &mut last_rep).await?;
    keep(&best, payments, &last_rep);
    // Early firings may need fewer payments than late ones did.
    s.fewer_payments(&mut best, &mut payments, &mut last_rep).await?;
    keep(&best, payments, &last_rep);
    out.budget_spent = s.runs >= s.budget;

    let unconfirmed = s.confirm_smallest(steps, &mut out, (&mut best, &mut payments, &mut last_rep)).await?;
    out.runs = s.runs;
    out.seconds = started.elapsed().as_secs_f64();
    out.conclude(&best, payments, &last_rep, budget, &unconfirmed);
    Ok(out)
}

impl Shrunk {
    /// The smallest failure given (`best` with `payments`, last seen as
    /// `last_rep`), and the note that says how far the shrink got.
    fn conclude(&mut self, best: &Schedule, payments: u64, last_rep: &Report, budget: u32, unconfirmed: &[String]) {
        self.payments = payments;
        self.schedule = best.to_string();
        self.firings = firings(best, last_rep);
        self.found =
            last_rep.anomalies.iter().filter(|a| !a.allowed).map(|a| format!("{} × {}", a.count, a.name)).collect();
        self.replay = last_rep.replay.clone();
        self.note = note(self, budget, best.is_empty());
        if !unconfirmed.is_empty() {
            self.note.push_str(&format!(
                "; smaller, {} failed in fewer than {CONFIRMED_ENOUGH} of {CONFIRMATIONS} replays, so the step before is given",
                unconfirmed.join(", then ")
            ));
        }
    }

    /// The result before any replay: where the shrink starts from.
    fn start(sc: &Scenario, failed: &Report, anomalies: &[String], dir: &Path) -> Self {
        Shrunk {
            seed: sc.seed,
            anomalies: anomalies.to_vec(),
            reproduced: false,
            confirmed: 0,
            confirmations: 0,
            runs: 0,
            budget_spent: false,
            seconds: 0.0,
            from_firings: failed.fired.len(),
            from_payments: sc.payments,
            payments: sc.payments,
            schedule: failed.fired.to_string(),
            firings: vec![],
            found: vec![],
            replay: String::new(),
            reports: dir.display().to_string(),
            note: String::new(),
        }
    }
}

/// Why a scenario cannot be shrunk, if it cannot.
fn unshrinkable(sc: &Scenario) -> Option<&'static str> {
    if sc.components == crate::scenario::Components::Process
        || sc.notifier.command.is_some()
        || sc.relay.command.is_some()
    {
        return Some("not shrunk: a component that runs as a process counts its own occurrences, so a schedule cannot pin them; shrink a scenario with components = \"in-process\"");
    }
    if sc.proxied() || !sc.timeline.is_empty() {
        return Some("not shrunk: the shrinker replays on the embedded backend, which has no fault proxy and no service faults; this scenario needs them");
    }
    None
}

/// What the shrink ended with, in one sentence with its tally.
fn note(out: &Shrunk, budget: u32, no_firing: bool) -> String {
    let tally = format!("{} of {} replays of it failed the same way", out.confirmed, out.confirmations);
    match (out.confirmed, out.budget_spent, no_firing) {
        (0, _, _) => format!("{tally}: the failure also depends on timing the schedule does not pin; this is the smallest schedule seen failing"),
        (_, _, true) => format!("it fails with no fault at all, a bug that needs no crash; {tally}"),
        (_, true, _) => format!("the replay budget ({budget}) ran out, so a smaller schedule may exist (--shrink-runs); {tally}"),
        (_, false, _) => format!("no firing can be switched off or moved earlier without the failure going; {tally}"),
    }
}

/// Splits `items` into `n` runs of nearly equal length, in order.
fn split<T: Copy>(items: &[T], n: usize) -> Vec<Vec<T>> {
    let n = n.max(1);
    let (q, r) = (items.len() / n, items.len() % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let len = q + usize::from(i < r);
        out.push(items[at..at + len].to_vec());
        at += len;
    }
    out.retain(|c| !c.is_empty());
    out
}

/// Each firing of `schedule`, with what it hit in `rep`'s fault log.
fn firings(schedule: &Schedule, rep: &Report) -> Vec<Firing> {
    schedule
        .firings()
        .into_iter()
        .map(|(p, n): (FaultPoint, u64)| {
            let seen = rep.fault_log.iter().find(|r| r.point == p.name() && r.occurrence == Some(n));
            Firing {
                point: p.name().into(),
                occurrence: n,
                component: seen.map(|r| r.component.clone()).unwrap_or_default(),
                at_ms: seen.map_or(0, |r| r.at_ms),
                hit: seen.map(|r| r.hit.clone()).unwrap_or_else(|| "not reached in the last replay".into()),
            }
        })
        .collect()
}

/// The shrunk failure as text: what it came from, the minimal schedule and
/// its replay command.
pub fn render(s: &Shrunk) -> String {
    let mut out = format!("\nshrink of seed {} ({} replays, {:.0} s, embedded backend):\n", s.seed, s.runs, s.seconds);
    if !s.reproduced {
        out.push_str(&format!("  {}\n", s.note));
        return out;
    }
    out.push_str(&format!(
        "  from {} firing(s) and {} payments to {} firing(s) and {} payments; it still finds {}\n",
        s.from_firings,
        s.from_payments,
        s.firings.len(),
        s.payments,
        if s.found.is_empty() { "the violation".to_string() } else { s.found.join(", ") }
    ));
    if !s.firings.is_empty() {
        let mut t = Table::new();
        t.load_preset(presets::UTF8_FULL_CONDENSED);
        t.set_header(vec!["fault", "occurrence", "component", "at", "hit"]);
        for f in &s.firings {
            t.add_row(vec![
                Cell::new(&f.point),
                Cell::new(f.occurrence),
                Cell::new(&f.component),
                Cell::new(format!("{} ms", f.at_ms)),
                Cell::new(&f.hit),
            ]);
        }
        out.push_str(&format!("{t}\n"));
    }
    out.push_str(&format!("  {}\n", s.note));
    out.push_str(&format!(
        "  replay (embedded: DATABASE_URL and KAFKA_BROKERS unset): {}\n  replays' reports: {}\n",
        s.replay, s.reports
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_item_once_in_order() {
        let items: Vec<u32> = (0..10).collect();
        for n in 1..=12 {
            let chunks = split(&items, n);
            assert_eq!(chunks.concat(), items, "n = {n}");
            assert_eq!(chunks.len(), n.min(10));
            let (lo, hi) = (chunks.iter().map(Vec::len).min().unwrap(), chunks.iter().map(Vec::len).max().unwrap());
            assert!(hi - lo <= 1, "n = {n}: lengths {lo}..{hi}");
        }
        assert!(split::<u32>(&[], 2).is_empty());
    }
}
