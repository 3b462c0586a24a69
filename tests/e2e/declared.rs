//! A declared system (`[system]`, docs/contract.md section 8): the orders
//! example, a Python service, relay and consumer with tables of their own,
//! run as processes under real kills on PostgreSQL and Kafka. The correct
//! one passes, each broken one fails with the anomaly its bug causes, and
//! a bad declaration fails before any traffic with one line naming it.

use crate::common::*;
use std::path::{Path, PathBuf};

const ORDERS: &str = "examples/orders/orders.toml";

fn run_declared(scenario: &Path, reports: &Path, seed: Option<u64>) -> Ran {
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path()).arg("run").arg(scenario).args(["--json", "--reports-dir"]).arg(reports);
    if let Some(s) = seed {
        c.args(["--seed", &s.to_string()]);
    }
    run(&mut c)
}

fn anomalies(r: &serde_json::Value) -> Vec<String> {
    r["anomalies"].as_array().expect("anomalies").iter().map(|a| a["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn the_orders_system_passes_under_real_kills() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_declared(Path::new(ORDERS), dir.path(), None);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_fired_and_confirmed(&r, "process.kill");
    assert_fired_and_confirmed(&r, "db.kill_after_commit");
    // The confirmation emails go through the provider chaos runs, which
    // loses answers and refuses requests.
    assert_fired_and_confirmed(&r, "provider.response_lost");
    assert_fired_and_confirmed(&r, "provider.error");
    let s = &r["system"];
    let n = |k: &str| s[k].as_u64().unwrap();
    assert_eq!(n("operations"), 300, "{s}");
    assert_eq!(n("acknowledged") + n("refused") + n("ambiguous"), 300, "{s}");
    // Every acknowledged order has its event; ambiguous ones may or may not.
    assert!(n("outbox_events") >= n("acknowledged"), "{s}");
    assert!(n("outbox_events") <= n("acknowledged") + n("ambiguous"), "{s}");
    let names: Vec<&str> = r["invariants"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    for want in [
        "every acknowledged operation produced exactly its events",
        "effect shipments: exactly one per OrderPlaced message",
        "effect stock: amounts per key equal the operations' quantity",
        "effect confirmation emails: exactly one per OrderPlaced message",
        "no idempotency key reused with another body (the provider's 409)",
        "check \"every order has its event\" returns no rows",
    ] {
        assert!(names.contains(&want), "{want} not checked: {names:?}");
    }
    assert_series_and_stages(&r);
}

/// Issue 64: a declared system's programs count nothing for the harness,
/// and its series showed 0 published and 0 applied for the whole run, its
/// stages all 0. Published is now the topic's messages and applied the
/// offsets the consumer group committed, both read from the broker; each
/// grows to the run's events, and their stages are marked where they grew.
fn assert_series_and_stages(r: &serde_json::Value) {
    let series = r["series"].as_array().expect("a series");
    let most = |k: &str| series.iter().filter_map(|s| s[k].as_u64()).max().unwrap_or(0);
    let (events, acknowledged) = (r["system"]["outbox_events"].as_u64().unwrap(), r["system"]["acknowledged"].as_u64());
    assert_eq!(Some(most("written")), acknowledged, "written: the operations acknowledged");
    assert!(most("published") >= events, "every event on the topic, duplicates too: {} of {events}", most("published"));
    assert!(most("applied") >= events, "the group committed past every event: {} of {events}", most("applied"));
    for s in series {
        let (p, a) = (s["published"].as_u64(), s["applied"].as_u64());
        assert!(a.zip(p).is_none_or(|(a, p)| a <= p), "more committed than published: {s}");
    }
    let st = &r["stages"];
    let at = |k: &str| st[k].as_u64().unwrap_or_else(|| panic!("stage {k} absent: {st}"));
    for stage in ["write", "publish", "apply"] {
        let (first, last) = (at(&format!("first_{stage}_ms")), at(&format!("last_{stage}_ms")));
        assert!(0 < first && first <= last, "{stage}: {first}..{last}: {st}");
    }
    // A message is committed only once it is on the topic, and the series
    // reads the offsets before the topic: publishing starts no later than
    // applying, and ends no later.
    assert!(at("first_publish_ms") <= at("first_apply_ms") && at("last_publish_ms") <= at("last_apply_ms"), "{st}");
}

/// Each broken variant, on seeds 1 and 2: its kills are aimed at the
/// window its bug opens, so every seed must catch it.
fn assert_caught(scenario: &str, anomaly: &str, point: &str) {
    for seed in 1..=2 {
        let dir = tempfile::tempdir().unwrap();
        let ran = run_declared(Path::new(scenario), dir.path(), Some(seed));
        let r = ran.json();
        assert_nothing_left(&r);
        assert_eq!(ran.code, 1, "seed {seed}: {scenario} was not caught: {}\nstderr:\n{}", r["reason"], ran.stderr);
        let v = anomalies(&r);
        assert!(v.iter().any(|a| a == anomaly), "seed {seed}: anomalies {v:?}, expected {anomaly:?}");
        assert_fired_and_confirmed(&r, point);
        // The example tells the key's story.
        let a = r["anomalies"].as_array().unwrap().iter().find(|a| a["name"] == anomaly).unwrap();
        assert!(!a["examples"].as_array().unwrap().is_empty(), "{a}");
    }
}

#[test]
fn stock_taken_outside_the_inbox_drifts() {
    assert_caught("examples/orders/broken-stock-without-inbox.toml", "counter drift", "db.kill_after_commit");
}

#[test]
fn an_inbox_committed_before_its_effects_loses_them() {
    assert_caught("examples/orders/broken-inbox-first.toml", "missing effect", "db.kill_after_commit");
}

#[test]
fn a_confirmation_email_without_an_idempotency_key_is_sent_twice() {
    assert_caught(
        "examples/orders/broken-email-without-key.toml",
        "duplicate external effect",
        "provider.response_lost",
    );
}

#[test]
fn an_order_and_its_event_in_two_transactions_fail_the_users_own_check() {
    assert_caught("examples/orders/broken-service-two-transactions.toml", "failed check", "db.kill_after_commit");
}

/// The orders declaration with `from` replaced by `to`, in a folder of its
/// own beside a copy of the schema.
fn variant(dir: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join(ORDERS)).unwrap();
    assert!(text.contains(from), "{from:?} is not in {ORDERS}");
    std::fs::copy(root().join("examples/orders/schema.sql"), dir.join("schema.sql")).unwrap();
    let path = dir.join("orders.toml");
    let mut text = text.replace(from, to);
    // The programs stay where they are.
    for program in ["service.py", "relay.py", "consumer.py"] {
        let absolute = root().join("examples/orders").join(program);
        text = text.replace(&format!("\"{program}\""), &format!("{:?}", absolute.display().to_string()));
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_bad_declaration_fails_before_any_traffic_naming_its_key_and_the_databases_words() {
    let cases = [
        (
            "published_column = \"published_at\"",
            "published_column = \"sent_at\"",
            "system.outbox.published_column",
            "column \"sent_at\" does not exist",
        ),
        (
            "table = \"order_events\"",
            "table = \"order_event\"",
            "system.outbox.table",
            "relation \"order_event\" does not exist",
        ),
        (
            "1000 - on_hand AS amount",
            "1000 - on_hnd AS amount",
            "[[system.effects]] \"stock\": query",
            "column \"on_hnd\" does not exist",
        ),
        (
            "1000 - on_hand AS amount",
            "sku AS amount",
            "[[system.effects]] \"stock\": query",
            "`amount` is of type TEXT; expected an integer",
        ),
        (
            "SELECT message_id, order_id AS key FROM shipments",
            "SELECT order_id AS key FROM shipments",
            "[[system.effects]] \"shipments\": query",
            "without `message_id`",
        ),
        (
            "SELECT message_id, order_id AS key FROM shipments",
            "SELECT message_id, order_id AS key, created_at FROM shipments",
            "[[system.effects]] \"shipments\": query",
            "returns the column `created_at`",
        ),
        // An outbox field written as an expression (issue 63) is proved the
        // same way: here one meant for a bytea envelope, over a jsonb column,
        (
            "id = \"event_id\"",
            "id = \"convert_from(body, 'UTF8')::jsonb->>'eventId'\"",
            "system.outbox.id",
            "function convert_from(jsonb, unknown) does not exist",
        ),
        // and one that gives many values for one row.
        (
            "payload = \"body\"",
            "payload = \"jsonb_array_elements(body)\"",
            "system.outbox.payload",
            "must give one value per row: set-returning functions are not allowed",
        ),
        (
            "WHERE NOT EXISTS",
            "WHERE NOT EXISTZ",
            "[[system.checks]] \"every order has its event\": query",
            "syntax error",
        ),
    ];
    for (from, to, key, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = variant(dir.path(), from, to);
        let reports = dir.path().join("reports");
        let ran = run_declared(&path, &reports, None);
        assert_eq!(ran.code, 2, "{to}: stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
        let err = ran.stderr.trim();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(key) && err.contains(words), "{to}: the error names neither {key:?} nor {words:?}: {err}");
        // Before any traffic: no process started, no report written.
        assert!(!reports.exists() || std::fs::read_dir(&reports).unwrap().next().is_none(), "{to}: something ran");
    }
}

#[test]
fn a_service_whose_health_never_answers_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(
        dir.path(),
        "command = [\"python3\", \"service.py\"]",
        "command = [\"python3\", \"-c\", \"import time; time.sleep(600)\"]",
    );
    let text = std::fs::read_to_string(&path).unwrap().replace("ready_timeout_secs = 30", "ready_timeout_secs = 2");
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, &dir.path().join("reports"), None);
    assert_eq!(ran.code, 3, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let err = ran.stderr.trim();
    assert!(err.contains("did not answer GET http://127.0.0.1:") && err.contains("/health"), "{err}");
    assert!(err.contains("within 2 s"), "{err}");
    // The sleeping service died with the run.
    let run_id = std::fs::read_dir(dir.path().join("reports"))
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|e| e.file_name().to_string_lossy().strip_suffix("-processes").map(String::from));
    if let Some(id) = run_id {
        assert!(processes_of_run(&id).is_empty(), "the service outlived the run");
    }
}

/// A relay that deletes what it published, declared `published = "delete"`:
/// the outbox log still accounts for every row it deleted.
#[test]
fn a_relay_that_deletes_its_rows_is_judged_by_the_outbox_log() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_declared(Path::new("examples/orders/orders-delete.toml"), dir.path(), None);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_nothing_left(&r);
    assert!(r["system"]["outbox_events"].as_u64().unwrap() >= r["system"]["acknowledged"].as_u64().unwrap());
}

/// The schema from the user's own migrations command, with the run's
/// environment; a migration that fails is a bad scenario (exit 2) with its
/// stderr, before any traffic.
#[test]
fn the_schema_may_come_from_a_migrations_command() {
    let dir = tempfile::tempdir().unwrap();
    let migrate = root().join("examples/orders/migrate.py").display().to_string();
    let path = variant(dir.path(), "setup = \"schema.sql\"", &format!("setup_command = [\"python3\", {migrate:?}]"));
    // Sixty orders and no faults: this is about where the schema comes
    // from. With the file's faults, sixty orders are too few for each of
    // them to fire on a busy machine, and a run whose faults never fired
    // is inconclusive.
    let text = std::fs::read_to_string(&path).unwrap().replace("count = 300", "count = 60");
    let text: String = text
        .lines()
        .filter(|l| !["process_kill", "db_kill_after_commit", "provider_"].iter().any(|f| l.starts_with(f)))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, &dir.path().join("reports"), None);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.json()["faults"].as_array().unwrap().iter().all(|f| f["fired"] == 0),
        "faults fired in a fault-free run"
    );

    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    let path = variant(&broken, "setup = \"schema.sql\"", "setup_command = [\"python3\", \"-c\", \"import sys; print('relation orders already exists', file=sys.stderr); sys.exit(1)\"]");
    let ran = run_declared(&path, &broken.join("reports"), None);
    assert_eq!(ran.code, 2, "stderr:\n{}", ran.stderr);
    assert!(
        ran.stderr.contains("`system.setup_command`") && ran.stderr.contains("relation orders already exists"),
        "{}",
        ran.stderr
    );
    assert_eq!(ran.stderr.trim().lines().count(), 1, "{}", ran.stderr);
}

