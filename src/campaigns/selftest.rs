//! `chaos selftest`: proof that the verifier can fail. Each classic mistake
//! of the outbox and the inbox is a real code path of the reference pipeline,
//! switched on in a scenario and paired with the fault that exposes it. The
//! selftest runs every one and checks that the verifier reports the expected
//! anomaly, then runs the correct pipeline under all those faults at once and
//! checks that it reports nothing.
//!
//! Reliability: each variant's fault rate is sized so that one run exposes
//! the mistake many times over (most variants give the expected number of
//! exposing faults per run), and a variant gets up to
//! [`MAX_ATTEMPTS`] runs with different seeds. The figures measured on this
//! project's machines are in the README.

use crate::campaigns::{Listener, Progress};
use crate::error::{Error, Result};
use crate::harness::run::{execute, Quiet};
use crate::report::Report;
use crate::scenario;
use crate::verifier::{AnomalyKind, Verdict};
use comfy_table::{presets, Cell, Table};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Runs a variant may take before it counts as missed.
pub const MAX_ATTEMPTS: u32 = 3;

/// One classic mistake, as the selftest runs it.
pub struct Variant {
    pub name: &'static str,
    pub mistake: &'static str,
    pub fault: &'static str,
    /// The anomaly the verifier must report.
    pub expected: AnomalyKind,
    /// Its fault needs the fault proxy, so PostgreSQL: on SQLite the
    /// variant is left out (and said so).
    pub needs_postgres: bool,
    /// The scenario: the switch that selects the mistake, and the fault.
    pub scenario: &'static str,
}

/// The common part of every selftest scenario: small, quick, and enough
/// traffic for the faults to find the mistakes.
const BASE: &str = r#"
[workload]
payments = 300
producers = 4
[topic]
partitions = 4
[relay]
instances = 2
batch_size = 20
[notifier]
instances = 2
batch_size = 20
session_timeout_ms = 2000
[run]
drain_timeout_secs = 90
"#;

