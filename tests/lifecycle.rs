//! Interruptions and services dying mid-run: the harness never hangs and
//! never prints a green verdict over an incomplete run.
//!
//! A test binary of its own, apart from `tests/e2e/`: its outage tests stop
//! and start the shared PostgreSQL and Kafka, which would break any
//! end-to-end test running beside them in one binary.

#[path = "e2e/common.rs"]
mod common;
use common::*;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The outage tests stop and start the shared services; one at a time.
static SERVICES: Mutex<()> = Mutex::new(());

fn services(args: &[&str]) {
    let ok = Command::new("bash")
        .arg(root().join("scripts/services.sh"))
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("scripts/services.sh")
        .success();
    assert!(ok, "scripts/services.sh {args:?} failed");
}

fn scenario(dir: &std::path::Path, payments: u32) -> std::path::PathBuf {
    let path = dir.join("long.toml");
    std::fs::write(
        &path,
        format!(
            "seed = 9\n[workload]\npayments = {payments}\nproducers = 1\n[faults]\nrelay_after_produce = 0.1\n[run]\ndrain_timeout_secs = 60\n"
        ),
    )
    .unwrap();
    path
}

/// The log lines that end the run's wait for its notifier group: the
/// workload starts right after either.
const GROUP_WAIT_OVER: [&str; 2] = ["notifier group settled", "did not settle"];

fn interrupted_by(signal: i32) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.arg("run").arg(scenario(dir.path(), 20_000)).args(["--json", "--reports-dir"]).arg(dir.path());
    Backend::Embedded.apply(&mut c);
    // The workload phase, with its signal handler, has begun once the
    // group wait is over (settled or not); a sleep could land before it.
    c.env("RUST_LOG", "info");
    let (child, stderr) = spawn_until(&mut c, &GROUP_WAIT_OVER, Duration::from_secs(60));
    // Through chaos's one signalling function, which refuses this process and its group.
    chaos::nemesis::signal::send(chaos::nemesis::signal::Target::Process(child.id() as i32), signal);
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?} to stop", t.elapsed());
    assert_eq!(out.status.code(), Some(130), "{}", stderr.join().unwrap());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid_report(&r);
    assert_eq!(r["verdict"], "interrupted");
    assert!(r["invariants"].as_array().unwrap().is_empty(), "nothing is verified after an interruption");
    let id = r["run_id"].as_str().unwrap();
    assert!(dir.path().join(format!("{id}.json")).exists(), "the partial report is written");
}

#[test]
fn sigterm_writes_an_interrupted_report_and_exits_130() {
    interrupted_by(libc::SIGTERM);
}

#[test]
fn ctrl_c_writes_an_interrupted_report_and_exits_130() {
    interrupted_by(libc::SIGINT);
}

/// Runs a long scenario on the real services while `outage` runs; the run
/// must end within its drain timeout, and either pass with every invariant
/// or be marked incomplete.
fn survives(outage: impl FnOnce()) -> serde_json::Value {
    let _one = SERVICES.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.arg("run").arg(scenario(dir.path(), 4000)).args(["--json", "--reports-dir"]).arg(dir.path());
    Backend::Services.apply(&mut c);
    // The outage must hit a running pipeline, not its setup.
    c.env("RUST_LOG", "info");
    let (child, stderr) = spawn_until(&mut c, &GROUP_WAIT_OVER, Duration::from_secs(60));
    outage();
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(120), "took {:?}", t.elapsed());
    let code = out.status.code();
    let stderr = stderr.join().unwrap();
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("no report; exit {code:?}\n{stderr}"));
    assert_valid_report(&r);
    match code {
        Some(0) => {
            assert_eq!(r["verdict"], "pass");
            assert!(violated(&r).is_empty(), "{:?}", violated(&r));
            assert_eq!(r["counts"]["payments_with_one_receipt"], 4000);
        }
        Some(5) => {
            assert_eq!(r["verdict"], "incomplete", "{r:#}");
            assert!(!r["reason"].as_str().unwrap().is_empty());
        }
        other => panic!("exit {other:?}: a dying service must give 0 (recovered) or 5 (incomplete)\n{stderr}"),
    }
    eprintln!("outage: exit {code:?}, verdict {}, reason {}", r["verdict"], r["reason"]);
    r
}

#[test]
fn kafka_stopped_and_started_mid_run() {
    survives(|| {
        services(&["down", "kafka"]);
        services(&["up", "kafka"]);
    });
}

#[test]
fn postgres_restarted_mid_run() {
    survives(|| {
        services(&["down", "postgres"]);
        services(&["up", "postgres"]);
    });
}