/// Readiness by a line the service prints instead of a health path: the
/// run goes on once it shows, and exits 3 when it never does.
#[test]
fn a_service_is_ready_once_it_prints_its_ready_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(dir.path(), "health = \"/health\"", "ready_line = \"listening on 127.0.0.1\"");
    // Sixty orders and no faults: this is about where the schema comes
    // from. With the file's faults, sixty orders are too few for each of
    // them to fire on a busy machine, and a run whose faults never fired
    // is inconclusive.
    let text = std::fs::read_to_string(&path).unwrap().replace("count = 300", "count = 60");
    let text: String = text
        .lines()
        .filter(|l| !["process_kill", "db_kill_after_commit", "provider_"].iter().any(|f| l.starts_with(f)))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, &dir.path().join("reports"), None);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.json()["faults"].as_array().unwrap().iter().all(|f| f["fired"] == 0),
        "faults fired in a fault-free run"
    );
    assert_eq!(ran.json()["system"]["operations"], 60);

    let never = dir.path().join("never");
    std::fs::create_dir(&never).unwrap();
    let path = variant(&never, "health = \"/health\"", "ready_line = \"a line it never prints\"");
    let text = std::fs::read_to_string(&path).unwrap().replace("ready_timeout_secs = 30", "ready_timeout_secs = 3");
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, &never.join("reports"), None);
    assert_eq!(ran.code, 3, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("did not write \"a line it never prints\" within 3 s"), "{}", ran.stderr);
}