pub const CATALOGUE: &[Variant] = &[
    Variant {
        name: "inbox off",
        mistake: "no deduplication at all",
        fault: "relay.after_produce 0.2, notifier.before_offset_commit 0.01",
        expected: AnomalyKind::DuplicateEffect,
        // ~7 crashed relay batches of ~20 events each, all redelivered.
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "off"
faults.relay_after_produce = 0.2
faults.notifier_before_offset_commit = 0.01
"#,
    },
    Variant {
        name: "check-then-act",
        mistake: "SELECT the inbox, process, then INSERT; no unique key, no single transaction",
        fault: "notifier.stall 0.25: a zombie wakes after its replacement processed its batch",
        expected: AnomalyKind::DuplicateEffect,
        // ~7 stalls a run. Each freezes a notifier between its check and its
        // act; its replacement processes the same messages, then the zombie
        // wakes and acts on its stale check.
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "check-then-act"
faults.notifier_stall = 0.25
"#,
    },
    Variant {
        name: "separate transactions",
        mistake: "the inbox insert commits in its own transaction, the effects in another",
        fault: "notifier.mid_batch 0.25: a crash between the two",
        expected: AnomalyKind::MissingEffect,
        // ~7 crashes, each after claiming a batch that holds captured events.
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "separate-transactions"
faults.notifier_mid_batch = 0.25
"#,
    },
    Variant {
        name: "commit offset first",
        mistake: "the offset is committed before the batch is processed",
        fault: "notifier.mid_batch 0.25: a crash after the commit, before the effects",
        expected: AnomalyKind::MissingEffect,
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "commit-offset-first"
faults.notifier_mid_batch = 0.25
"#,
    },
    Variant {
        name: "consumer-made id",
        mistake: "the dedup key is generated on consumption, not taken from the producer",
        fault: "relay.after_produce 0.2 and notifier.before_offset_commit 0.01: redelivery",
        expected: AnomalyKind::DuplicateEffect,
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "consumer-made-id"
faults.relay_after_produce = 0.2
faults.notifier_before_offset_commit = 0.01
"#,
    },
    Variant {
        name: "retention too short",
        mistake: "inbox rows are purged before the redelivery window closes",
        fault: "notifier.replay 0.25: the group's offsets rewound behind purged ids",
        expected: AnomalyKind::DuplicateEffect,
        // Inbox rows live 100 ms; a replay re-reads its partition from the
        // start, whose ids are purged by then. Sixteen small partitions keep
        // each replay short (a replayed batch may replay again: ~2 batches
        // × 0.25 = 0.5 follow-ups, so replays die out) while giving ~7
        // replays a run.
        needs_postgres: false,
        scenario: r#"
topic.partitions = 16
retention.inbox = "100ms"
retention.purge_interval_ms = 50
faults.notifier_replay = 0.25
"#,
    },
    Variant {
        name: "mark before publish",
        mistake: "the relay marks rows published and commits, then produces",
        fault: "relay.before_produce 0.2: a crash between the two",
        expected: AnomalyKind::LostEvent,
        needs_postgres: false,
        scenario: r#"
relay.order = "mark-then-publish"
faults.relay_before_produce = 0.2
"#,
    },
    Variant {
        name: "dual write",
        mistake: "no outbox: commit the payment, then produce directly",
        fault: "workload.after_commit 0.02: a crash between the two",
        expected: AnomalyKind::LostEvent,
        // ~12 of 600 events never produced.
        needs_postgres: false,
        scenario: r#"
workload.publish = "dual-write"
faults.workload_after_commit = 0.02
"#,
    },
    Variant {
        name: "last write wins",
        mistake: "the projection has no state guard",
        fault: "relay.slow_produce 0.05: reordering on the topic",
        expected: AnomalyKind::StaleProjection,
        // One event per batch and three relays: a slowed `authorized` lets
        // another relay publish its `captured` first, ~15 times a run.
        needs_postgres: false,
        scenario: r#"
notifier.projection = "last-write-wins"
relay.instances = 3
relay.batch_size = 1
relay.poll_interval_ms = 5
faults.relay_slow_produce = 0.05
"#,
    },
    Variant {
        name: "relay-minted id",
        mistake: "the relay mints the event id at publish time instead of sending the outbox row's",
        fault: "relay.after_produce 0.2: a republished batch carries new ids",
        expected: AnomalyKind::DuplicateEffect,
        // ~7 crashed batches of ~20 events, each republished under new ids
        // that the inbox has never seen.
        needs_postgres: false,
        scenario: r#"
relay.event_id = "minted"
faults.relay_after_produce = 0.2
"#,
    },
    Variant {
        name: "inbox keyed by message id",
        mistake: "the inbox key is the message id alone, not (message id, handler)",
        fault: "notifier.before_offset_commit 0.01: redelivery (the mistake needs none)",
        expected: AnomalyKind::MissingEffect,
        // The first handler's claim takes the key; the receipt and loyalty
        // handlers find the message taken and skip it, every time.
        needs_postgres: false,
        scenario: r#"
notifier.inbox = "message-id-only"
faults.notifier_before_offset_commit = 0.01
"#,
    },
    Variant {
        name: "delete before publish",
        mistake: "the relay deletes the outbox rows and commits, then produces",
        fault: "relay.before_produce 0.2: a crash between the two",
        expected: AnomalyKind::LostEvent,
        needs_postgres: false,
        scenario: r#"
relay.order = "delete-then-publish"
faults.relay_before_produce = 0.2
"#,
    },
    Variant {
        name: "acks not awaited",
        mistake: "the relay sends and marks without awaiting the broker's acks",
        fault: "relay.produce_error 0.2: a refused message goes unnoticed",
        expected: AnomalyKind::LostEvent,
        // ~7 refused messages a run, each marked published anyway.
        needs_postgres: false,
        scenario: r#"
relay.acks = "fire-and-forget"
faults.relay_produce_error = 0.2
"#,
    },
    Variant {
        name: "retry without idempotency key",
        mistake: "after a COMMIT whose outcome is unknown, the payment service writes the payment again under a new id",
        fault: "db.commit_ack_lost 0.02 on the payment service: the commit landed, its acknowledgement did not",
        expected: AnomalyKind::PhantomPayment,
        needs_postgres: true,
        // 600 workload commits: ~12 acknowledgements withheld, each a
        // payment that exists twice.
        scenario: r#"
workload.retry = "new-id"
proxy.targets = ["workload"]
faults.db_commit_ack_lost = 0.02
"#,
    },
    Variant {
        name: "reapply after a failed commit",
        mistake:
            "a notifier takes a failed COMMIT for nothing done and applies the batch's effects again without the inbox",
        fault: "db.commit_ack_lost 0.3 on the notifiers: the batch committed, its acknowledgement did not",
        expected: AnomalyKind::DuplicateEffect,
        needs_postgres: true,
        // ~35 notifier batches: ~10 acknowledgements withheld, each a batch
        // whose effects land twice.
        scenario: r#"
notifier.inbox = "reapply-on-commit-error"
proxy.targets = ["notifier"]
faults.db_commit_ack_lost = 0.3
"#,
    },
    Variant {
        name: "seq cursor",
        mistake: "the relay claims only rows past the highest seq it published, taking insert order for commit order",
        fault: "workload.slow_commit 0.1: a transaction held open 50-500 ms before its COMMIT while others commit",
        expected: AnomalyKind::UnpublishedLeftover,
        // On SQLite one writer holds the database for a whole transaction:
        // commit order is insert order, and the cursor is right there.
        // ~60 of 600 workload commits held, each a chance for rows below
        // the relays' cursors; a short drain timeout, since the rows left
        // behind never go out.
        needs_postgres: true,
        scenario: r#"
relay.cursor = "seq"
faults.workload_slow_commit = 0.1
run.drain_timeout_secs = 10
"#,
    },
    Variant {
        name: "email without idempotency key",
        mistake: "the notifier calls the email provider with no idempotency key, so a retry sends the email again",
        fault: "provider.response_lost 0.05: the email went out, its answer never came, the batch rolled back",
        expected: AnomalyKind::DuplicateExternalEffect,
        // ~300 receipts: ~15 answers lost, each batch retried and each of
        // those emails sent twice.
        needs_postgres: false,
        scenario: r#"
notifier.email = "no-key"
faults.provider_response_lost = 0.05
"#,
    },
    Variant {
        name: "email key per attempt",
        mistake: "the notifier mints a new idempotency key for each attempt, so the provider cannot tell a retry",
        fault: "provider.response_lost 0.05: the email went out, its answer never came, the batch rolled back",
        expected: AnomalyKind::DuplicateExternalEffect,
        needs_postgres: false,
        scenario: r#"
notifier.email = "key-per-attempt"
faults.provider_response_lost = 0.05
"#,
    },
    Variant {
        name: "email after commit",
        mistake: "the notifier sends the email after its transaction committed, fire-and-forget",
        fault:
            "notifier.before_offset_commit 0.01: a crash between the commit and the call; the redelivery is absorbed",
        expected: AnomalyKind::MissingExternalEffect,
        // ~600 events: ~6 crashes, each losing its batch's emails.
        needs_postgres: false,
        scenario: r#"
notifier.email = "after-commit"
faults.notifier_before_offset_commit = 0.01
"#,
    },
    Variant {
        name: "503 taken as success",
        mistake: "the notifier reads the provider's 503 as a sent email",
        fault: "provider.error 0.05: the provider refused and sent nothing",
        expected: AnomalyKind::MissingExternalEffect,
        needs_postgres: false,
        scenario: r#"
notifier.email = "error-as-success"
faults.provider_error = 0.05
"#,
    },
];

