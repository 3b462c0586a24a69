//! A declared system's setup: the user's migrations on the run's empty
//! schema, every declaration proved on it before any traffic, and the
//! service's readiness.

use crate::context::Ctx;
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::nemesis::process::program::Programs;
use crate::scenario::{Scenario, ServiceDecl, Setup, System};
use crate::store::declared as rows;
use crate::store::Store;
use std::time::{Duration, Instant};
use tracing::info;

/// How long the user's migrations may run.
const SETUP_LIMIT: Duration = Duration::from_secs(120);
/// How often a service's health URL is asked while it starts.
const HEALTH_POLL: Duration = Duration::from_millis(200);

/// The user's schema in the run's, then every declaration proved on it,
/// then the outbox log. A bad declaration is a bad scenario (exit 2),
/// named by its key, with the database's own message.
pub(super) async fn set_up(store: &Store, sys: &System, sc: &Scenario, url: &str, names: &RunNames) -> Result<()> {
    let shown = sc.path.display().to_string();
    match &sys.setup {
        Setup::None => {}
        Setup::Sql { path, text } => rows::apply_setup(store, text).await.map_err(|m| {
            Error::Scenario(format!("{shown}: `system.setup` ({}) fails on the run's schema: {m}", path.display()))
        })?,
        Setup::Command(cmd) => {
            let mut c = tokio::process::Command::new(&cmd.argv[0]);
            c.args(&cmd.argv[1..])
                .current_dir(&cmd.dir)
                .env("CHAOS_DATABASE_URL", url)
                .env("CHAOS_SCHEMA", &names.schema)
                .env("CHAOS_RUN_ID", &names.run_id)
                .env("PGAPPNAME", format!("chaos-{}-setup", names.run_id))
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            let out = tokio::time::timeout(SETUP_LIMIT, c.output())
                .await
                .map_err(|_| {
                    Error::Scenario(format!(
                        "{shown}: `system.setup_command` did not finish within {} s",
                        SETUP_LIMIT.as_secs()
                    ))
                })?
                .map_err(|e| {
                    Error::Scenario(format!("{shown}: `system.setup_command` `{}` could not start: {e}", cmd.shown()))
                })?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
                return Err(Error::Scenario(format!(
                    "{shown}: `system.setup_command` `{}` failed with {}: {}",
                    cmd.shown(),
                    out.status,
                    tail.join(" | ")
                )));
            }
        }
    }
    prove(store, sys, &shown).await
}

/// Every declaration proved on the run's fresh schema, and the outbox log
/// added. A bad declaration is a bad scenario (exit 2), named after
/// `shown` and its key, with the database's own message.
pub(super) async fn prove(store: &Store, sys: &System, shown: &str) -> Result<()> {
    let bad = |b: rows::BadDeclaration| Error::Scenario(format!("{shown}: {}: {}", b.key, b.message));
    rows::probe_outbox(store, sys).await.map_err(bad)?;
    // The log before the queries: a declared query may read it.
    rows::install_outbox_log(store, &sys.outbox).await?;
    rows::probe_queries(store, sys).await.map_err(bad)
}

/// Waits until every service slot answers its health path with a 2xx, or
/// has written its ready line.
pub(super) async fn healthy(programs: &Programs, service: &ServiceDecl, ctx: &Ctx) -> Result<()> {
    if let Some(line) = &service.ready_line {
        return ready_line(programs, service, line, ctx).await;
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .map_err(|e| Error::Internal(format!("making the health check's client: {e}")))?;
    let limit = service.ready_timeout;
    let started = Instant::now();
    for (slot, port) in programs.service_ports().iter().enumerate() {
        let url = format!("http://127.0.0.1:{port}{}", service.health);
        let mut last;
        loop {
            if let Some(f) = programs.failure() {
                return Err(Error::Service(format!("the service did not become ready: {f}")));
            }
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => break,
                Ok(r) => last = format!("it answered {}", r.status()),
                Err(e) if e.is_connect() => last = "nothing listens there".into(),
                Err(e) => last = format!("no answer ({e})"),
            }
            if started.elapsed() >= limit {
                return Err(Error::Service(format!(
                    "the service `{}` (service-{}) did not answer GET {url} with a 2xx within {} s ({last}); check `system.service.health` and that it listens on CHAOS_PORT; {}",
                    service.command.shown(),
                    slot + 1,
                    limit.as_secs(),
                    programs.stderr_of_first()
                )));
            }
            if ctx.shutdown.is_set() {
                return Err(Error::Internal("stopped while waiting for the service".into()));
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }
    info!(ms = started.elapsed().as_millis() as u64, "service ready");
    Ok(())
}

/// Waits until each service slot's output (its log, where the keeper
/// copies stdout and stderr) holds `line`.
async fn ready_line(programs: &Programs, service: &ServiceDecl, line: &str, ctx: &Ctx) -> Result<()> {
    let started = Instant::now();
    for slot in 1..=programs.service_ports().len() {
        let prefix = format!("service-{slot}.");
        loop {
            if let Some(f) = programs.failure() {
                return Err(Error::Service(format!("the service did not become ready: {f}")));
            }
            let seen = std::fs::read_dir(&programs.logs).into_iter().flatten().flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(&prefix)
                    && std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(line))
            });
            if seen {
                break;
            }
            if started.elapsed() >= service.ready_timeout {
                return Err(Error::Service(format!(
                    "the service `{}` (service-{slot}) did not write {line:?} within {} s; check `system.service.ready_line`; {}",
                    service.command.shown(),
                    service.ready_timeout.as_secs(),
                    programs.stderr_of_first()
                )));
            }
            if ctx.shutdown.is_set() {
                return Err(Error::Internal("stopped while waiting for the service".into()));
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }
    info!(ms = started.elapsed().as_millis() as u64, "service ready (its ready line)");
    Ok(())
}