#[test]
fn a_declared_system_without_postgresql_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    c.args(["run", ORDERS, "--reports-dir"]).arg(dir.path());
    let ran = run(&mut c);
    assert_eq!(ran.code, 2, "stderr:\n{}", ran.stderr);
    assert!(ran.stderr.contains("PostgreSQL only"), "{}", ran.stderr);
}

#[test]
fn faults_inside_our_reference_components_are_refused_for_a_declared_system() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(dir.path(), "[faults]\n", "[faults]\nworkload_poison = 0.1\n");
    let ran = run_declared(&path, &dir.path().join("reports"), None);
    assert_eq!(ran.code, 2, "stderr:\n{}", ran.stderr);
    assert!(ran.stderr.contains("faults.workload_poison") && ran.stderr.contains("process_kill"), "{}", ran.stderr);
}

/// Issue 63: an envelope outbox, one serialized envelope per row as many
/// outbox libraries keep it, declared with SQL expressions over the row and
/// the table left as it is (examples/orders/orders-envelope.toml). The log's
/// trigger, the reads of the outbox and the verifier take the event's id,
/// key, type and body out of the envelope, and they match the relay's
/// messages exactly. Forty orders and no faults, so that every count is
/// known: this is about reading the envelope, and forty orders are too few
/// for the file's faults to fire on every seed (its runs under them are in
/// docs/your-system.md).
#[test]
fn an_envelope_outbox_declared_by_expressions_passes() {
    const ORDERS_N: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let orders = root().join("examples/orders");
    let mut text = std::fs::read_to_string(orders.join("orders-envelope.toml")).unwrap();
    assert!(text.contains("id = \"convert_from(envelope, 'UTF8')"), "orders-envelope.toml changed: {text}");
    text = text
        .replace("count = 300", &format!("count = {ORDERS_N}"))
        .replace("setup = \"schema.sql\"", &format!("setup = {:?}", orders.join("schema.sql").display().to_string()));
    for program in ["service.py", "relay.py", "consumer.py"] {
        let absolute = orders.join(program).display().to_string();
        text = text.replace(&format!("\"{program}\""), &format!("{absolute:?}"));
    }
    let text: String = text
        .lines()
        .filter(|l| !["process_kill", "db_kill_after_commit", "provider_"].iter().any(|f| l.starts_with(f)))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = dir.path().join("envelope.toml");
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, dir.path(), None);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_eq!(ran.code, 0, "{}: {:?}\nstderr:\n{}", r["reason"], anomalies(&r), ran.stderr);
    let s = &r["system"];
    for (figure, want) in [
        ("operations", ORDERS_N),
        ("acknowledged", ORDERS_N),
        ("outbox_events", ORDERS_N),
        ("messages", ORDERS_N),
        ("duplicate_messages", 0),
    ] {
        assert_eq!(s[figure].as_u64(), Some(want), "{figure}: {s}");
    }
    let names: Vec<&str> = r["invariants"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    for want in [
        "every acknowledged operation produced exactly its events",
        "every message equals its outbox row",
        "effect shipments: exactly one per OrderPlaced message",
        "check \"every order has its event\" returns no rows",
    ] {
        assert!(names.contains(&want), "{want} not checked: {names:?}");
    }
}

