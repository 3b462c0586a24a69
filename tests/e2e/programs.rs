//! A program under test (`[notifier] command`) run as OS processes on
//! PostgreSQL and Kafka: the Python examples get the verdicts they should,
//! kills are real, and a program that misbehaves gets a clear error and
//! exit 5, never a hang, with no process left behind.

use crate::common::*;
use std::path::Path;
use std::time::Duration;

fn run_program(scenario: &str, reports: &Path) -> Ran {
    run_program_seeded(scenario, reports, None)
}

fn run_program_seeded(scenario: &str, reports: &Path, seed: Option<u64>) -> Ran {
    match seed {
        Some(s) => run_program_with(scenario, reports, &["--seed", &s.to_string()]),
        None => run_program_with(scenario, reports, &[]),
    }
}

/// `chaos run scenario --json` with `extra` arguments after it.
fn run_program_with(scenario: &str, reports: &Path, extra: &[&str]) -> Ran {
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path()).args(["run", scenario, "--json", "--reports-dir"]).arg(reports).args(extra);
    run(&mut c)
}

/// The names of the anomalies a report found.
fn anomalies(r: &serde_json::Value) -> Vec<String> {
    r["anomalies"].as_array().expect("anomalies").iter().map(|a| a["name"].as_str().unwrap().to_string()).collect()
}

/// A broken program fails only when a kill lands in its window. The
/// examples' scenarios aim their kills at those windows (the fault proxy's
/// `*.kill_after_*` and `db.hold_commit`), so every seed must catch it:
/// seeds 1 and 2, each naming `anomaly`, with `point` fired and confirmed.
/// Runs `scenario` on seeds 1 and 2, each caught with `anomaly` and its
/// `point` fired and confirmed; returns their reports.
fn assert_caught(scenario: &str, anomaly: &str, point: &str) -> Vec<serde_json::Value> {
    let mut reports = Vec::new();
    for seed in 1..=2 {
        let dir = tempfile::tempdir().unwrap();
        let ran = run_program_seeded(scenario, dir.path(), Some(seed));
        let r = ran.json();
        assert_nothing_left(&r);
        assert_eq!(ran.code, 1, "seed {seed}: {scenario} was not caught: {}\nstderr:\n{}", r["reason"], ran.stderr);
        let v = anomalies(&r);
        assert!(v.iter().any(|a| a == anomaly), "seed {seed}: anomalies {v:?}, expected {anomaly:?}");
        assert_fired_and_confirmed(&r, point);
        reports.push(r);
    }
    reports
}