/// On PostgreSQL the correct pipeline also runs behind the fault proxy:
/// withheld COMMIT acknowledgements and reset connections for every
/// component, on top of [`CORRECT`].
pub const CORRECT_POSTGRES: &str = r#"
faults.db_commit_ack_lost = 0.01
faults.net_reset = 0.05
faults.workload_slow_commit = 0.1
"#;

/// The heavy-fault scenario's rates (scenarios/heavy-faults.toml), for the
/// no-false-alarm runs.
pub const HEAVY: &str = r#"
relay.instances = 3
faults.relay_after_produce = 0.33
faults.notifier_before_offset_commit = 0.02
faults.workload_poison = 0.01
"#;

/// The correct pipeline under the catalogue's crash, stall and reorder
/// faults at once, at rates that make each fire several times a run.
pub const CORRECT: &str = r#"
faults.relay_after_produce = 0.2
faults.relay_before_produce = 0.2
faults.relay_slow_produce = 0.2
faults.notifier_before_offset_commit = 0.005
faults.notifier_mid_batch = 0.1
faults.notifier_stall = 0.06
faults.workload_poison = 0.02
faults.relay_produce_error = 0.1
faults.relay_after_mark = 0.1
faults.store_commit_refused = 0.05
faults.provider_response_lost = 0.02
faults.provider_error = 0.02
faults.provider_slow = 0.01
faults.notifier_after_external_call = 0.05
"#;

