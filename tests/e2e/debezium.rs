//! Debezium as the relay under test (examples/debezium): a Kafka Connect
//! worker with Debezium's PostgreSQL connector and its outbox event router,
//! started by examples/debezium/connect.py from the jars
//! `scripts/services.sh up connect` fetched, on the real PostgreSQL (with
//! `wal_level=logical`) and Kafka. The correct configuration passes with
//! its worker killed; a router keyed by the event id splits an order's
//! events across partitions; a partition that never heals between Connect
//! and PostgreSQL is a stalled relay. However a run ends, its replication
//! slot and publication are gone with it.

use crate::common::*;
use std::path::Path;
use std::process::Command;

fn run_debezium(file: &str, seed: u64) -> (Ran, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path())
        .arg("run")
        .arg(Path::new("examples/debezium").join(file))
        .args(["--json", "--seed", &seed.to_string(), "--reports-dir"])
        .arg(dir.path());
    let ran = run(&mut c);
    let r = ran.json();
    assert_nothing_left(&r);
    assert_no_replication_left(&r);
    (ran, r)
}

/// The run's replication slot and publication (named like its schema)
/// were dropped when it ended.
fn assert_no_replication_left(r: &serde_json::Value) {
    let schema = r["infra"]["schema"].as_str().expect("infra.schema");
    let sql = format!(
        "SELECT slot_name FROM pg_replication_slots WHERE slot_name = '{schema}' \
         UNION ALL SELECT pubname FROM pg_publication WHERE pubname = '{schema}'"
    );
    let out = Command::new("psql").args([&database_url(), "-XAtc", &sql]).output().expect("psql");
    assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
    let left = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(left.is_empty(), "the run left its replication behind: {left}");
}

fn anomalies(r: &serde_json::Value) -> Vec<String> {
    r["anomalies"].as_array().expect("anomalies").iter().map(|a| a["name"].as_str().unwrap().to_string()).collect()
}

/// How often the nemesis SIGKILLed the Connect worker (the relay slot).
fn relay_kills(r: &serde_json::Value) -> usize {
    r["fault_log"]
        .as_array()
        .expect("fault_log")
        .iter()
        .filter(|f| f["point"] == "process.kill" && f["component"].as_str().is_some_and(|c| c.starts_with("relay-")))
        .count()
}

#[test]
fn debezium_passes_with_its_connect_worker_killed() {
    // Seed 1 kills the worker at least once (measured: 1 to 2 kills); the
    // assertion below says so if a change of timing ever makes it miss.
    let (ran, r) = run_debezium("debezium.toml", 1);
    assert_eq!(ran.code, 0, "{}\nstdout:\n{}\nstderr:\n{}", r["reason"], ran.stdout, ran.stderr);
    assert!(relay_kills(&r) >= 1, "the Connect worker was never killed: {}", r["fault_log"]);
    assert_fired_and_confirmed(&r, "process.kill");
    let s = &r["system"];
    let n = |k: &str| s[k].as_u64().unwrap();
    // Two events per order: each acknowledged order has both on the topic.
    assert!(n("outbox_events") >= 2 * n("acknowledged"), "{s}");
}

#[test]
fn a_router_keyed_by_the_event_id_splits_an_orders_events() {
    let (ran, r) = run_debezium("broken-key.toml", 1);
    assert_eq!(ran.code, 1, "{}\nstderr:\n{}", r["reason"], ran.stderr);
    let found = anomalies(&r);
    assert!(found.iter().any(|a| a == "split key"), "{found:?}");
    // Nothing is lost: only the order is.
    assert!(!found.iter().any(|a| a == "lost event" || a == "missing effect"), "{found:?}");
}

#[test]
fn a_partition_between_connect_and_postgresql_that_never_heals_is_a_stalled_relay() {
    let (ran, r) = run_debezium("planted-stall.toml", 1);
    assert_eq!(ran.code, 1, "{}\nstderr:\n{}", r["reason"], ran.stderr);
    let found = anomalies(&r);
    assert_eq!(found.first().map(String::as_str), Some("stalled relay"), "{found:?}");
    assert!(!found.iter().any(|a| a == "lost event"), "unpublished events reported lost: {found:?}");
    assert_fired_and_confirmed(&r, "net.blackhole");
}