fn assert_incomplete_naming(ran: &Ran, words: &[&str]) -> serde_json::Value {
    assert_eq!(ran.code, 5, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_eq!(r["verdict"], "incomplete");
    let reason = r["reason"].as_str().unwrap();
    for w in words {
        assert!(reason.contains(w), "the reason does not say {w:?}: {reason}");
    }
    assert!(!reason.contains('\n'), "one line: {reason}");
    assert_nothing_left(&r);
    r
}

#[test]
fn the_correct_python_consumer_passes_under_real_kills() {
    let dir = tempfile::tempdir().unwrap();
    // 600 of the example's 1,500 payments: the kills and pauses are per
    // second, and the whole file took 93-186 s of the suite.
    let ran = run_program_with("examples/python/consumer.toml", dir.path(), &["--payments", "600"]);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_eq!(r["verdict"], "pass");
    assert_fired_and_confirmed(&r, "process.kill");
    // The kill is real: PostgreSQL shows the killed process's sessions gone.
    let k = &r["components"];
    assert!(k["sessions_at_kill"].as_u64().unwrap() >= 1, "no kill hit a process with a session: {k}");
    // Most are seen gone within 5 s; one PostgreSQL has not yet noticed was
    // cut (idle in a transaction, waiting on the client) is a fact of the
    // run, not a verdict input (docs/your-system.md), and happens under load
    // (9 of 10 seen gone on a fresh clone).
    let (at_kill, gone) = (k["sessions_at_kill"].as_u64().unwrap(), k["sessions_gone_after_kill"].as_u64().unwrap());
    assert!(gone >= 1 && gone <= at_kill && 2 * gone >= at_kill, "{k}");
    // A kill restarts the slot, unless the run was ending.
    let (started, killed) = (k["processes_started"].as_u64().unwrap(), k["processes_killed"].as_u64().unwrap());
    assert!(started >= 2 + killed - killed.min(2) && started <= 2 + killed, "{k}");
    let paused = assert_fired_and_confirmed(&r, "process.pause");
    // Every random kill and pause was measured on PostgreSQL for the power line.
    assert_eq!(
        k["random_kills_measured"],
        r["faults"].as_array().unwrap().iter().find(|f| f["point"] == "process.kill").unwrap()["fired"],
        "{k}"
    );
    assert_eq!(k["pauses_measured"].as_u64().unwrap(), paused, "{k}");
    // A process is struck only once PostgreSQL shows its session: no kill
    // lands on one still starting.
    assert_eq!(k["random_kills_without_session"], 0, "{k}");
    // Its receipts are emails too, sent once each through the provider's
    // lost answers and refusals, under the same idempotency key.
    let c = &r["counts"];
    assert_eq!(c["emails_sent"], c["payments_captured"], "{c}");
    assert!(c["emails_absorbed"].as_u64().unwrap() > 0, "no retry was absorbed: {c}");
    assert_fired_and_confirmed(&r, "provider.response_lost");
    assert_fired_and_confirmed(&r, "provider.error");
    assert_nothing_left(&r);
}

/// The power line: a correct consumer whose transactions stay open while it
/// works is often killed inside one, and PostgreSQL shows it.
#[test]
fn random_kills_that_land_inside_a_transaction_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/slow_transaction.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let kills = assert_fired_and_confirmed(&r, "process.kill");
    let k = &r["components"];
    let n = |f: &str| k[f].as_u64().unwrap();
    assert_eq!(n("random_kills_measured"), kills, "{k}");
    assert!(n("random_kills_in_transaction") >= 1, "no kill found a transaction open: {k}");
    assert_eq!(n("random_kills_without_session"), 0, "a kill landed on a process still starting: {k}");
    assert!(n("random_kills_in_transaction") <= kills, "{k}");
    assert_nothing_left(&r);
}

#[test]
fn effects_before_the_inbox_row_duplicate_them() {
    for r in assert_caught("examples/python/effects-first.toml", "duplicate effect", "db.kill_after_commit") {
        // Its cause by data: the kill after the commit that applied it,
        // whose process had fetched the message past the group's position
        // (the proxy reads the fetches), so the group delivered it again.
        let a = r["anomalies"].as_array().unwrap().iter().find(|a| a["name"] == "duplicate effect").unwrap();
        let by_data = a["followed"].as_array().unwrap().iter().flat_map(|f| f["faults"].as_array().unwrap()).any(|s| {
            s["by"] == "data"
                && s["point"] == "db.kill_after_commit"
                && s["matched"].as_str().unwrap_or_default().contains("past the group's committed position")
        });
        assert!(by_data, "no duplicate effect was tied by data to a kill after a commit: {}", a["followed"]);
    }
}

/// One program of the power table (issue 39): the recommended scenario for
/// its kind, `chaos init --consumer CMD` (with `--email` for a consumer
/// that sends emails) or `--relay CMD`, with only the command changed.
struct Power {
    kind: &'static str,
    program: &'static str,
    email: bool,
    /// The anomaly that catches it; None for a correct program.
    caught_by: Option<&'static str>,
}