/// Issue 37: a consumer that stores first and applies later (seed 000's
/// inbox as a queue) has no lag long before its work is done. Judged at
/// the drain it would fail for effects that arrive seconds later; it
/// declares its pending work, and the run settles before it is judged.
/// Issue 64: the report says so, in the JSON (`timings.settle_ms`,
/// `system.pending_at_settle`), the Markdown and the summary.
#[test]
fn a_consumer_that_applies_later_passes_once_its_pending_work_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Path::new("examples/orders/orders-apply-later.toml");
    let ran = run_declared(scenario, dir.path(), None);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_fired_and_confirmed(&r, "db.kill_after_commit");
    assert_eq!(r["system"]["acknowledged"], 300, "{}", r["system"]);
    // The work it waited for: about 20 orders a second, so hundreds of
    // them are still pending when the drain ends; and the settle lasts at
    // least the quiet period after the last of them (2 s).
    let pending = r["system"]["pending_at_settle"].as_u64().expect("the pending work waited for");
    assert!((1..=300).contains(&pending), "{}", r["system"]);
    let settle_ms = r["timings"]["settle_ms"].as_u64().expect("the settle's time");
    assert!(settle_ms >= 2_000, "{}", r["timings"]);
    let saved = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.path());
    let json = saved.into_iter().find(|p| p.extension().is_some_and(|e| e == "json")).expect("the saved report");
    let md = std::fs::read_to_string(json.with_extension("md")).unwrap();
    let settled = format!("{:.1} s after the drain, for {pending} rows of system.pending", settle_ms as f64 / 1000.0);
    assert!(md.contains(&format!("settle {settle_ms} ms")) && md.contains(&settled), "{md}");
    let summary = run(chaos().arg("report").arg(&json).arg("--summary"));
    assert!(summary.stdout.contains(&format!("  settled   {settled}")), "{}", summary.stdout);
    // The same run judged at the drain, without the settle: the work still
    // pending then is reported missing. The settle makes the difference.
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path()).env("CHAOS_SKIP_SETTLE", "1").arg("run").arg(scenario);
    c.args(["--json", "--reports-dir"]).arg(dir.path());
    let hasty = run(&mut c);
    assert_eq!(hasty.code, 1, "judged at the drain, it must look broken:\n{}", hasty.stderr);
    assert!(hasty.json()["system"]["pending_at_settle"].is_null(), "no settle, no pending work waited for");
    assert!(anomalies(&hasty.json()).contains(&"missing effect".to_string()), "{:?}", anomalies(&hasty.json()));
}