/// Connect's jars not fetched: connect.py exits 3 before the run acts, and
/// the run ends with exit 3 and its one line naming the script that
/// fetches them; no process outlives it, and no slot is left (the
/// connector never existed).
#[test]
fn connect_without_its_jars_ends_the_run_with_exit_3_naming_the_script() {
    let nowhere = std::env::temp_dir().join("chaos-no-jars-here");
    let err = the_exit_3_line_of_debezium_toml_with("CHAOS_CONNECT_LIB", nowhere.to_str().unwrap());
    assert!(err.contains("jars are not in") && err.contains("chaos-no-jars-here"), "{err}");
    assert!(err.contains("run scripts/services.sh up connect"), "{err}");
}

/// PostgreSQL without logical decoding (a cluster of the test's own, on
/// `wal_level=replica`, the default): connect.py exits 3 before the worker
/// starts, and the run ends with exit 3 and one line naming the setting and
/// the script that sets it. The suite's own cluster is left alone: turning
/// its `wal_level` down would refuse to start while any slot exists.
#[test]
fn postgresql_without_logical_decoding_ends_the_run_with_exit_3_naming_the_fix() {
    let pg = ThrowawayPostgres::start();
    let err = the_exit_3_line_of_debezium_toml_with("DATABASE_URL", &pg.url);
    assert!(err.contains("wal_level=replica") && err.contains("wal_level=logical"), "{err}");
    assert!(err.contains("run scripts/services.sh up postgres"), "{err}");
}

/// examples/debezium/debezium.toml on the services, with `key` set to
/// `value`: it must end with exit 3, before the run acts, its one error line
/// saying that connect.py lacks something, and no process left.
fn the_exit_3_line_of_debezium_toml_with(key: &str, value: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env("PATH", python_path()).env(key, value);
    c.args(["run", "examples/debezium/debezium.toml", "--reports-dir"]).arg(dir.path());
    let ran = run(&mut c);
    assert_eq!(ran.code, 3, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let err = the_one_error_of_a_run_that_left_nothing(&ran, dir.path());
    assert!(err.contains("relay-1 exited with status 3 before the run began"), "{err}");
    err
}

/// A PostgreSQL cluster in a temporary folder, on a port of its own, with
/// the server's defaults (so `wal_level=replica`) and trust for local TCP;
/// stopped and removed when dropped. The server refuses to run as root, so
/// as root it runs as the `postgres` user that Debian's package creates.
struct ThrowawayPostgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    url: String,
}

impl ThrowawayPostgres {
    fn start() -> Self {
        let bin = Path::new("/usr/lib/postgresql/15/bin").to_path_buf();
        let dir = tempfile::tempdir().unwrap();
        if unsafe { libc::geteuid() } == 0 {
            assert!(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = ThrowawayPostgres { url: format!("postgres://chaos@127.0.0.1:{port}/postgres"), dir, bin };
        let data = pg.dir.path().join("data");
        let mut init = pg.as_owner("initdb");
        pg.ok(init.args(["-A", "trust", "-U", "chaos", "-D"]).arg(&data));
        let opts = format!("-p {port} -c listen_addresses=127.0.0.1 -k {}", pg.dir.path().display());
        let mut start = pg.as_owner("pg_ctl");
        start.args(["-w", "-l"]).arg(pg.dir.path().join("log")).args(["-o", &opts, "-D"]).arg(&data).arg("start");
        pg.ok(&mut start);
        pg
    }

    /// One of the cluster's programs, as the user that owns its folder.
    fn as_owner(&self, program: &str) -> Command {
        if unsafe { libc::geteuid() } != 0 {
            return Command::new(self.bin.join(program));
        }
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(self.bin.join(program));
        c
    }

    fn ok(&self, c: &mut Command) {
        let out = c.output().expect("the PostgreSQL 15 server programs");
        assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        // No assertion here: a drop while a failed test unwinds must not panic.
        let data = self.dir.path().join("data");
        let _ = self.as_owner("pg_ctl").args(["-m", "immediate", "-D"]).arg(&data).arg("stop").output();
    }
}
