//! `chaos doctor`: does PostgreSQL answer, does Kafka answer? Both are probed
//! at once and each probe is bounded, so the whole check ends within 10 s.

use crate::broker::kafka::ping as kafka_ping;
use crate::exit::Exit;
use crate::infra::{db_endpoint, redact};
use comfy_table::{presets, Cell, Table};
use sqlx::{ConnectOptions, Connection};
use std::str::FromStr;
use std::time::Duration;

/// Each probe gets this long; they run concurrently.
const PROBE: Duration = Duration::from_secs(6);

pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

pub struct Check {
    pub service: &'static str,
    pub endpoint: String,
    pub ok: bool,
    pub detail: String,
}

async fn postgres(url: Option<&str>) -> Check {
    let Some(url) = url else {
        return Check {
            service: "PostgreSQL",
            endpoint: "(not configured)".into(),
            ok: false,
            detail: "set DATABASE_URL, e.g. postgres://chaos:chaos@127.0.0.1:5432/chaos".into(),
        };
    };
    let endpoint = db_endpoint(url);
    let attempt = async {
        let opts = sqlx::postgres::PgConnectOptions::from_str(url).map_err(|e| e.to_string())?;
        let mut c = opts.connect().await.map_err(|e| e.to_string())?;
        let v: String = sqlx::query_scalar("SHOW server_version").fetch_one(&mut c).await.map_err(|e| e.to_string())?;
        let _ = c.close().await;
        Ok::<_, String>(v)
    };
    match tokio::time::timeout(PROBE, attempt).await {
        Ok(Ok(v)) => Check { service: "PostgreSQL", endpoint, ok: true, detail: format!("server {v}") },
        Ok(Err(e)) => Check { service: "PostgreSQL", endpoint, ok: false, detail: redact(&e) },
        Err(_) => Check {
            service: "PostgreSQL",
            endpoint,
            ok: false,
            detail: format!("no answer within {}s", PROBE.as_secs()),
        },
    }
}

async fn kafka(brokers: &str) -> Check {
    match kafka_ping(brokers, PROBE).await {
        Ok(list) => Check {
            service: "Kafka",
            endpoint: brokers.into(),
            ok: true,
            detail: list.iter().map(|(id, addr)| format!("broker id {id} at {addr}")).collect::<Vec<_>>().join(", "),
        },
        Err(e) => Check { service: "Kafka", endpoint: brokers.into(), ok: false, detail: short(&e.to_string()) },
    }
}

fn short(s: &str) -> String {
    s.split("; start it").next().unwrap_or(s).to_string()
}

/// Probes both services, prints the table on stdout, returns the exit code.
pub async fn doctor(database_url: Option<String>, brokers: Option<String>) -> Exit {
    let brokers = brokers.unwrap_or_else(|| DEFAULT_BROKERS.to_string());
    let (pg, k) = tokio::join!(postgres(database_url.as_deref()), kafka(&brokers));
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["", "service", "endpoint", "detail"]);
    for c in [&pg, &k] {
        t.add_row(vec![
            Cell::new(if c.ok { "✔" } else { "✘" }),
            Cell::new(c.service),
            Cell::new(&c.endpoint),
            Cell::new(&c.detail),
        ]);
    }
    println!("{t}");
    if pg.ok && k.ok {
        Exit::Pass
    } else {
        eprintln!(
            "hint: start the services with `scripts/services.sh up` (no Docker) or `docker compose up -d --wait`"
        );
        Exit::Infra
    }
}
