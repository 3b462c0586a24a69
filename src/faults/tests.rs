use super::*;
use crate::broker::Position;
use std::sync::atomic::Ordering;

#[test]
fn a_reach_keeps_a_batch_as_runs_of_seqs_and_spans_of_offsets() {
    let r = Reach::outbox([9, 5, 6, 7, 12, 13, 6]);
    assert_eq!(r.seqs, [(5, 7), (9, 9), (12, 13)]);
    assert_eq!((r.seq_run(6), r.seq_run(8), r.seq_run(13)), (Some((5, 7)), None, Some((12, 13))));
    let t = Reach::topic([(1, 20), (0, 3), (1, 18), (1, 19)].map(Position::from));
    assert_eq!(t.spans, [(1, 18, 20), (0, 3, 3)]);
    let at = |l, a| t.span_of(Position::new(l, a));
    assert_eq!((at(1, 19), at(0, 4), at(2, 19)), (Some((1, 18, 20).into()), None, None));
    assert!(Reach::default().is_empty() && !t.is_empty());
}

/// Two processes over 200 seconds, one meeting 10 windows a second (a
/// consumer that commits per message), the other 1 (per batch of ten):
/// the kills each takes at one scenario's rate.
fn kills_per_program(aimed: Aimed, rate: f64) -> (u64, u64) {
    let point = FaultPoint::DbKillAfterCommit;
    let f = FaultInjector::new(7, &FaultRates::none().with(point, rate)).with_aimed(aimed);
    let (mut per_message, mut per_batch) = (0, 0);
    for _second in 0..200 {
        if aimed == Aimed::PerSecond {
            f.arm(point, "notifier-1");
            f.arm(point, "notifier-2");
        }
        per_message += (0..10).filter(|_| f.strike(point, "notifier-1", String::new)).count() as u64;
        per_batch += f.strike(point, "notifier-2", String::new) as u64;
    }
    (per_message, per_batch)
}

#[test]
fn per_second_an_aimed_kill_strikes_programs_alike_whatever_their_windows() {
    let (per_message, per_batch) = kills_per_program(Aimed::PerSecond, 0.1);
    // About 20 arms each (200 seconds at 0.1), each struck once.
    assert!((10..=32).contains(&per_message) && (10..=32).contains(&per_batch), "{per_message} {per_batch}");
    assert!(per_message.abs_diff(per_batch) <= 12, "{per_message} against {per_batch}");
    // Per occurrence, the same rate strikes the per-message program
    // about ten times as often: the kill storm this mode ends.
    let (per_message, per_batch) = kills_per_program(Aimed::PerOccurrence, 0.1);
    assert!(per_message > 5 * per_batch, "{per_message} against {per_batch}");
}

/// `[faults.service]`: the service's seconds are drawn at its own rate,
/// every other process's at the scenario's, and the summary says both.
#[test]
fn a_roles_own_rate_arms_that_roles_processes_only() {
    let point = FaultPoint::DbKillAfterCommit;
    let f = FaultInjector::new(3, &FaultRates::none().with(point, 0.1))
        .with_aimed(Aimed::PerSecond)
        .with_role_rates(vec![RoleRate { role: "service".into(), point, rate: 0.4 }]);
    let (mut service, mut consumer) = (0, 0);
    for _second in 0..400 {
        f.arm(point, "service-1");
        f.arm(point, "notifier-1");
        // Windows enough each second for any arm to strike in it.
        for _window in 0..ARM_SPREAD {
            service += f.strike(point, "service-1", String::new) as u64;
            consumer += f.strike(point, "notifier-1", String::new) as u64;
        }
    }
    // About 160 and 40: four times the strikes, not the same.
    assert!((120..=200).contains(&service) && (20..=60).contains(&consumer), "{service} {consumer}");
    let s = f.summary().into_iter().find(|s| s.point == point.name()).unwrap();
    assert_eq!(s.rates(), "0.1, service 0.4", "as the reports' faults tables show it");
    assert_eq!((s.probability, s.per_role), (0.1, vec![("service".to_string(), 0.4)]));
    // Another point keeps the scenario's rate: 0 arms nothing.
    assert!(!f.arm(FaultPoint::KafkaKillAfterFetch, "service-1"));
}