/// The correct pipeline under late replays, with its week-long inbox
/// retention. Alone, because a replay re-reads whole partitions and every
/// other crash would multiply its cost.
pub const REPLAY: &str = r#"
topic.partitions = 16
faults.notifier_replay = 0.25
"#;

/// The no-false-alarm runs cycle through these.
pub const CLEAN_FLAVOURS: [(&str, &str); 3] =
    [(CORRECT, "crashes, stalls, reordering"), (REPLAY, "late replays"), (HEAVY, "heavy faults")];

/// Builds a scenario from the base and a variant's dotted keys.
pub fn scenario_for(overrides: &str, name: &str, seed: u64) -> Result<scenario::Scenario> {
    let mut doc: toml::Table = BASE.parse().map_err(|e| Error::Internal(format!("selftest base: {e}")))?;
    for line in overrides.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line.split_once('=').ok_or_else(|| Error::Internal(format!("selftest line {line:?}")))?;
        let value: toml::Value = format!("v = {}", value.trim())
            .parse::<toml::Table>()
            .map_err(|e| Error::Internal(format!("selftest value {line:?}: {e}")))?
            .remove("v")
            .unwrap_or(toml::Value::Boolean(false));
        let mut parts: Vec<&str> = key.trim().split('.').collect();
        let leaf = parts.pop().unwrap_or_default();
        let mut table = &mut doc;
        for p in parts {
            table = table
                .entry(p)
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .ok_or_else(|| Error::Internal(format!("selftest key {key}")))?;
        }
        table.insert(leaf.to_string(), value);
    }
    doc.insert("name".into(), toml::Value::String(format!("selftest: {name}")));
    doc.insert("seed".into(), toml::Value::Integer(seed as i64));
    let text = toml::to_string(&doc).map_err(|e| Error::Internal(e.to_string()))?;
    scenario::parse(&text, Path::new(&format!("selftest/{}.toml", name.replace(' ', "-"))))
}

/// One row of the selftest table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub variant: String,
    pub mistake: String,
    pub fault: String,
    pub expected: String,
    /// For a variant: the expected anomaly was reported. For the correct
    /// pipeline: every run was clean.
    pub ok: bool,
    pub runs: u32,
    /// What the last run reported: the anomaly count, or the verdict.
    pub found: String,
    pub last_run: String,
    /// What the core checker named on the last run, with counts (`3 ×
    /// lost event`): the generic invariants judge the catalogue too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub core: Vec<String>,
}

/// The anomalies the core checker found in a run, with their counts.
fn core_found(rep: &Report) -> Vec<String> {
    let by_core = |a: &&crate::verifier::Anomaly| a.found_by.iter().any(|c| c == "core");
    rep.anomalies.iter().filter(by_core).map(|a| format!("{} × {}", a.count, a.name)).collect()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub rows: Vec<Row>,
    /// Variants not run: their fault needs PostgreSQL and the run has SQLite.
    #[serde(default)]
    pub skipped: Vec<String>,
    pub caught: usize,
    pub variants: usize,
    pub correct_clean: bool,
}