/// Late is not stalled: a consumer still applying its backlog when one
/// drain timeout has passed since the drain is waited for, as long as each
/// timeout sees some of its pending work applied. The orders consumer
/// that applies later works through about 20 stored orders a second, so
/// 300 orders stored in seconds outlast an 8 s timeout. Judged when the
/// first timeout ran out, it failed with `stalled consumer` (seen on the
/// Node consumer under `chaos init --system --from`: 17 rows left while
/// both pollers applied 5 rows every half second).
#[test]
fn a_consumer_still_applying_its_backlog_after_a_drain_timeout_is_late_not_stalled() {
    let dir = tempfile::tempdir().unwrap();
    let orders = root().join("examples/orders");
    let mut text = std::fs::read_to_string(orders.join("orders-apply-later.toml")).unwrap();
    assert!(text.contains("drain_timeout_secs = 90"), "orders-apply-later.toml changed: {text}");
    text = text.replace("drain_timeout_secs = 90", "drain_timeout_secs = 8");
    text = text
        .replace("setup = \"schema.sql\"", &format!("setup = {:?}", orders.join("schema.sql").display().to_string()));
    for program in ["service.py", "relay.py", "consumer_apply_later.py"] {
        let absolute = orders.join(program).display().to_string();
        text = text.replace(&format!("\"{program}\""), &format!("{absolute:?}"));
    }
    let path = dir.path().join("slow-backlog.toml");
    std::fs::write(&path, text).unwrap();
    let ran = run_declared(&path, dir.path(), None);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_eq!(ran.code, 0, "{}: {:?}\nstderr:\n{}", r["reason"], anomalies(&r), ran.stderr);
    let rest = r["timings"]["drain_ms"].as_u64().unwrap() + r["timings"]["settle_ms"].as_u64().unwrap();
    assert!(
        rest > 8_000,
        "the drain and the settle took {rest} ms: the backlog did not outlast the timeout, so this run proves nothing"
    );
}

