//! `chaos doctor`: does PostgreSQL answer, does Kafka answer? Both are probed
//! at once and each probe is bounded, so the whole check ends within 10 s.
//! It also says whether the broker has the fault proxy's slot listeners,
//! which only `[proxy] kafka` needs: their absence never fails the check.

use crate::broker::ping as kafka_ping;
use crate::commands::exit::Exit;
use crate::error::{db_endpoint, redact};
use comfy_table::{presets, Cell, Table};
use sqlx::{ConnectOptions, Connection};
use std::str::FromStr;
use std::time::Duration;

/// Each probe gets this long; they run concurrently.
const PROBE: Duration = Duration::from_secs(6);

pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";
/// What `scripts/services.sh up` starts: the check a newcomer runs right
/// after it must find it without being told.
pub const DEFAULT_DATABASE_URL: &str = "postgres://chaos:chaos@127.0.0.1:5432/chaos";

pub struct Check {
    pub service: &'static str,
    pub endpoint: String,
    pub ok: bool,
    pub detail: String,
}

async fn postgres(url: Option<&str>) -> Check {
    let (url, endpoint) = match url {
        Some(u) => (u, db_endpoint(u)),
        None => {
            (DEFAULT_DATABASE_URL, format!("{} (DATABASE_URL unset: the default)", db_endpoint(DEFAULT_DATABASE_URL)))
        }
    };
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

/// The broker's listeners for the fault proxy's Kafka slots
/// ([`crate::nemesis::proxy::kafka`]): how many of them accept a connection.
async fn slot_listeners() -> Check {
    use crate::nemesis::proxy::kafka::{BROKER_BASE, SLOTS};
    let probes = (0..SLOTS).map(|i| {
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(("127.0.0.1", BROKER_BASE + i)))
    });
    let up = futures::future::join_all(probes).await.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
    let endpoint = format!("127.0.0.1:{}-{}", BROKER_BASE, BROKER_BASE + SLOTS - 1);
    let detail = match up {
        n if n == SLOTS as usize => format!("{n} of {SLOTS} listen: `[proxy] kafka` can stand in front of the broker"),
        n => {
            format!("{n} of {SLOTS} listen: only `[proxy] kafka` needs them; `scripts/services.sh up` configures them")
        }
    };
    Check { service: "Kafka slots", endpoint, ok: up == SLOTS as usize, detail }
}

fn short(s: &str) -> String {
    s.split("; start it").next().unwrap_or(s).to_string()
}

/// Probes both services, prints the table on stdout, returns the exit code.
pub async fn doctor(database_url: Option<String>, brokers: Option<String>) -> Exit {
    let brokers = brokers.unwrap_or_else(|| DEFAULT_BROKERS.to_string());
    let (pg, k, slots) = tokio::join!(postgres(database_url.as_deref()), kafka(&brokers), slot_listeners());
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["", "service", "endpoint", "detail"]);
    for (c, needed) in [(&pg, true), (&k, true), (&slots, false)] {
        t.add_row(vec![
            // An optional listener that is missing is no failure: "–".
            Cell::new(match (c.ok, needed) {
                (true, _) => "✔",
                (false, true) => "✘",
                (false, false) => "–",
            }),
            Cell::new(c.service),
            Cell::new(&c.endpoint),
            Cell::new(&c.detail),
        ]);
    }
    outln!("{t}");
    if pg.ok && k.ok {
        Exit::Pass
    } else {
        eprintln!(
            "hint: start the services with `scripts/services.sh up` (no Docker) or `docker compose up -d --wait`"
        );
        Exit::Infra
    }
}
