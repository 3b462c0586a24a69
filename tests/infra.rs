//! Doctor and unreachable services: bounded, one line, the right exit code,
//! and never a password.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn doctor_is_green_with_both_services() {
    let ran = run(chaos().arg("doctor").env("DATABASE_URL", database_url()).env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("✔ ┆ PostgreSQL"), "{}", ran.stdout);
    assert!(ran.stdout.contains("broker id 1"), "{}", ran.stdout);
    assert!(!ran.stdout.contains(":chaos@"), "password leaked: {}", ran.stdout);
}

#[test]
fn doctor_fails_fast_with_a_hint_when_kafka_is_not_listening() {
    let ran = run(chaos().arg("doctor").env("DATABASE_URL", database_url()).env("KAFKA_BROKERS", "127.0.0.1:1"));
    assert_eq!(ran.code, 3, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.elapsed < Duration::from_secs(10), "took {:?}", ran.elapsed);
    assert!(ran.stdout.contains("✘ ┆ Kafka"), "{}", ran.stdout);
    assert!(ran.stderr.contains("scripts/services.sh up"), "{}", ran.stderr);
}

#[test]
fn run_with_a_wrong_password_is_an_infra_error_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = "postgres://chaos:hunter2-wrong@127.0.0.1:5432/chaos";
    let ran = run(chaos()
        .args(["run", "scenarios/smoke.toml", "--reports-dir"])
        .arg(dir.path())
        .env("DATABASE_URL", url)
        .env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 3, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.elapsed < Duration::from_secs(15), "took {:?}", ran.elapsed);
    let err: Vec<&str> = ran.stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(err.len(), 1, "{}", ran.stderr);
    assert!(err[0].contains("cannot reach PostgreSQL at 127.0.0.1:5432/chaos"), "{}", err[0]);
    for out in [&ran.stdout, &ran.stderr] {
        assert!(!out.contains("hunter2"), "password leaked: {out}");
    }
}

#[test]
fn run_with_kafka_not_listening_is_an_infra_error_within_15s() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run(chaos()
        .args(["run", "scenarios/smoke.toml", "--reports-dir"])
        .arg(dir.path())
        .env("DATABASE_URL", database_url())
        .env("KAFKA_BROKERS", "127.0.0.1:1"));
    assert_eq!(ran.code, 3, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.elapsed < Duration::from_secs(15), "took {:?}", ran.elapsed);
    assert!(ran.stderr.contains("cannot reach Kafka at 127.0.0.1:1"), "{}", ran.stderr);
}