/// Runs each program under its recommended scenario on seed 1, the seed
/// the file is written with, so the run a user makes first (the power over
/// seeds 1-10 is scripts/power.py's, in docs/measurements.md; a second seed
/// here cost the suite 4 minutes of its 30), `at_once` runs side by side
/// (the workload's spread keeps each consumer run near a minute, whatever
/// the program, and a run mostly waits; four at once, beside the suite's
/// other tests, ran Debian's 100 PostgreSQL connections out, so
/// scripts/services.sh allows 300), and checks every verdict: each correct
/// program passes, each broken one is caught with its anomaly. A run whose
/// faults never fired is inconclusive, and says nothing of the program: on
/// a loaded machine a window can go unstruck. Such a run is made again
/// once, on another seed, and it is a wrong verdict if that one is
/// inconclusive too; a pass or a failure is never made again. All the runs
/// end before the first failure is told, with every wrong verdict in it.
/// `check` looks further into each report.
fn power(cases: &[Power], at_once: usize, check: impl Fn(&Power, &serde_json::Value) + Sync) {
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let path = dir.path().join(format!("{i}-{}.toml", case.program));
        let cmd = format!("python3 {}", root().join("examples/python").join(case.program).display());
        let mut init = chaos();
        init.args(["init", &format!("--{}", case.kind), &cmd]).arg(&path);
        if case.email {
            init.arg("--email");
        }
        let wrote = run(&mut init);
        assert_eq!(wrote.code, 0, "{}", wrote.stderr);
        runs.push((case, path.clone(), 1));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let wrong = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..at_once {
            s.spawn(|| {
                while let Some((case, path, seed)) = runs.get(next.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) {
                    let mut ran = run_program_seeded(path.to_str().unwrap(), dir.path(), Some(*seed));
                    if ran.code == 4 {
                        let why = ran.json()["reason"].clone();
                        eprintln!("{} seed {seed}: inconclusive ({why}); once more, on seed {}", case.program, seed + 100);
                        ran = run_program_seeded(path.to_str().unwrap(), dir.path(), Some(seed + 100));
                    }
                    let r = ran.json();
                    assert_nothing_left(&r);
                    let found = anomalies(&r);
                    let right = match case.caught_by {
                        None => ran.code == 0,
                        Some(a) => ran.code == 1 && found.iter().any(|x| x == a),
                    };
                    match right {
                        true => check(case, &r),
                        false => {
                            // Each set fault's windows and firings: an
                            // inconclusive run says which went unstruck.
                            let faults: Vec<String> = r["faults"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .filter(|f| f["probability"].as_f64() > Some(0.0))
                                .map(|f| format!("{} {}/{}", f["point"], f["fired"], f["occurrences"]))
                                .collect();
                            wrong.lock().unwrap().push(format!(
                                "{} seed {seed}: exit {}, anomalies {found:?}, expected {:?}: {} (fired/occurrences: {})",
                                case.program,
                                ran.code,
                                case.caught_by,
                                r["reason"],
                                faults.join(", ")
                            ))
                        }
                    }
                }
            });
        }
    });
    let wrong = wrong.into_inner().unwrap();
    assert!(wrong.is_empty(), "{} of {} runs got the wrong verdict:\n{}", wrong.len(), runs.len(), wrong.join("\n"));
}

/// Issue 39: `chaos init --consumer CMD`, as written with only the command
/// changed, passes both correct consumers (the per-message one took 256 s
/// before the workload's spread, and under per-window rates it was killed
/// over a hundred times and ended incomplete) and catches every broken
/// one; `--email` catches an email sent without an idempotency key. The
/// correct consumer's kills are the aimed ones, each confirmed.
#[test]
fn the_recommended_consumer_scenario_passes_the_correct_consumers_and_catches_every_broken_one() {
    let c = |program, email, caught_by| Power { kind: "consumer", program, email, caught_by };
    let cases = [
        c("consumer.py", false, None),
        c("consumer_per_message.py", false, None),
        c("consumer.py", true, None),
        c("consumer_offset_first.py", false, Some("missing effect")),
        c("consumer_auto_commit.py", false, Some("missing effect")),
        c("consumer_two_transactions.py", false, Some("missing effect")),
        c("consumer_effects_first.py", false, Some("duplicate effect")),
        c("consumer_email_no_key.py", true, Some("duplicate external effect")),
        c("consumer_last_write_wins.py", false, Some("stale projection")),
    ];
    power(&cases, 4, |case, r| {
        if case.caught_by.is_some() {
            return;
        }
        // Right after its database commits, its offset commits and the
        // fetches that bring it records, it absorbs the redelivery; a held
        // COMMIT sees no offset commit, so it kills nobody.
        let aimed: u64 = ["db.kill_after_commit", "kafka.kill_after_offset_commit", "kafka.kill_after_fetch"]
            .iter()
            .map(|p| assert_fired_and_confirmed(r, p))
            .sum();
        assert_eq!(r["components"]["processes_killed"].as_u64(), Some(aimed), "{}", r["components"]);
        // Aimed kills are not the random ones the power line measures.
        assert_eq!(r["components"]["random_kills_measured"], 0, "{}", r["components"]);
        if case.email {
            assert_fired_and_confirmed(r, "provider.response_lost");
        }
    });
}

