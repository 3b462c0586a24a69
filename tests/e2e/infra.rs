//! Doctor and unreachable services: bounded, one line, the right exit code,
//! and never a password.

use crate::common::*;
use std::time::Duration;

#[test]
fn doctor_is_green_with_both_services() {
    let ran = run(chaos().arg("doctor").env("DATABASE_URL", database_url()).env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("✔ ┆ PostgreSQL"), "{}", ran.stdout);
    assert!(ran.stdout.contains("broker id 1"), "{}", ran.stdout);
    // scripts/services.sh gives the broker the fault proxy's listeners.
    assert!(ran.stdout.contains("✔ ┆ Kafka slots"), "{}", ran.stdout);
    assert!(ran.stdout.contains("20 of 20 listen"), "{}", ran.stdout);
    assert!(!ran.stdout.contains(":chaos@"), "password leaked: {}", ran.stdout);
}

/// `scripts/services.sh up` then `chaos doctor`, with nothing set: the
/// doctor looks where the script put PostgreSQL, and says it did.
#[test]
fn doctor_finds_the_services_database_without_database_url() {
    let ran = run(chaos().arg("doctor").env_remove("DATABASE_URL").env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("✔ ┆ PostgreSQL"), "{}", ran.stdout);
    assert!(ran.stdout.contains("DATABASE_URL unset: the default"), "{}", ran.stdout);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_removes_old_runs_and_nothing_else() {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let old = "chaos_20200101_000000_c1ea";
    let keep = ["chaos_keep_me", "chaosx_20200101_000000_c1ea"];
    let fresh = chaos::domain::names::RunNames::new().schema;
    for s in [old, fresh.as_str()].into_iter().chain(keep) {
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{s}\"")).execute(&mut c).await.unwrap();
    }
    let old_topic = "chaos.20200101-000000-c1ea.payments";
    let keep_topic = "keep.20200101-000000-c1ea.payments";
    for t in [old_topic, keep_topic] {
        use chaos::broker::Broker;
        let _ = chaos::broker::kafka::Kafka::attach(&brokers(), false)
            .create_topic(&chaos::broker::Topic::new(t.to_string(), 1))
            .await;
    }
    let reports = tempfile::tempdir().unwrap();
    std::fs::write(reports.path().join("20200101-000000-c1ea.sqlite"), b"").unwrap();
    std::fs::write(reports.path().join("20200101-000000-c1ea.json"), b"{}").unwrap();

    let ran = run(chaos()
        .args(["clean", "--older-than", "1d", "--reports-dir"])
        .arg(reports.path())
        .env("DATABASE_URL", database_url())
        .env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains(old) && ran.stdout.contains(old_topic), "{}", ran.stdout);

    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace").fetch_all(&mut c).await.unwrap();
    assert!(!schemas.contains(&old.to_string()), "the old run's schema must be gone");
    for k in keep {
        assert!(schemas.contains(&k.to_string()), "{k} is not the harness's and must stay");
        sqlx::query(&format!("DROP SCHEMA \"{k}\"")).execute(&mut c).await.unwrap();
    }
    // A run of today is untouched: its schema is not older than a day.
    let recent: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&fresh)
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(recent, 1, "today's run {fresh} must stay");
    sqlx::query(&format!("DROP SCHEMA \"{fresh}\"")).execute(&mut c).await.unwrap();
    assert!(!reports.path().join("20200101-000000-c1ea.sqlite").exists());
    assert!(reports.path().join("20200101-000000-c1ea.json").exists(), "reports are kept");
    // With --reports, the old runs' reports go too; a sweep's summary, a
    // file of the user's and today's report stay.
    let today = format!("{}.json", chaos::domain::names::RunNames::new().run_id);
    for f in ["20200101-000000-c1ea.html", "sweep-20200101-000000-c1ea.json", "notes.md", today.as_str()] {
        std::fs::write(reports.path().join(f), b"{}").unwrap();
    }
    let pruned = run(chaos().args(["clean", "--older-than", "1d", "--reports", "--reports-dir"]).arg(reports.path()));
    assert_eq!(pruned.code, 0, "{}\n{}", pruned.stdout, pruned.stderr);
    for gone in ["20200101-000000-c1ea.json", "20200101-000000-c1ea.html"] {
        assert!(!reports.path().join(gone).exists(), "{gone} is an old run's report: {}", pruned.stdout);
    }
    for kept in ["sweep-20200101-000000-c1ea.json", "notes.md", today.as_str()] {
        assert!(reports.path().join(kept).exists(), "{kept} must stay: {}", pruned.stdout);
    }
    let listed = tokio::task::spawn_blocking(|| {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = chaos::broker::kafka::config(&brokers()).create().unwrap();
        let md = c.fetch_metadata(None, Duration::from_secs(5)).unwrap();
        md.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(!listed.contains(&old_topic.to_string()), "the old run's topic must be gone");
    assert!(listed.contains(&keep_topic.to_string()), "a topic the harness did not name must stay");
    assert!(!ran.stdout.contains(keep_topic), "{}", ran.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_reaches_output_logs_or_reports() {
    use sqlx::Connection;
    let secret = "Zq7-secret-pw-4711";
    let mut c = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    // A role of its own, so the password is a string found nowhere else.
    sqlx::query(&format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'chaos_secret') THEN \
         CREATE ROLE chaos_secret LOGIN PASSWORD '{secret}'; END IF; END $$"
    ))
    .execute(&mut c)
    .await
    .unwrap();
    // On the database DATABASE_URL names, whatever it is called (the test
    // command gives the suite a database of its own).
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO chaos_secret', current_database()); END $$",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let url = database_url().replacen("chaos:chaos@", &format!("chaos_secret:{secret}@"), 1);
    assert!(url.contains(secret), "DATABASE_URL is expected in the form postgres://chaos:chaos@host/db");

    let dir = tempfile::tempdir().unwrap();
    let ran = run(chaos()
        .args(["-vv", "run", "scenarios/smoke.toml", "--reports-dir"])
        .arg(dir.path())
        .env("DATABASE_URL", &url)
        .env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n"));
    assert!(ran.stderr.contains("INFO"), "-vv gives logs on stderr");
    assert!(!ran.stdout.contains(secret) && !ran.stderr.contains(secret), "password in output");
    let mut reports = 0;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().map(|x| x == "json" || x == "md" || x == "html").unwrap_or(false) {
            reports += 1;
            assert!(!std::fs::read_to_string(&p).unwrap().contains(secret), "password in {}", p.display());
        }
    }
    assert_eq!(reports, 3, "the JSON, Markdown and HTML reports");
    // And a wrong password is not echoed back either.
    let wrong = url.replace(secret, "Wr0ng-pw-0815");
    let ran = run(chaos().arg("doctor").env("DATABASE_URL", &wrong).env("KAFKA_BROKERS", brokers()));
    assert_eq!(ran.code, 3);
    assert!(!ran.stdout.contains("Wr0ng-pw-0815") && !ran.stderr.contains("Wr0ng-pw-0815"));
}

#[test]
fn something_listening_that_is_not_kafka_is_an_infra_error_within_15s() {
    // PostgreSQL's port answers TCP but not the Kafka protocol.
    let dir = tempfile::tempdir().unwrap();
    let ran = run(chaos()
        .args(["run", "scenarios/smoke.toml", "--reports-dir"])
        .arg(dir.path())
        .env("DATABASE_URL", database_url())
        .env("KAFKA_BROKERS", "127.0.0.1:5432"));
    assert_eq!(ran.code, 3, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.elapsed < Duration::from_secs(15), "took {:?}", ran.elapsed);
    let err: Vec<&str> = ran.stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(err.len(), 1, "{}", ran.stderr);
    assert!(err[0].contains("cannot reach Kafka at 127.0.0.1:5432"), "{}", err[0]);
}