/// `[faults.notifier] db_commit_ack_lost`: a per-commit rate of the
/// consumers' own, drawn at each of their commits; every other process's
/// commits keep the scenario's.
#[test]
fn a_roles_own_rate_per_commit_strikes_that_roles_commits() {
    let point = FaultPoint::DbCommitAckLost;
    let f = FaultInjector::new(5, &FaultRates::none().with(point, 0.03))
        .with_aimed(Aimed::PerSecond)
        .with_role_rates(vec![RoleRate { role: "notifier".into(), point, rate: 0.3 }]);
    let (mut service, mut consumer) = (0, 0);
    for _commit in 0..1000 {
        service += f.strike(point, "service-1", String::new) as u64;
        consumer += f.strike(point, "notifier-2", String::new) as u64;
    }
    // About 30 and 300.
    assert!((10..=60).contains(&service) && (240..=360).contains(&consumer), "{service} {consumer}");
}

/// Once the harness stops the faults (the drain's last timeout), no point
/// strikes, a per-commit one included: `db.commit_ack_lost` kept striking
/// a library's relay 36 s into the stretch the report called fault-free.
#[test]
fn no_point_strikes_once_the_faults_have_stopped() {
    let point = FaultPoint::DbCommitAckLost;
    let f = FaultInjector::new(5, &FaultRates::none().with(point, 1.0).with(FaultPoint::RelayAfterProduce, 1.0));
    assert!(f.strike(point, "relay-1", String::new), "rate 1 strikes every commit");
    f.stop();
    for _commit in 0..100 {
        assert!(!f.strike(point, "relay-1", String::new), "a commit struck after the faults stopped");
        assert!(!f.strike(FaultPoint::RelayAfterProduce, "relay-1", String::new));
    }
    assert_eq!(f.fired(point), 1);
}

#[test]
fn an_arm_is_taken_once_by_its_own_process_and_a_schedule_ignores_it() {
    let point = FaultPoint::KafkaKillAfterFetch;
    let rates = FaultRates::none().with(point, 1.0);
    let f = FaultInjector::new(1, &rates).with_aimed(Aimed::PerSecond);
    assert!(!f.strike(point, "notifier-1", String::new), "unarmed: a window is no kill");
    assert!(f.arm(point, "notifier-1") && f.arm(point, "notifier-1"), "rate 1 arms every second");
    assert!(!f.strike(point, "notifier-2", String::new), "another process's arm is not this one's");
    let struck = (1..=ARM_SPREAD).find(|_| f.strike(point, "notifier-1", String::new));
    assert!(struck.is_some(), "the armed process is struck within {ARM_SPREAD} windows");
    for _ in 0..2 * ARM_SPREAD {
        assert!(!f.strike(point, "notifier-1", String::new), "two arms before a strike are one");
    }
    let windows = 2 + struck.unwrap() + 2 * ARM_SPREAD;
    assert_eq!((f.occurrences[point.index()].load(Ordering::Relaxed), f.fired(point)), (windows, 1));
    assert_eq!(f.armed(point), (2, 2));
    let s = f.summary().into_iter().find(|s| s.point == point.name()).unwrap();
    assert!(s.unit.starts_with("second, per process") && s.armed == Some((2, 2)), "{s:?}");
    // Only aimed kills are armed; other points keep their rate per occurrence.
    let other = FaultInjector::new(1, &FaultRates::none().with(FaultPoint::RelayAfterProduce, 1.0))
        .with_aimed(Aimed::PerSecond);
    assert!(!other.arm(FaultPoint::RelayAfterProduce, "relay-1"));
    assert!(other.strike(FaultPoint::RelayAfterProduce, "relay-1", String::new));
    // A schedule pins windows by occurrence, armed or not.
    let pinned = FaultInjector::new(1, &rates)
        .with_schedule(Some(Schedule::parse("kafka.kill_after_fetch:1").unwrap()))
        .with_aimed(Aimed::PerSecond);
    let fired: Vec<bool> = (0..3).map(|_| pinned.strike(point, "notifier-1", String::new)).collect();
    assert_eq!(fired, [false, true, false]);
}

