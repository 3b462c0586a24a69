//! Every shipped scenario loads, and bad scenario files fail with one line
//! naming file, line and column, and exit code 2.

use crate::common::*;
use chaos::faults::FaultPoint;

#[test]
fn every_shipped_scenario_is_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().map(|e| e == "toml").unwrap_or(false) {
            chaos::scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 5, "expected the shipped scenarios, found {n}");
}

#[test]
fn payments_toml_reproduces_the_experiment() {
    let s = chaos::scenario::load(&root().join("scenarios/payments.toml")).unwrap();
    assert_eq!(s.payments, 1000);
    assert_eq!(s.relay.instances, 2);
    // 9% of full 5-event batches, retried crashes included: about 200 of
    // the 2,000 events twice on the topic (the seed's 201).
    assert_eq!(s.relay.batch_size, 5);
    assert_eq!(s.faults.get(FaultPoint::RelayAfterProduce), 0.09);
    assert_eq!(s.faults.get(FaultPoint::NotifierBeforeOffsetCommit), 0.002);
    assert!(s.exactly_once);
}
