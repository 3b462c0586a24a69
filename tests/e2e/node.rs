//! A consumer in a second language, without static membership: the orders
//! system (examples/orders: its schema, Python service and relay) with its
//! consumer in Node.js (examples/node: kafkajs and pg), run as processes
//! under real kills and pauses on PostgreSQL and Kafka. kafkajs cannot set
//! `group.instance.id`, so every restart makes the group rebalance. The
//! correct consumer passes with every fault fired and confirmed; its twin
//! that commits its offsets before it stores loses orders.

use crate::common::*;
use std::path::Path;

fn run_node(scenario: &str, reports: &Path) -> Ran {
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    // The service and the relay are Python (the venv first on PATH), the
    // consumer Node.js (its packages on NODE_PATH).
    c.env("PATH", python_path()).env("NODE_PATH", node_path()).env_remove("CHAOS_SKIP_GROUP_WAIT");
    c.arg("run").arg(scenario).args(["--json", "--reports-dir"]).arg(reports);
    run(&mut c)
}

#[test]
fn the_node_consumer_without_static_membership_passes_under_real_kills_and_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_node("examples/node/orders-node.toml", dir.path());
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let r = ran.json();
    assert_nothing_left(&r);
    for point in ["process.kill", "process.pause", "db.kill_after_commit", "kafka.kill_after_offset_commit"] {
        assert_fired_and_confirmed(&r, point);
    }
    let s = &r["system"];
    let n = |k: &str| s[k].as_u64().unwrap();
    assert_eq!(n("acknowledged") + n("refused") + n("ambiguous"), 1000, "{s}");
    assert!(n("outbox_events") >= n("acknowledged"), "{s}");
    let names: Vec<&str> = r["invariants"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    for want in [
        "effect shipments: exactly one per OrderPlaced message",
        "effect stock: amounts per key equal the operations' quantity",
    ] {
        assert!(names.contains(&want), "{want} not checked: {names:?}");
    }
    // Its work was applied by the poller, after the drain: nothing pending.
    assert!(r["anomalies"].as_array().unwrap().is_empty(), "{}", r["anomalies"]);
}

#[test]
fn a_node_consumer_that_acknowledges_before_it_stores_loses_orders() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_node("examples/node/broken-ack-first.toml", dir.path());
    let r = ran.json();
    assert_nothing_left(&r);
    assert_eq!(ran.code, 1, "the ack-first consumer was not caught: {}\nstderr:\n{}", r["reason"], ran.stderr);
    let found: Vec<&str> = r["anomalies"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert!(found.contains(&"missing effect"), "anomalies {found:?}, expected \"missing effect\"");
    // The kill aimed at its window: right after the coordinator answered
    // an offset commit, before the store.
    assert_fired_and_confirmed(&r, "kafka.kill_after_offset_commit");
    let a = r["anomalies"].as_array().unwrap().iter().find(|a| a["name"] == "missing effect").unwrap();
    assert!(!a["examples"].as_array().unwrap().is_empty(), "{a}");
    // Its cause by data: the proxy read what each offset commit covered,
    // and some missing order's message was in one followed by a kill.
    let by_data = a["followed"].as_array().unwrap().iter().flat_map(|f| f["faults"].as_array().unwrap()).any(|s| {
        s["by"] == "data"
            && s["point"] == "kafka.kill_after_offset_commit"
            && s["matched"].as_str().unwrap_or_default().contains("its offset commit (partition ")
    });
    assert!(by_data, "no missing effect was tied by data to a kill after an offset commit: {}", a["followed"]);
}
