//! The contract's environment for a program under test (docs/contract.md).

use super::*;

/// The contract's environment, the same for every slot of a role but the
/// slot's own variables.
#[derive(Clone)]
pub(super) struct Env(pub(super) Vec<(&'static str, String)>);

impl Env {
    pub(super) fn new(
        ctx: &Ctx,
        role: Role,
        batch_size: usize,
        database: &Database,
        reference: bool,
    ) -> crate::error::Result<Self> {
        let mut env = vec![
            ("CHAOS_ROLE", role.as_str().to_string()),
            ("CHAOS_RUN_ID", ctx.names.run_id.clone()),
            ("CHAOS_BROKERS", ctx.broker.bootstrap().to_string()),
            ("CHAOS_TOPIC", ctx.names.topic.clone()),
            ("CHAOS_SCHEMA", ctx.names.schema.clone()),
            ("CHAOS_BATCH_SIZE", batch_size.to_string()),
        ];
        match database {
            Database::Postgres(url) => env.push(("CHAOS_DATABASE_URL", url.clone())),
            Database::Sqlite(path) => {
                env.push((crate::nemesis::process::protocol::SQLITE_ENV, path.display().to_string()))
            }
        }
        // A declared system's service, relay and consumer may each call the
        // provider; ours only from the notifier.
        let calls = role == Role::Notifier || ctx.scenario.system.is_some();
        if let (true, Some(email)) = (calls, &ctx.email) {
            // The email provider that `chaos` runs: its record, not the
            // program's database, is what the verifier checks emails by.
            env.push((crate::provider::client::PROVIDER_ENV, email.base_url().to_string()));
        }
        if role == Role::Notifier {
            env.push(("CHAOS_GROUP", ctx.names.group.clone()));
            // The session timeout the harness's pauses are measured
            // against: a pause longer than it makes a zombie.
            env.push(("CHAOS_SESSION_TIMEOUT_MS", ctx.scenario.notifier.session_timeout.as_millis().to_string()));
        }
        if reference {
            let json = serde_json::to_string(&*ctx.scenario)
                .map_err(|e| crate::Error::Internal(format!("encoding the scenario for a component: {e}")))?;
            env.push((crate::nemesis::process::protocol::SCENARIO_ENV, json));
            env.push((
                crate::nemesis::process::protocol::EMBEDDED_ENV,
                if ctx.broker.embedded() { "1" } else { "0" }.into(),
            ));
            // The component's logs go to its log file: info, unless asked.
            env.push((
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,rdkafka=warn,librdkafka=warn,sqlx=warn".into()),
            ));
        }
        Ok(Self(env))
    }
}