#[test]
fn only_a_consumer_waits_and_only_while_its_group_rebalances() {
    let f = FaultInjector::new(1, &FaultRates::none());
    assert!(!f.waits_for_group("notifier-1"), "a group never read is stable");
    f.set_group_stable(false);
    assert!(f.waits_for_group("notifier-2") && !f.waits_for_group("relay-1") && !f.waits_for_group("workload"));
    f.set_group_stable(true);
    assert!(!f.waits_for_group("notifier-2"));
}

#[test]
fn decisions_replay_and_follow_the_rate() {
    let a: Vec<bool> = (0..10_000).map(|n| decide(42, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
    let b: Vec<bool> = (0..10_000).map(|n| decide(42, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
    assert_eq!(a, b);
    let fired = a.iter().filter(|x| **x).count();
    assert!((800..1200).contains(&fired), "fired {fired} of 10000 at p=0.1");
    let other: Vec<bool> = (0..10_000).map(|n| decide(43, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
    assert_ne!(a, other, "another seed must give other decisions");
}

#[test]
fn zero_and_one_are_never_and_always() {
    assert!((0..1000).all(|n| !decide(1, FaultPoint::WorkloadPoison, n, 0.0)));
    assert!((0..1000).all(|n| decide(1, FaultPoint::WorkloadPoison, n, 1.0)));
}

#[test]
fn injector_counts_and_logs() {
    let rates = FaultRates::none().with(FaultPoint::RelayAfterProduce, 1.0);
    let f = FaultInjector::new(7, &rates);
    assert!(f.strike(FaultPoint::RelayAfterProduce, "relay-1", || "batch of 3".into()));
    assert!(!f.strike(FaultPoint::NotifierBeforeOffsetCommit, "notifier-1", || unreachable!()));
    assert_eq!(f.fired(FaultPoint::RelayAfterProduce), 1);
    assert_eq!(f.log()[0].component, "relay-1");
    let summary = f.summary();
    let point = |p: FaultPoint| summary.iter().find(|s| s.point == p.name()).unwrap();
    assert_eq!(point(FaultPoint::NotifierBeforeOffsetCommit).occurrences, 1);
    assert_eq!(point(FaultPoint::RelayAfterProduce).confirmed, 0, "fired is not confirmed");
}

#[test]
fn a_schedule_fires_exactly_its_occurrences_and_reads_back() {
    let s = Schedule::parse("relay.after_produce:3,1; notifier.mid_batch:0").unwrap();
    assert_eq!(s.to_string(), "relay.after_produce:1,3;notifier.mid_batch:0");
    assert_eq!(Schedule::parse(&s.to_string()).unwrap(), s);
    assert_eq!(Schedule::parse("none").unwrap().to_string(), "none");
    let rates = FaultRates::none()
        .with(FaultPoint::RelayAfterProduce, 0.5)
        .with(FaultPoint::NotifierMidBatch, 0.5)
        .with(FaultPoint::NotifierStall, 1.0);
    let f = FaultInjector::new(9, &rates).with_schedule(Some(s.clone()));
    let fired: Vec<bool> = (0..6).map(|_| f.strike(FaultPoint::RelayAfterProduce, "relay-1", String::new)).collect();
    assert_eq!(fired, [false, true, false, true, false, false]);
    assert!(f.strike(FaultPoint::NotifierMidBatch, "notifier-1", String::new));
    assert!(!f.strike(FaultPoint::NotifierMidBatch, "notifier-1", String::new));
    // A point the schedule leaves out never fires, and counts as off.
    assert!((0..50).all(|_| !f.strike(FaultPoint::NotifierStall, "notifier-1", String::new)));
    assert_eq!(f.probability(FaultPoint::NotifierStall), 0.0);
    assert_eq!(f.fired_schedule(), s);
    assert_eq!(f.log()[1].occurrence, Some(3));
}

#[test]
fn bad_schedules_are_refused_with_the_fix() {
    for (text, says) in [
        ("relay.after_produce", "POINT:N"),
        ("relay.nope:1", "not a fault point"),
        ("relay.after_produce:x", "not an occurrence"),
        ("broker.kill:0", "nemesis.timeline"),
        (";", "empty"),
    ] {
        let e = Schedule::parse(text).unwrap_err();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn all_is_in_discriminant_order() {
    // `strike` indexes its arrays by discriminant: a point missing from
    // ALL, or out of order, would index out of bounds or count wrongly.
    for (i, p) in FaultPoint::ALL.iter().enumerate() {
        assert_eq!(*p as usize, i, "{}", p.name());
    }
}

#[test]
fn redelivery_confirms_what_waits_for_it_once() {
    let f = FaultInjector::new(1, &FaultRates::none());
    let a = f.delivered((2, 40).into(), [(2, 40), (2, 41)].map(Position::from));
    f.await_redelivery(FaultPoint::NotifierMidBatch, 1, a);
    f.delivered((2, 39).into(), [(2, 39)].map(Position::from));
    f.delivered((1, 40).into(), [(1, 40)].map(Position::from));
    assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 0, "another message, another partition");
    let again = f.delivered((2, 38).into(), [(2, 38), (2, 39), (2, 40)].map(Position::from));
    assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 1);
    f.settled(again);
    f.delivered((2, 40).into(), [(2, 40)].map(Position::from));
    assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 1, "confirmed once");
}

#[test]
fn a_redelivery_before_the_crash_is_known_still_confirms_it() {
    // A rebalance: notifier B reads the batch notifier A holds, and
    // settles it, before A crashes.
    let f = FaultInjector::new(1, &FaultRates::none());
    let held_by_a = f.delivered((3, 7).into(), [(3, 7), (3, 8)].map(Position::from));
    let held_by_b = f.delivered((3, 7).into(), [(3, 7), (3, 8)].map(Position::from));
    f.settled(held_by_b);
    f.await_redelivery(FaultPoint::NotifierBeforeOffsetCommit, 2, held_by_a);
    assert_eq!(f.confirmed(FaultPoint::NotifierBeforeOffsetCommit), 2);
    // A delivery before this batch was received does not count.
    let earlier = f.delivered((4, 1).into(), [(4, 1)].map(Position::from));
    f.settled(earlier);
    let held = f.delivered((4, 1).into(), [(4, 1)].map(Position::from));
    f.await_redelivery(FaultPoint::NotifierMidBatch, 1, held);
    assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 0);
    f.await_next_delivery(FaultPoint::NotifierReplay, (5, 0).into());
    f.delivered((5, 0).into(), [(5, 0)].map(Position::from));
    assert_eq!(f.confirmed(FaultPoint::NotifierReplay), 1);
}

#[test]
fn the_categories_the_registry_derives_are_the_lists_they_replace() {
    use FaultPoint::*;
    let with = |f: fn(FaultPoint) -> bool| FaultPoint::ALL.iter().copied().filter(|p| f(*p)).collect::<Vec<_>>();
    assert_eq!(
        with(FaultPoint::needs_process),
        [
            ProcessKill,
            ProcessPause,
            ProcessKillPerMessage,
            DbKillAfterCommit,
            KafkaKillAfterProduceAck,
            KafkaKillAfterOffsetCommit,
            KafkaKillAfterFetch,
            DbHoldCommit,
            DbPauseInTransaction
        ]
    );
    assert_eq!(
        with(FaultPoint::is_service),
        [BrokerPause, BrokerKill, BrokerKillLeader, DbRestart, DbTerminateBackends]
    );
    assert_eq!(
        with(FaultPoint::proxied),
        [
            NetReset,
            NetBlackhole,
            DbCommitAckLost,
            DbKillAfterCommit,
            KafkaProduceAckLost,
            KafkaKillAfterProduceAck,
            KafkaKillAfterOffsetCommit,
            KafkaKillAfterFetch,
            DbHoldCommit,
            DbPauseInTransaction
        ]
    );
    assert_eq!(
        with(FaultPoint::schedulable),
        [NetReset, NetBlackhole, BrokerPause, BrokerKill, BrokerKillLeader, DbRestart, DbTerminateBackends]
    );
    assert_eq!(
        with(FaultPoint::on_kafka_wire),
        [KafkaProduceAckLost, KafkaKillAfterProduceAck, KafkaKillAfterOffsetCommit, KafkaKillAfterFetch, DbHoldCommit]
    );
    // The names' prefixes, which rules used to read, agree with who strikes.
    for p in FaultPoint::ALL {
        if let Some(c) = p.strike().component() {
            assert!(p.name().starts_with(&format!("{c}.")), "{}", p.name());
        }
    }
}

/// The checkers' confirmations land on their own point in the report's
/// totals, and the injector is left as the run recorded it.
#[test]
fn confirmations_from_the_checkers_add_to_the_summary_not_the_injector() {
    let f = FaultInjector::new(1, &FaultRates::none().with(FaultPoint::RelayAfterProduce, 1.0));
    assert!(f.strike(FaultPoint::RelayAfterProduce, "relay-1", || "a batch".into()));
    let mut summary = f.summary();
    add_confirmed(&mut summary, &[(FaultPoint::RelayAfterProduce, 1), (FaultPoint::WorkloadPoison, 2)]);
    let of = |p: FaultPoint| summary.iter().find(|s| s.point == p.name()).unwrap().confirmed;
    assert_eq!((of(FaultPoint::RelayAfterProduce), of(FaultPoint::WorkloadPoison)), (1, 2));
    assert_eq!(of(FaultPoint::NotifierMidBatch), 0);
    assert_eq!(f.confirmed(FaultPoint::RelayAfterProduce), 0, "nothing written back");
}

/// An arm strikes one of the process's next [`ARM_SPREAD`] windows, not
/// always the first: a burst's later windows (a message's second
/// statement) are struck too, and the same seed strikes the same one.
#[test]
fn an_arm_strikes_every_place_in_a_burst_of_windows_and_the_seed_says_which() {
    let point = FaultPoint::DbKillAfterCommit;
    let places = |seed| {
        let f = FaultInjector::new(seed, &FaultRates::none().with(point, 1.0)).with_aimed(Aimed::PerSecond);
        let mut counts = [0u32; ARM_SPREAD as usize];
        for _second in 0..400 {
            assert!(f.arm(point, "notifier-1"));
            let place = (0..ARM_SPREAD).position(|_| f.strike(point, "notifier-1", String::new));
            counts[place.expect("struck within the spread")] += 1;
        }
        counts
    };
    let counts = places(7);
    // About 100 each.
    assert!(counts.iter().all(|n| (60..=140).contains(n)), "{counts:?}");
    assert_eq!(places(7), counts, "a replay of the seed strikes the same windows");
}

/// What the calm waits for: the points set to strike a process with no
/// confirmed firing yet. A firing alone does not count (a pre-empted one
/// struck nothing), a point the run does not set never holds it up, and
/// an in-process crash point is no process's window.
#[test]
fn the_unstruck_points_are_those_set_on_a_process_and_never_confirmed() {
    let rates = FaultRates::none()
        .with(FaultPoint::DbKillAfterCommit, 0.1)
        .with(FaultPoint::DbHoldCommit, 0.1)
        .with(FaultPoint::RelayAfterProduce, 0.1);
    let f = FaultInjector::new(1, &rates);
    let mut names: Vec<&str> = f.unstruck().iter().map(|p| p.name()).collect();
    names.sort_unstable();
    assert_eq!(names, ["db.hold_commit", "db.kill_after_commit"]);
    f.confirm(FaultPoint::DbKillAfterCommit, 1);
    assert_eq!(f.unstruck(), [FaultPoint::DbHoldCommit]);
    f.confirm(FaultPoint::DbHoldCommit, 1);
    assert!(f.unstruck().is_empty());
}