/// The shipped scenario of every infrastructure fault at once, on the real
/// services: the reference pipeline passes, and each fault fired and was
/// confirmed (the broker seen stopped, gone and back; the postmaster's
/// start time moved; sessions terminated; the proxy's resets, blackholes
/// and withheld commit acknowledgements).
#[test]
fn the_reference_pipeline_passes_every_infrastructure_fault_at_once() {
    let _one = SERVICES.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.args(["run", "scenarios/infra-faults.toml", "--json", "--reports-dir"]).arg(dir.path());
    Backend::Services.apply(&mut c);
    let ran = run(&mut c);
    // Whatever happened, the services are up for the tests after this one.
    services(&["up"]);
    let r = ran.json();
    // A run that cannot recover within its drain timeout must say so and
    // never pass. Before a fenced consumer was replaced, 2 of 10 seeds
    // ended so (the group stopped consuming after the broker's restart);
    // the final build passed 10 of 10 (README, Measured).
    if ran.code == 5 {
        assert_eq!(r["verdict"], "incomplete");
        assert!(r["reason"].as_str().unwrap().contains("did not drain"), "{}", r["reason"]);
        eprintln!("infra-faults: incomplete: {}", r["reason"]);
        return;
    }
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    for point in [
        "broker.pause",
        "broker.kill",
        "db.restart",
        "db.terminate_backends",
        "db.commit_ack_lost",
        "db.kill_after_commit",
        "kafka.produce_ack_lost",
        "kafka.kill_after_produce_ack",
        "net.reset",
        "net.blackhole",
    ] {
        let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == point).unwrap();
        assert!(f["fired"].as_u64().unwrap() >= 1, "{point} never fired: {f}");
        assert_eq!(f["confirmed"], f["fired"], "{point}: {f}");
    }
    let log = r["fault_log"].as_array().unwrap();
    let killed = log.iter().find(|l| l["point"] == "broker.kill").expect("broker.kill in the fault log");
    assert!(killed["component"].as_str().unwrap().starts_with("broker 127.0.0.1:"), "{killed}");
}

#[test]
fn a_timeline_fault_that_is_not_a_service_fault_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(&path, "[[nemesis.timeline]]\nfault = \"relay.after_produce\"\nat = \"1s\"\n").unwrap();
    let ran = run(chaos().arg("run").arg(&path));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("t.toml:2:9: `nemesis.timeline.fault` is \"relay.after_produce\""), "{}", ran.stderr);
    assert!(ran.stderr.contains("\"broker.pause\""), "{}", ran.stderr);
}

#[test]
fn a_service_fault_without_a_time_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(&path, "[faults]\nbroker_pause = 0.5\n").unwrap();
    let ran = run(chaos().arg("run").arg(&path));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("strikes only at the times of a `[[nemesis.timeline]]` entry"), "{}", ran.stderr);
}

#[test]
fn a_database_fault_on_sqlite_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(&path, "[[nemesis.timeline]]\nfault = \"db.restart\"\nat = \"1s\"\n").unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    let ran = run(c.arg("run").arg(&path).arg("--reports-dir").arg(dir.path()));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("db.restart needs PostgreSQL"), "{}", ran.stderr);
    assert!(ran.stderr.contains("DATABASE_URL"), "{}", ran.stderr);
}

/// On the mock cluster the broker's faults go through its own controls: a
/// pause is a round trip as long as the pause, a kill the broker down.
#[test]
fn the_broker_paused_and_killed_on_the_mock_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(
        &path,
        "[workload]\npayments = 600\n[faults]\nrelay_after_produce = 0.1\n\
         [[nemesis.timeline]]\nfault = \"broker.pause\"\nat = \"200ms\"\nfor = \"1s\"\n\
         [[nemesis.timeline]]\nfault = \"broker.kill\"\nat = \"1500ms\"\nfor = \"1s\"\n",
    )
    .unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    let ran = run(c.arg("run").arg(&path).args(["--json", "--reports-dir"]).arg(dir.path()));
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    for point in ["broker.pause", "broker.kill"] {
        let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == point).unwrap();
        assert_eq!(f["fired"], 1, "{f}");
        assert_eq!(f["confirmed"], 1, "{f}");
    }
    let log = r["fault_log"].as_array().unwrap();
    assert!(log.iter().any(|l| l["hit"].as_str().unwrap().starts_with("mock broker down")), "{log:?}");
}

/// Stops the three-node cluster however the test ends: it holds 1.5 GB.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(root().join("scripts/services.sh")).args(["down", "cluster"]).status();
    }
}

/// The partition's leader killed on a three-broker cluster: the reference
/// relay (acks from every in-sync replica, idempotent) loses nothing, and
/// the kill is confirmed by another broker taking the partition.
#[test]
fn a_partition_leader_killed_on_a_three_broker_cluster_loses_nothing() {
    services(&["up", "cluster"]);
    let _cluster = Cluster;
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.args(["run", "scenarios/broker-failover.toml", "--json", "--reports-dir"]).arg(dir.path());
    Backend::Services.apply(&mut c);
    c.env("KAFKA_BROKERS", "127.0.0.1:29092,127.0.0.1:29094,127.0.0.1:29096");
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == "broker.kill_leader").unwrap();
    assert_eq!((f["fired"].as_u64(), f["confirmed"].as_u64()), (Some(1), Some(1)), "{f}");
}

#[test]
fn killing_a_leader_needs_a_real_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(&path, "[[nemesis.timeline]]\nfault = \"broker.kill_leader\"\nat = \"1s\"\n").unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    let ran = run(c.arg("run").arg(&path).arg("--reports-dir").arg(dir.path()));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("broker.kill_leader needs a real Kafka cluster"), "{}", ran.stderr);
}