/// Late is not lost, upstream too: a relay that stops publishing after a
/// restart leaves outbox rows that no fault-free drain timeout publishes.
/// That is a `stalled relay` (FAIL, exit 1), not INCOMPLETE (the harness
/// did its part), and its keys are no `missing effect`.
#[test]
fn a_relay_that_stops_publishing_is_a_stalled_relay() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_declared(Path::new("examples/orders/broken-relay-stalls.toml"), dir.path(), None);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_eq!(ran.code, 1, "{}\nstderr:\n{}", r["reason"], ran.stderr);
    let found = anomalies(&r);
    assert_eq!(found.first().map(String::as_str), Some("stalled relay"), "{found:?}");
    assert!(!found.contains(&"missing effect".to_string()), "unpublished work reported missing: {found:?}");
    let stalled = &r["anomalies"][0];
    let left = stalled["count"].as_u64().unwrap();
    assert!(left > 0, "{stalled}");
    let first = stalled["examples"][0].as_str().unwrap();
    assert!(first.contains("fault-free") && first.contains("last fault before: process.kill on relay-"), "{first}");
    // Its rows are the leftovers, and the keys come with it.
    assert!(found.contains(&"unpublished leftover".to_string()), "{found:?}");
    assert!(stalled["examples"][1].as_str().unwrap().contains("never published"), "{stalled}");
}

/// Late is not lost, and a consumer that never applies is neither: its
/// stored work still pending when the settle runs out is a `stalled
/// consumer` (FAIL), not `missing effect` and not INCOMPLETE.
#[test]
fn a_consumer_that_stops_applying_is_a_stalled_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_declared(Path::new("examples/orders/broken-apply-later-stalls.toml"), dir.path(), None);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_eq!(ran.code, 1, "{}\nstderr:\n{}", r["reason"], ran.stderr);
    let found = anomalies(&r);
    assert_eq!(found.first().map(String::as_str), Some("stalled consumer"), "{found:?}");
    assert!(!found.contains(&"missing effect".to_string()), "pending work reported missing: {found:?}");
    let stalled = &r["anomalies"][0];
    assert!(stalled["count"].as_u64().unwrap() > 0, "{stalled}");
    let first = stalled["examples"][0].as_str().unwrap();
    assert!(
        first.contains("rows of system.pending still there") && first.contains("the last fault before: "),
        "{first}"
    );
}