/// Issue 39: `chaos init --relay CMD`, as written with only the command
/// changed, passes the correct relay and catches a `seq` cursor (the held
/// commits of `workload.slow_commit` make rows visible below it, and the
/// calm half keeps a restart from healing it) and a mark before the
/// broker's ack. Kills right after the broker's acks put duplicates on the
/// topic, which the inbox absorbs.
#[test]
fn the_recommended_relay_scenario_passes_the_correct_relay_and_catches_every_broken_one() {
    let c = |program, caught_by| Power { kind: "relay", program, email: false, caught_by };
    let cases = [
        c("relay.py", None),
        c("relay_seq_cursor.py", Some("unpublished leftover")),
        c("relay_mark_first.py", Some("lost event")),
    ];
    // One at a time. Two at once once left `relay_mark_first.py` uncaught
    // (2 kills after 16 marks, neither losing its batch): the kill landed
    // after the acknowledgement was written, and a loaded harness gave the
    // relay time to produce first. The kill now lands before it is written
    // (30 of 30 right over seeds 1-10, three at once, alone); three at once
    // beside the consumer test's four left the first half of `relay.py`'s
    // seed 1 with one mark, unstruck: inconclusive.
    power(&cases, 1, |case, r| match case.caught_by {
        None => {
            assert_fired_and_confirmed(r, "kafka.kill_after_produce_ack");
            assert!(
                r["counts"]["topic_duplicates"].as_u64().unwrap() > 0,
                "a killed batch goes again: {}",
                r["counts"]
            );
        }
        Some(_) => {
            assert_fired_and_confirmed(r, "workload.slow_commit");
        }
    });
    let empty = run(chaos().args(["init", "--relay", " ", "x.toml"]));
    assert_eq!(empty.code, 2, "{}", empty.stderr);
    assert!(empty.stderr.contains("--relay is empty"), "{}", empty.stderr);
}

#[test]
fn the_correct_python_relay_passes_under_real_kills() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("examples/python/relay.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_eq!(r["scenario"]["relay_command"], "python3 relay.py");
    assert_fired_and_confirmed(&r, "process.kill");
    assert_nothing_left(&r);
}

/// Issue 37: a consumer that commits an empty transaction on every poll
/// gave most aimed kills to idle commits, a kill storm at a modest rate.
/// Only commits that changed rows are occurrences of db.kill_after_commit.
#[test]
fn an_empty_or_read_only_commit_is_never_struck() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/empty_commits.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let k = &r["components"];
    let (written, empty) = (k["commits_written"].as_u64().unwrap(), k["commits_empty"].as_u64().unwrap());
    assert!(written > 0 && empty > written, "the program commits more empty transactions than writing ones: {k}");
    let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == "db.kill_after_commit").unwrap();
    let occurrences = f["occurrences"].as_u64().unwrap();
    assert!(occurrences <= written, "{occurrences} occurrences for {written} writing commits ({empty} empty): {f}");
    assert_fired_and_confirmed(&r, "db.kill_after_commit");
    assert_nothing_left(&r);
}

/// A correct consumer that commits once per message meets ten times the
/// windows of one that commits per batch. Read per second of process life,
/// the aimed kills' rates strike it a few times a run rather than at a
/// quarter of its commits (a kill storm that never drains).
#[test]
fn a_consumer_that_commits_per_message_is_armed_per_second_not_struck_per_commit() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/per_message.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let fired = assert_fired_and_confirmed(&r, "db.kill_after_commit");
    let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == "db.kill_after_commit").unwrap();
    let (windows, seconds, arms) =
        (f["occurrences"].as_u64().unwrap(), f["armed"][0].as_u64().unwrap(), f["armed"][1].as_u64().unwrap());
    // Per window, 0.25 of about 1,000 writing commits would be some 250 kills.
    assert!(windows >= 500 && fired * 20 < windows, "{fired} kills at {windows} commit windows: {f}");
    assert!(fired <= arms && arms <= seconds, "each kill an arm, each arm a process-second: {f}");
    assert_nothing_left(&r);
}

#[test]
fn kills_as_the_topic_grows_are_real_and_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/kill_per_message.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let fired = assert_fired_and_confirmed(&r, "process.kill_per_message");
    assert_eq!(r["components"]["processes_killed"], fired);
    assert_nothing_left(&r);
}