pub struct Options {
    pub database_url: Option<String>,
    pub brokers: Option<String>,
    pub reports_dir: PathBuf,
    pub seed: u64,
    /// Seeds the correct pipeline runs with (the no-false-alarm check).
    pub clean_seeds: u32,
    /// Only the variants whose name contains this.
    pub only: Option<String>,
    /// Run the catalogue at all (false: only the correct pipeline).
    pub variants: bool,
    /// Where the reference components run in every run.
    pub components: crate::scenario::Components,
    /// Variants run at once (the correct pipeline's seeds count as one).
    pub jobs: u32,
}

fn expected_found(r: &Report, anomaly: AnomalyKind) -> Option<u64> {
    r.anomalies.iter().find(|a| a.name == anomaly.as_str()).map(|a| a.count)
}

/// Runs the catalogue and the correct pipeline, `jobs` of them at once;
/// prints progress on stderr. Each run has its own schema, topic and group
/// (or SQLite file and mock cluster), and no selftest scenario strikes a
/// service the others share, so runs side by side judge what they would
/// alone. The rows keep the catalogue's order.
pub async fn selftest(opts: &Options, listener: &dyn Listener) -> Result<Summary> {
    use futures::StreamExt;
    let mut skipped = Vec::new();
    let mut chosen = Vec::new();
    for v in CATALOGUE
        .iter()
        .filter(|_| opts.variants)
        .filter(|v| opts.only.as_deref().map(|o| v.name.contains(o)).unwrap_or(true))
    {
        if v.needs_postgres && opts.database_url.is_none() {
            listener.progress(&Progress::VariantLeftOut { name: v.name });
            skipped.push(v.name.to_string());
        } else {
            chosen.push(v);
        }
    }
    // `--only` picks variants: the correct pipeline is not run, so not
    // flagged. Its seeds run one after the other, the longest job: it
    // starts first, and its row goes last.
    let with_correct = opts.only.is_none();
    let runs = with_correct
        .then(|| futures::future::Either::Left(correct_pipeline(opts, listener)))
        .into_iter()
        .chain(chosen.iter().map(|v| futures::future::Either::Right(catch_variant(v, opts, listener))))
        .enumerate()
        .map(|(i, run)| async move { (i, run.await) });
    // A slot goes to the next run as soon as any run ends: kept in order,
    // a long run held the slots of the short ones that ended after it
    // (an embedded selftest's three slots stood two idle for 20 s of 140).
    let mut done: Vec<(usize, Result<Row>)> =
        futures::stream::iter(runs).buffer_unordered(opts.jobs.max(1) as usize).collect().await;
    done.sort_by_key(|(i, _)| *i);
    let mut rows = done.into_iter().map(|(_, row)| row).collect::<Result<Vec<Row>>>()?;
    let mut correct_clean = true;
    if with_correct {
        let clean = rows.remove(0);
        correct_clean = clean.ok;
        rows.push(clean);
    }
    let caught = rows.iter().take(chosen.len()).filter(|r| r.ok).count();
    let variants = chosen.len();
    Ok(Summary { rows, skipped, caught, variants, correct_clean })
}

/// One quiet pipeline run of a selftest scenario.
async fn run_quiet(sc: scenario::Scenario, opts: &Options) -> Result<Report> {
    let rep = execute(sc, opts.database_url.clone(), opts.brokers.clone(), &opts.reports_dir, &Quiet).await?;
    Ok(rep)
}

