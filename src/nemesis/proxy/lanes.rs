//! What a run routes through its fault proxy: a store per in-process
//! component behind it, a database URL per component process, and the
//! window in which its nemesis acts.

use super::{Proxy, Settings, Slot};
use crate::context::Ctx;
use crate::error::Result;
use crate::store::{postgres::PgStore, Store};
use std::sync::Arc;
use tokio::sync::watch;

/// A run's proxy, with the run's PostgreSQL URL it stands in front of.
pub struct Lanes {
    proxy: Proxy,
    url: String,
}

impl Lanes {
    /// Starts the proxy with a slot per target of the scenario's `[proxy]`;
    /// its nemesis strikes while `acting` is true.
    pub async fn start(ctx: &Ctx, url: &str, acting: watch::Receiver<bool>) -> Result<Self> {
        let sc = &ctx.scenario;
        let settings = Settings {
            upstream_url: url,
            slots: sc.proxy.targets.clone(),
            shaping: sc.proxy.shaping,
            blackhole: sc.proxy.blackhole,
            kafka: sc.proxies_kafka(),
            stats: ctx.stats.clone(),
        };
        let mut proxy = Proxy::start(settings, ctx.faults.clone(), ctx.shutdown.clone()).await?;
        let scheduled: Vec<_> = sc.timeline.iter().map(|t| t.point).collect();
        proxy.act(ctx.faults.clone(), acting, sc.seed, &scheduled, ctx.shutdown.clone());
        Ok(Self { proxy, url: url.to_string() })
    }

    /// The context a component runs with: the run's, but with its store,
    /// and its broker when the proxy stands in front of Kafka, through its
    /// slot.
    pub async fn ctx_for(&self, ctx: &Ctx, name: &str, connections: u32) -> Result<Ctx> {
        let (Some(slot), Store::Postgres(pg)) = (self.proxy.slot(name), &ctx.store) else { return Ok(ctx.clone()) };
        let app = format!("chaos-{}-{name}", ctx.names.run_id);
        let store = PgStore::attach_as(&self.proxy.url_for(slot, &self.url), &pg.schema, connections, &app).await?;
        let broker: Arc<dyn crate::broker::Broker> = match slot.kafka {
            Some(addr) => crate::broker::attach(&addr.to_string(), false, crate::broker::Attacher::Harness),
            None => ctx.broker.clone(),
        };
        Ok(Ctx { store: Store::Postgres(store), broker, ..ctx.clone() })
    }

    /// The slot of a component, when the proxy stands in front of it.
    pub fn slot(&self, name: &str) -> Option<Arc<Slot>> {
        self.proxy.slot(name).cloned()
    }

    /// Every slot: what a scheduled `net.reset` or `net.blackhole` strikes.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.proxy.slots().to_vec()
    }

    /// The database URL a component process in `slot` is given.
    pub fn url_of(&self, slot: &Slot) -> String {
        self.proxy.url_for(slot, &self.url)
    }

    /// One line for the banner.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.proxy.slots().iter().map(|s| s.name.as_str()).collect();
        let kafka = match self.proxy.slots().first().and_then(|s| s.kafka) {
            Some(_) => " and Kafka",
            None => "",
        };
        format!("fault proxy in front of PostgreSQL {}{kafka} for {}", self.proxy.upstream(), names.join(", "))
    }

    pub fn close(self) {
        self.proxy.close();
    }
}