#[test]
fn a_command_that_does_not_exist_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/not_found.toml", dir.path());
    assert_incomplete_naming(&ran, &["could not start `./no-such-consumer`", "No such file"]);
    assert!(std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "json")));
}

#[test]
fn a_program_that_exits_at_once_is_named_with_its_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/exits_at_once.toml", dir.path());
    assert_incomplete_naming(&ran, &["exited on its own with status 2", "fatal: no such topic", "sh -c"]);
}

/// Status 3 before the run acts is the program's word that its
/// environment lacks something (docs/contract.md, section 2): the run ends
/// with exit 3 and one line, the program's last, and nothing outlives it.
#[test]
fn a_program_that_exits_3_before_the_run_acts_ends_it_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/lacks_something.toml", dir.path());
    assert_eq!(ran.code, 3, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let err = the_one_error_of_a_run_that_left_nothing(&ran, dir.path());
    for w in ["notifier-1 exited with status 3 before the run began", "librdkafka 2.x is not installed: run make deps"]
    {
        assert!(err.contains(w), "the error does not say {w:?}: {err}");
    }
    assert!(!err.contains("reading config"), "the last line only: {err}");
}

#[test]
fn a_program_that_never_joins_the_group_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/never_joins.toml", dir.path());
    assert_incomplete_naming(&ran, &["0 of 1 instances", "`sleep 600`", "within 3 s"]);
    assert!(ran.elapsed < Duration::from_secs(40), "took {:?}", ran.elapsed);
}

#[test]
fn a_program_that_never_commits_does_not_drain() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/never_commits.toml", dir.path());
    assert_incomplete_naming(&ran, &["did not drain within 8s", "group lag"]);
}

#[test]
fn a_program_that_writes_elsewhere_than_its_schema_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_program("tests/fixtures/programs/wrong_schema.toml", dir.path());
    assert_incomplete_naming(&ran, &["exited on its own", "wrong_schema.py", "does not exist"]);
}

#[test]
fn ctrl_c_kills_every_process_of_the_run() {
    let (_dir, child, reader) = a_run_with_its_processes_started();
    chaos::nemesis::signal::send(chaos::nemesis::signal::Target::Process(child.id() as i32), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let log = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(130), "{log}");
    assert_each_gone(&log, Duration::ZERO);
}

/// Issue 41's defence in depth: `chaos` itself killed by SIGKILL runs no
/// cleanup at all, and still no process of its run outlives it (each is a
/// direct child with PR_SET_PDEATHSIG, and dies with it).
#[test]
fn a_chaos_killed_by_sigkill_leaves_no_process_behind() {
    let (_dir, child, reader) = a_run_with_its_processes_started();
    chaos::nemesis::signal::send(chaos::nemesis::signal::Target::Process(child.id() as i32), libc::SIGKILL);
    let out = child.wait_with_output().unwrap();
    let log = reader.join().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{log}");
    // The kernel kills them as chaos dies; their own exits take a moment.
    assert_each_gone(&log, Duration::from_secs(10));
}

/// The Python consumer's run on the services, once its group has settled.
fn a_run_with_its_processes_started() -> (tempfile::TempDir, std::process::Child, std::thread::JoinHandle<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path()).args(["-v", "run", "examples/python/consumer.toml", "--reports-dir"]).arg(dir.path());
    // Settled: every process has started and logged its pid, and the
    // workload phase, with the run's signal handler, has begun.
    let (child, reader) = spawn_until(&mut c, &["notifier group settled"], Duration::from_secs(90));
    (dir, child, reader)
}