/// Runs one broken variant until the verifier reports its expected anomaly,
/// at most [`MAX_ATTEMPTS`] times with different seeds.
async fn catch_variant(v: &Variant, opts: &Options, listener: &dyn Listener) -> Result<Row> {
    let mut row = Row {
        variant: v.name.into(),
        mistake: v.mistake.into(),
        fault: v.fault.into(),
        expected: v.expected.as_str().into(),
        ok: false,
        runs: 0,
        found: String::new(),
        last_run: String::new(),
        core: vec![],
    };
    for attempt in 0..MAX_ATTEMPTS {
        let sc = scenario_for(v.scenario, v.name, opts.seed + attempt as u64)?.with_components(opts.components);
        let rep = run_quiet(sc, opts).await?;
        row.core = core_found(&rep);
        row.runs += 1;
        row.last_run = rep.run_id.clone();
        match expected_found(&rep, v.expected) {
            Some(n) => {
                row.ok = true;
                row.found = format!("{n} × {}", v.expected.as_str());
            }
            None => row.found = format!("verdict {}", rep.verdict.as_str()),
        }
        listener.progress(&Progress::VariantRun { name: v.name, run: row.runs, caught: row.ok });
        if row.ok {
            break;
        }
    }
    Ok(row)
}

/// Runs the correct pipeline with `clean_seeds` seeds, cycling through
/// [`CLEAN_FLAVOURS`]; stops at the first run flagged (the no-false-alarm check).
async fn correct_pipeline(opts: &Options, listener: &dyn Listener) -> Result<Row> {
    let mut clean = Row {
        variant: "correct pipeline".into(),
        mistake: "none".into(),
        fault: "the faults above (replays apart), then late replays, then heavy faults".into(),
        expected: "no anomaly".into(),
        ok: true,
        runs: 0,
        found: String::new(),
        last_run: String::new(),
        core: vec![],
    };
    let mut inconclusive = 0;
    for i in 0..opts.clean_seeds {
        let seed = opts.seed + 1000 + i as u64;
        let (overrides, flavour) = CLEAN_FLAVOURS[i as usize % CLEAN_FLAVOURS.len()];
        let overrides = match (overrides == CORRECT, &opts.database_url) {
            (true, Some(_)) => format!("{overrides}{CORRECT_POSTGRES}"),
            _ => overrides.to_string(),
        };
        let sc =
            scenario_for(&overrides, &format!("correct pipeline, {flavour}"), seed)?.with_components(opts.components);
        let rep = run_quiet(sc, opts).await?;
        clean.core = core_found(&rep);
        clean.runs += 1;
        clean.last_run = rep.run_id.clone();
        // Flagged means a violation: a run whose faults did not all fire
        // is inconclusive, which proves less but accuses nothing.
        let flagged = !matches!(rep.verdict, Verdict::Pass | Verdict::Inconclusive) || !rep.anomalies.is_empty();
        listener.progress(&Progress::CorrectRun { flavour, seed, verdict: rep.verdict });
        if flagged {
            clean.ok = false;
            clean.found = format!("seed {seed}: verdict {} ({})", rep.verdict.as_str(), rep.reason);
            break;
        }
        if rep.verdict == Verdict::Inconclusive {
            inconclusive += 1;
        }
        clean.found = format!("{} clean: {} pass, {inconclusive} inconclusive", clean.runs, clean.runs - inconclusive);
    }
    Ok(clean)
}

/// The selftest table, the mutation score, and the exit code.
pub fn render(s: &Summary) -> String {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["variant", "fault that exposes it", "expected anomaly", "detected", "runs", "found", "last run"]);
    for r in &s.rows {
        t.add_row(vec![
            Cell::new(&r.variant),
            Cell::new(&r.fault),
            Cell::new(&r.expected),
            Cell::new(if r.ok { "✔" } else { "✘" }),
            Cell::new(r.runs),
            Cell::new(&r.found),
            Cell::new(&r.last_run),
        ]);
    }
    let mut out = format!("{t}\n");
    out.push_str(&format!("mutation score: {}/{} variants caught", s.caught, s.variants));
    if !s.skipped.is_empty() {
        out.push_str(&format!(
            " ({} left out on SQLite, their fault needs PostgreSQL: {})",
            s.skipped.len(),
            s.skipped.join(", ")
        ));
    }
    out.push_str(if s.correct_clean {
        "; the correct pipeline is clean\n"
    } else {
        "; the correct pipeline was FLAGGED\n"
    });
    out
}