/// Issue 65: one rule for an incomplete run, whatever the system: a
/// declared run cut short by a consumer that exits on its own is verified
/// as a payments run is, and its figures are shown as partial (it was not
/// verified at all).
#[test]
fn an_incomplete_declared_run_is_verified_and_shown_partial() {
    let dir = tempfile::tempdir().unwrap();
    let consumer = root().join("examples/orders/consumer.py");
    let exits = format!("command = [\"sh\", \"-c\", \"python3 {} & sleep 6; kill $!; exit 7\"]", consumer.display());
    let path = variant(dir.path(), "command = [\"python3\", \"consumer.py\"]", &exits);
    let ran = run_declared(&path, dir.path(), None);
    let r = ran.json();
    assert_eq!(ran.code, 5, "{}\nstderr:\n{}", r["reason"], ran.stderr);
    let reason = r["reason"].as_str().unwrap();
    assert!(reason.contains("exit") && reason.ends_with("the figures above are partial"), "{reason}");
    let judged = r["invariants"].as_array().unwrap();
    assert!(judged.len() >= 5, "an incomplete run's invariants: {judged:?}");
    assert!(r["system"]["acknowledged"].as_u64().unwrap() > 0, "{}", r["system"]);
}

/// Issue 39: `chaos init --system --from` puts the recommended faults
/// under a declaration, unchanged: the correct orders system passes under
/// them, and the inbox-first consumer, whose own scenario aims at its
/// window, is caught by them too; so is a relay that reads by an
/// insert-ordered cursor (issue 63), by the service's held commits, and a
/// consumer whose inbox is read then written (issue 67), by a zombie's
/// commit. Written beside a copy of the example, where its commands and
/// schema are.
#[test]
fn the_recommended_system_faults_pass_the_orders_system_and_catch_the_inbox_first_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let orders = dir.path().join("orders");
    std::fs::create_dir(&orders).unwrap();
    for f in std::fs::read_dir(root().join("examples/orders")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, orders.join(f.file_name().unwrap())).unwrap();
    }
    let cases = [
        ("orders.toml", None),
        ("broken-inbox-first.toml", Some("missing effect")),
        ("broken-relay-seq-cursor.toml", Some("unpublished leftover")),
        // Issue 67: by a zombie's commit (db.pause_in_transaction).
        ("broken-check-then-act.toml", Some("counter drift")),
    ];
    let paths: Vec<_> = cases
        .iter()
        .map(|(from, _)| {
            let path = orders.join(format!("recommended-{from}"));
            let wrote = run(chaos().args(["init", "--system", "--from"]).arg(orders.join(from)).arg(&path));
            assert_eq!(wrote.code, 0, "{}", wrote.stderr);
            path
        })
        .collect();
    // Side by side: each run is near a minute, the operations' spread.
    let runs: Vec<Ran> = std::thread::scope(|s| {
        let handles: Vec<_> = paths.iter().map(|p| s.spawn(|| run_declared(p, dir.path(), Some(2)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((from, anomaly), ran) in cases.iter().zip(runs) {
        let r = ran.json();
        match anomaly {
            None => {
                assert_eq!(ran.code, 0, "{from}: {}\nstderr:\n{}", r["reason"], ran.stderr);
                assert_nothing_left(&r);
                assert_fired_and_confirmed(&r, "db.kill_after_commit");
                // Issue 67: a zombie's commit went on, and the inbox's
                // unique claim made its new owner skip the messages.
                assert_fired_and_confirmed(&r, "db.pause_in_transaction");
                // Issue 63: the service's held commits went on, other
                // commits overtook them, and no kill erased a hold.
                let k = &r["components"];
                assert!(k["writer_holds_overtaken"].as_u64() > Some(0), "no overtake seen: {k}");
                let hold = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == "db.hold_commit").unwrap();
                assert!(hold["preempted"].as_u64().unwrap() * 20 <= hold["fired"].as_u64().unwrap(), "{hold}");
            }
            Some(a) => {
                assert_eq!(ran.code, 1, "{from} was not caught: {}\nstderr:\n{}", r["reason"], ran.stderr);
                assert!(anomalies(&r).iter().any(|x| x == a), "{from}: {:?}, expected {a:?}", anomalies(&r));
            }
        }
    }
}