/// Every process the run's log says it started is gone within `within`.
fn assert_each_gone(log: &str, within: Duration) {
    let pids: Vec<i32> = log
        .lines()
        .filter(|l| l.contains("process started"))
        .filter_map(|l| l.split("pid=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(pids.len() >= 2, "the log names the processes it started: {log}");
    let alive =
        |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/environ")).is_ok_and(|e| e.contains("CHAOS_RUN_ID"));
    let t = std::time::Instant::now();
    while pids.iter().any(|p| alive(*p)) && t.elapsed() < within {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes {left:?} outlived the run");
}

/// `--components process`: every reference relay and notifier an OS
/// process; a crash at a fault point is the harness's SIGKILL.
fn reference_pipeline_as_processes(backend: Backend) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    backend.apply(&mut c);
    c.args(["run", "scenarios/smoke.toml", "--components", "process", "--json", "--reports-dir"]).arg(dir.path());
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let k = &r["components"];
    // 2 relays and 1 notifier, then one new process per crash.
    assert!(k["processes_started"].as_u64().unwrap() > 3, "{k}");
    assert!(k["processes_killed"].as_u64().unwrap() >= 1, "{k}");
    for f in r["faults"].as_array().unwrap().iter().filter(|f| f["probability"].as_f64().unwrap() > 0.0) {
        assert_fired_and_confirmed(&r, f["point"].as_str().unwrap());
    }
    assert_nothing_left(&r);
    r
}

#[test]
fn the_reference_pipeline_runs_as_processes_on_postgres_and_kafka() {
    let r = reference_pipeline_as_processes(Backend::Services);
    // The kill is the kernel's: PostgreSQL saw each killed component's
    // session end.
    let k = &r["components"];
    assert!(k["sessions_at_kill"].as_u64().unwrap() >= 1, "{k}");
    // Most are seen gone within 5 s; one PostgreSQL has not yet noticed was
    // cut (idle in a transaction, waiting on the client) is a fact of the
    // run, not a verdict input (docs/your-system.md), and happens under load
    // (9 of 10 seen gone on a fresh clone).
    let (at_kill, gone) = (k["sessions_at_kill"].as_u64().unwrap(), k["sessions_gone_after_kill"].as_u64().unwrap());
    assert!(gone >= 1 && gone <= at_kill && 2 * gone >= at_kill, "{k}");
}

#[test]
fn the_reference_pipeline_runs_as_processes_embedded() {
    let r = reference_pipeline_as_processes(Backend::Embedded);
    assert_eq!(r["infra"]["database"], "sqlite");
}

/// With stdout and stderr on one terminal (one pipe here), the summary is
/// never split by a log line: between its verdict and its replay line,
/// only its own indented lines. A run whose processes are killed with
/// database sessions open is the one whose warnings used to land there.
#[test]
fn no_log_line_splits_the_summary_with_both_streams_on_one_pipe() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path())
        .args(["run", "tests/fixtures/programs/empty_commits.toml", "--reports-dir"])
        .arg(dir.path());
    // Both streams into one pipe, as a terminal or `2>&1 | tee` shows them.
    let (reader, writer) = std::io::pipe().unwrap();
    c.stdout(writer.try_clone().unwrap()).stderr(writer);
    c.process_group(0);
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut all = String::new();
    use std::io::Read;
    let mut reader = reader;
    reader.read_to_string(&mut all).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{all}");
    let lines: Vec<&str> = all.lines().collect();
    let verdict =
        lines.iter().position(|l| l.starts_with("PASS ")).unwrap_or_else(|| panic!("no verdict line:\n{all}"));
    let replay = lines.iter().position(|l| l.trim_start().starts_with("replay ")).expect("a replay line");
    assert!(verdict < replay, "{all}");
    for l in &lines[verdict + 1..replay] {
        assert!(l.starts_with("  "), "a line that is not the summary's splits it: {l:?}\n{all}");
    }
}

/// Issue 39: `[nemesis] targets = ["notifier"]` aims the random kills and
/// pauses at the consumers: a zombie without a stalled relay. Every
/// process firing names a notifier, and there are some.
#[test]
fn kills_and_pauses_aimed_at_the_notifiers_never_strike_a_relay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aimed.toml");
    let text = "[workload]\npayments = 400\nspread_secs = 8\n[faults]\nprocess_pause = 0.3\nprocess_kill = 0.2\n\
                [nemesis]\ntargets = [\"notifier\"]\npause_secs = 1\n[run]\ncomponents = \"process\"\n";
    std::fs::write(&path, text).unwrap();
    let ran = run_scenario(Backend::Embedded, &path, dir.path(), &[]);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let struck: Vec<&str> = r["fault_log"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["point"].as_str().unwrap().starts_with("process."))
        .map(|f| f["component"].as_str().unwrap())
        .collect();
    assert!(!struck.is_empty(), "no kill or pause fired: {}", r["fault_log"]);
    assert!(struck.iter().all(|c| c.starts_with("notifier-")), "{struck:?}");
}
