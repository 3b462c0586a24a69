//! From the raw scenario to the sealed [`Scenario`]: every value checked,
//! each error one line that names the file, the line and the column, the
//! valid values or range, and the fix.

use super::*;
use crate::faults::{Aimed, Strike};

/// How much longer than the session timeout a pause lasts when the
/// scenario does not say: the group has given the partitions away by then.
const PAST_THE_SESSION: Duration = Duration::from_secs(2);

/// Reads and validates a scenario file. Every error is one line that names
/// the file and, where there is one, the line and column.
pub fn load(path: &Path) -> Result<Scenario, crate::Error> {
    let shown = path.display().to_string();
    if path.is_dir() {
        return Err(crate::Error::Scenario(format!(
            "{shown}: is a directory; pass a scenario file (chaos init --example payments payments.toml writes one)"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::Error::Scenario(format!(
            "{shown}: cannot read the scenario file: {e}; check the path (scenarios/ holds the shipped ones)"
        ))
    })?;
    parse(&text, path)
}

/// Parses scenario text; `path` is only used for messages and the default name.
pub fn parse(text: &str, path: &Path) -> Result<Scenario, crate::Error> {
    let shown = path.display().to_string();
    if text.trim().is_empty() {
        return Err(crate::Error::Scenario(format!(
            "{shown}: the file is empty; chaos init my.toml writes every key at its default to start from"
        )));
    }
    // A fault point's name works as its key (`relay.after_produce` for
    // `relay_after_produce`), as on the command line. The rewrite keeps
    // every byte where it was, so every error's line and column still
    // point into the file as written.
    let rewritten = fault_names_as_keys(text);
    let text = rewritten.as_str();
    let raw: RawScenario = toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| line_col(text, s.start)).map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default();
        // One line: the parser's own line breaks become "; ", and any control
        // character quoted from the file (a key with "\r" in it) is escaped.
        let mut msg: String = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
            .chars()
            .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
            .collect();
        // A misspelt key: the closest of the keys it could be.
        if let Some(rest) = msg.strip_prefix("unknown field `") {
            if let Some((wrong, expected)) = rest.split_once('`') {
                let hint = did_you_mean(wrong, expected.split('`').skip(1).step_by(2));
                msg.push_str(&hint);
            }
        }
        // serde names Rust types; say what to write instead.
        msg = msg.replace("expected i64", "expected an integer").replace("expected f64", "expected a number");
        if let Some(i) = msg.find("expected struct Raw") {
            let name = i + "expected struct ".len();
            let end = msg[name..].find(|c: char| !c.is_alphanumeric()).map_or(msg.len(), |n| name + n);
            msg.replace_range(i..end, "expected a table");
        }
        // A syntax error, not a wrong key or value: say so, and what the format is.
        if text.parse::<toml::Table>().is_err() {
            let json = if text.trim_start().starts_with('{') { " (it looks like JSON)" } else { "" };
            msg.push_str(&format!("; the file is not valid TOML{json}, see the format in what chaos init - prints"));
        }
        crate::Error::Scenario(format!("{shown}{at}: {msg}"))
    })?;
    Validator { text, shown: &shown }.validate(raw, path)
}

pub(super) struct Validator<'a> {
    text: &'a str,
    pub(super) shown: &'a str,
}

impl Validator<'_> {
    pub(super) fn err<T>(&self, span: std::ops::Range<usize>, what: &str) -> Result<T, crate::Error> {
        let at = if span.start == 0 && span.end == 0 {
            String::new()
        } else {
            let (l, c) = line_col(self.text, span.start);
            format!(":{l}:{c}")
        };
        Err(crate::Error::Scenario(format!("{}{at}: {what}", self.shown)))
    }

    pub(super) fn count(&self, v: &Spanned<i64>, key: &str, min: i64, max: i64) -> Result<i64, crate::Error> {
        let x = *v.get_ref();
        if x < min || x > max {
            return self.err(v.span(), &format!("`{key}` is {x}; expected an integer from {min} to {max}"));
        }
        Ok(x)
    }

    fn prob(&self, v: &Spanned<f64>, key: &str) -> Result<f64, crate::Error> {
        let p = *v.get_ref();
        if !(0.0..=1.0).contains(&p) || p.is_nan() {
            return self.err(
                v.span(),
                &format!("`faults.{key}` is {p}; a probability must be between 0 and 1 (0.1 means 10%)"),
            );
        }
        Ok(p)
    }

    pub(super) fn choice<T>(
        &self,
        v: &Spanned<String>,
        key: &str,
        parse: fn(&str) -> Option<T>,
        names: fn() -> String,
    ) -> Result<T, crate::Error> {
        match parse(v.get_ref()) {
            Some(t) => Ok(t),
            None => {
                let listed = names();
                let hint = did_you_mean(v.get_ref(), listed.split('"').skip(1).step_by(2));
                self.err(v.span(), &format!("`{key}` is {:?}; expected {listed}{hint}", v.get_ref()))
            }
        }
    }

    fn duration(&self, v: &Spanned<String>, key: &str) -> Result<Duration, crate::Error> {
        match parse_duration(v.get_ref()) {
            Some(d) => Ok(d),
            None => self.err(
                v.span(),
                &format!(
                    "`{key}` is {:?}; expected a duration such as \"500ms\", \"30s\", \"10m\", \"1h\" or \"7d\"",
                    v.get_ref()
                ),
            ),
        }
    }

    /// Checks a parsed file field by field. The order of the checks is the
    /// order of the messages: with several mistakes, the first is reported.
    fn validate(&self, raw: RawScenario, path: &Path) -> Result<Scenario, crate::Error> {
        let seed = *raw.seed.get_ref();
        if seed < 0 {
            return self.err(raw.seed.span(), &format!("`seed` is {seed}; expected a non-negative integer"));
        }
        let variants = self.variants(&raw)?;
        let mut faults = self.faults(&raw.faults)?;
        let timeline = self.timeline(&raw, &mut faults)?;
        let (command, relay_command) = self.programs(&raw, path, &faults)?;
        let pause = self.pause(&raw.nemesis)?;
        let system = self.declared(&raw, path, &faults, &command)?;
        let notifier = self.notifier(&raw.notifier, &variants, command)?;
        self.provider_needs_emails(&raw, &faults, &notifier, system.as_ref())?;
        // Unset, a pause outlasts the session timeout the program is given
        // (CHAOS_SESSION_TIMEOUT_MS), so that each one makes a zombie.
        let pause = match raw.nemesis.pause_secs.span() == (0..0) {
            true => notifier.session_timeout + PAST_THE_SESSION,
            false => Duration::from_secs_f64(pause),
        };
        let name = raw.name.clone().unwrap_or_else(|| {
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into())
        });
        Ok(Scenario(Settings {
            name,
            path: path.to_path_buf(),
            seed: seed as u64,
            payments: self.count(&raw.workload.payments, "workload.payments", 1, PAYMENTS_MAX as i64)? as u64,
            producers: self.count(&raw.workload.producers, "workload.producers", 1, 256)? as usize,
            accounts: self.count(&raw.workload.accounts, "workload.accounts", 1, 1_000_000)? as u32,
            publish: variants.publish,
            retry: self.choice(&raw.workload.retry, "workload.retry", WorkloadRetry::parse, WorkloadRetry::names)?,
            workload_batch: self.count(&raw.workload.batch, "workload.batch", 1, 10_000)? as usize,
            spread: match &raw.workload.spread_secs {
                Some(s) => Some(Duration::from_secs(self.count(s, "workload.spread_secs", 1, 3600)? as u64)),
                None => None,
            },
            partitions: self.count(&raw.topic.partitions, "topic.partitions", 1, 1024)? as i32,
            relay: self.relay(&raw.relay, &variants, relay_command, own_relay(&raw))?,
            notifier,
            faults,
            pause,
            timeline,
            broker_restart: self.argv(&raw.nemesis.broker_restart, "nemesis.broker_restart")?,
            database_restart: self.argv(&raw.nemesis.database_restart, "nemesis.database_restart")?,
            aimed: self.choice(&raw.nemesis.aimed, "nemesis.aimed", Aimed::parse, Aimed::names)?,
            aimed_implied: raw.nemesis.aimed.span() == (0..0),
            role_rates: self.role_rates(&raw)?,
            calm_after: self.calm_after(&raw)?,
            nemesis_targets: self.targets(&raw, &raw.nemesis.targets, "nemesis.targets", false)?,
            proxy: self.proxy(&raw)?,
            retention: self.retention(&raw.retention)?,
            drain_timeout: Duration::from_secs(self.count(
                &raw.run.drain_timeout_secs,
                "run.drain_timeout_secs",
                1,
                86_400,
            )? as u64),
            settle_quiet: Duration::from_millis(self.count(
                &raw.run.settle_quiet_ms,
                "run.settle_quiet_ms",
                0,
                600_000,
            )? as u64),
            components: self.choice(&raw.run.components, "run.components", Components::parse, Components::names)?,
            exactly_once: raw.expect.exactly_once,
            allowed_anomalies: self.allowed_anomalies(&raw)?,
            infra_database_url: raw.infra.database_url,
            infra_kafka_brokers: raw.infra.kafka_brokers,
            schedule: None,
            overrides: Overrides::default(),
            system,
            declaration: None,
        }))
    }

    /// The provider runs only for a notifier that sends emails, or a
    /// declared effect read from its record: otherwise its faults would
    /// never strike.
    fn provider_needs_emails(
        &self,
        raw: &RawScenario,
        faults: &FaultRates,
        notifier: &NotifierConfig,
        system: Option<&System>,
    ) -> Result<(), crate::Error> {
        if notifier.email == EmailMode::Off && !system.is_some_and(|s| s.uses_provider()) {
            // The provider runs only for a notifier that sends emails: its
            // faults would never strike.
            let at_provider = FaultPoint::ALL.iter().find(|p| p.strike() == Strike::Provider && faults.get(**p) > 0.0);
            if let Some(p) = at_provider {
                return self.err(
                    raw.faults.get(*p).span(),
                    &format!(
                        "`faults.{}` strikes the email provider, and this run sends no email (`notifier.email` is \"off\"); set `notifier.email = \"keyed\"` or remove it",
                        p.key()
                    ),
                );
            }
        }
        Ok(())
    }

    fn allowed_anomalies(&self, raw: &RawScenario) -> Result<Vec<AnomalyKind>, crate::Error> {
        raw.expect
            .allowed_anomalies
            .iter()
            .map(|a| self.choice(a, "expect.allowed_anomalies", AnomalyKind::parse, AnomalyKind::names))
            .collect()
    }

    /// The reference components' variants, correct or broken on purpose.
    fn variants(&self, raw: &RawScenario) -> Result<Variants, crate::Error> {
        let (n, r) = (&raw.notifier, &raw.relay);
        Ok(Variants {
            inbox: self.choice(&n.inbox, "notifier.inbox", InboxMode::parse, InboxMode::names)?,
            projection: self.choice(
                &n.projection,
                "notifier.projection",
                ProjectionMode::parse,
                ProjectionMode::names,
            )?,
            order: self.choice(&r.order, "relay.order", RelayOrder::parse, RelayOrder::names)?,
            event_id: self.choice(&r.event_id, "relay.event_id", RelayEventId::parse, RelayEventId::names)?,
            acks: self.choice(&r.acks, "relay.acks", RelayAcks::parse, RelayAcks::names)?,
            cursor: self.choice(&r.cursor, "relay.cursor", RelayCursor::parse, RelayCursor::names)?,
            producer: self.choice(&r.producer, "relay.producer", RelayProducer::parse, RelayProducer::names)?,
            publish: self.choice(&raw.workload.publish, "workload.publish", PublishMode::parse, PublishMode::names)?,
        })
    }

    /// Every fault point's probability, in [`FaultPoint::ALL`]'s order.
    fn faults(&self, raw: &RawFaults) -> Result<FaultRates, crate::Error> {
        let mut faults = FaultRates::none();
        for point in FaultPoint::ALL {
            let p = self.prob(raw.get(*point), point.key())?;
            if p >= 1.0 && point.repeats_work() {
                return self.err(
                    raw.get(*point).span(),
                    &format!(
                        "`faults.{}` is 1: it would fire at every {}, and the work it interrupts is tried again and meets it again, so the run would never end; use a probability below 1 (0.5 fires on every other one)",
                        point.key(),
                        point.unit()
                    ),
                );
            }
            faults = faults.with(*point, p);
        }
        Ok(faults)
    }

    /// `[faults.service]`, `[faults.relay]`, `[faults.notifier]`: an aimed
    /// kill's rate per second for that role's processes, over `[faults]`,
    /// or an ambiguous commit's per commit (`db_commit_ack_lost`).
    fn role_rates(&self, raw: &RawScenario) -> Result<crate::faults::RoleRates, crate::Error> {
        let f = &raw.faults;
        let mut out = Vec::new();
        for (role, table) in [("service", &f.service), ("relay", &f.relay), ("notifier", &f.notifier)] {
            let Some(table) = table else { continue };
            if raw.nemesis.aimed.get_ref() != "per-second" {
                return self.err(
                    table.span(),
                    &format!("`[faults.{role}]` needs `[nemesis] aimed = \"per-second\"`: a role's own rate counts seconds of its processes' lives; remove the table or the `aimed` line"),
                );
            }
            let aimed =
                || FaultPoint::ALL.iter().filter(|p| p.role_rated()).map(|p| p.key()).collect::<Vec<_>>().join(", ");
            for (key, rate) in table.get_ref() {
                let Some(point) = FaultPoint::ALL.iter().copied().find(|p| p.key() == key && p.role_rated()) else {
                    return self.err(
                        table.span(),
                        &format!("`faults.{role}.{key}` cannot have a role's own rate; it is for one of: {}", aimed()),
                    );
                };
                if *f.get(point).get_ref() == 0.0 {
                    return self.err(
                        table.span(),
                        &format!("`faults.{role}.{key}` stands over `faults.{key}`, which is 0: set `{key}` in `[faults]` too (the rate every other process takes)"),
                    );
                }
                let rate = self.prob(rate, &format!("{role}.{key}"))?;
                out.push(crate::faults::RoleRate { role: role.into(), point, rate });
            }
        }
        Ok(out)
    }

    /// `[nemesis] calm_after`: a share of the payments, or of a declared
    /// system's operations.
    fn calm_after(&self, raw: &RawScenario) -> Result<Option<f64>, crate::Error> {
        let Some(c) = &raw.nemesis.calm_after else { return Ok(None) };
        let v = *c.get_ref();
        if !(0.05..=1.0).contains(&v) {
            return self.err(
                c.span(),
                &format!("`nemesis.calm_after` is {v}; expected a share of the payments from 0.05 to 1 (0.5: no kill or pause once half of them are written)"),
            );
        }
        Ok(Some(v))
    }

    /// How long a `process.pause` lasts, in seconds.
    fn pause(&self, raw: &RawNemesis) -> Result<f64, crate::Error> {
        let pause = *raw.pause_secs.get_ref();
        if !(0.1..=600.0).contains(&pause) {
            return self.err(
                raw.pause_secs.span(),
                &format!("`nemesis.pause_secs` is {pause}; expected seconds from 0.1 to 600"),
            );
        }
        Ok(pause)
    }

    fn relay(
        &self,
        raw: &RawRelay,
        variants: &Variants,
        command: Option<ProgramCommand>,
        own: bool,
    ) -> Result<RelayConfig, crate::Error> {
        Ok(RelayConfig {
            instances: if own { 0 } else { self.count(&raw.instances, "relay.instances", 1, 64)? as usize },
            batch_size: self.count(&raw.batch_size, "relay.batch_size", 1, 100_000)? as usize,
            poll_interval: ms(self.count(&raw.poll_interval_ms, "relay.poll_interval_ms", 1, 60_000)?),
            restart_delay: ms(self.count(&raw.restart_delay_ms, "relay.restart_delay_ms", 0, 60_000)?),
            order: variants.order,
            event_id: variants.event_id,
            acks: variants.acks,
            cursor: variants.cursor,
            producer: variants.producer,
            command,
            ready_timeout: Duration::from_secs(self.count(
                &raw.ready_timeout_secs,
                "relay.ready_timeout_secs",
                1,
                3600,
            )? as u64),
        })
    }

    fn notifier(
        &self,
        raw: &RawNotifier,
        variants: &Variants,
        command: Option<ProgramCommand>,
    ) -> Result<NotifierConfig, crate::Error> {
        Ok(NotifierConfig {
            instances: self.count(&raw.instances, "notifier.instances", 1, 64)? as usize,
            batch_size: self.count(&raw.batch_size, "notifier.batch_size", 1, 100_000)? as usize,
            inbox: variants.inbox,
            projection: variants.projection,
            email: match &raw.email {
                Some(e) => self.choice(e, "notifier.email", EmailMode::parse, EmailMode::names)?,
                None if command.is_some() => EmailMode::Off,
                None => EmailMode::Keyed,
            },
            session_timeout: ms(self.count(&raw.session_timeout_ms, "notifier.session_timeout_ms", 1000, 300_000)?),
            restart_delay: ms(self.count(&raw.restart_delay_ms, "notifier.restart_delay_ms", 0, 60_000)?),
            command,
            ready_timeout: Duration::from_secs(self.count(
                &raw.ready_timeout_secs,
                "notifier.ready_timeout_secs",
                1,
                3600,
            )? as u64),
        })
    }

    /// `[[nemesis.timeline]]`: each entry's fault must be a service fault.
    /// A scheduled fault fires at each of its times (its `[faults]`
    /// probability, when set, thins them out); a service fault with a
    /// probability and no time is refused, as it would never strike.
    fn timeline(&self, raw: &RawScenario, faults: &mut FaultRates) -> Result<Vec<Timed>, crate::Error> {
        let mut out = Vec::new();
        let names = || {
            FaultPoint::ALL
                .iter()
                .filter(|p| p.schedulable())
                .map(|p| format!("{:?}", p.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for t in &raw.nemesis.timeline {
            let Some(point) =
                FaultPoint::ALL.iter().copied().find(|p| p.schedulable() && p.name() == t.fault.get_ref())
            else {
                return self.err(
                    t.fault.span(),
                    &format!("`nemesis.timeline.fault` is {:?}; expected one of {}", t.fault.get_ref(), names()),
                );
            };
            let every = match &t.every {
                Some(e) => Some(self.duration(e, "nemesis.timeline.every")?),
                None => None,
            };
            if let (Some(e), Some(span)) = (every, t.every.as_ref().map(|e| e.span())) {
                if e < Duration::from_millis(100) {
                    return self.err(span, "`nemesis.timeline.every` is under 100ms; expected a period such as \"5s\"");
                }
            }
            let lasts = match &t.lasts {
                Some(l) => self.duration(l, "nemesis.timeline.for")?,
                None => Duration::from_secs(2),
            };
            out.push(Timed { point, at: self.duration(&t.at, "nemesis.timeline.at")?, lasts, every });
            if raw.faults.get(point).span() == (0..0) {
                *faults = faults.with(point, 1.0);
            }
        }
        if let Some(p) = FaultPoint::ALL
            .iter()
            .find(|p| p.is_service() && faults.get(**p) > 0.0 && !out.iter().any(|t| t.point == **p))
        {
            return self.err(
                raw.faults.get(*p).span(),
                &format!(
                    "`faults.{}` is a service fault and strikes only at the times of a `[[nemesis.timeline]]` entry with fault = {:?}; add one",
                    p.key(),
                    p.name()
                ),
            );
        }
        Ok(out)
    }

    /// A command as an argument vector, not empty.
    pub(super) fn argv(&self, v: &Spanned<Vec<String>>, key: &str) -> Result<Vec<String>, crate::Error> {
        match v.get_ref().first() {
            Some(p) if !p.trim().is_empty() => Ok(v.get_ref().clone()),
            _ => self.err(
                v.span(),
                &format!("`{key}` is empty; expected a command such as [\"scripts/services.sh\", \"up\", \"kafka\"]"),
            ),
        }
    }

    /// `[proxy]`: its targets resolved to instance names.
    fn proxy(&self, raw: &RawScenario) -> Result<ProxyConfig, crate::Error> {
        let p = &raw.proxy;
        let targets = self.targets(raw, &p.targets, "proxy.targets", true)?;
        let ms_key = |v: &Spanned<i64>, key: &str, max: i64| self.count(v, key, 0, max).map(ms);
        Ok(ProxyConfig {
            targets,
            shaping: Shaping {
                latency: ms_key(&p.latency_ms, "proxy.latency_ms", 60_000)?,
                jitter: ms_key(&p.jitter_ms, "proxy.jitter_ms", 60_000)?,
                bytes_per_sec: self.count(&p.bandwidth_kbps, "proxy.bandwidth_kbps", 0, 10_000_000)? as u64 * 1000 / 8,
            },
            blackhole: ms(self.count(&p.blackhole_ms, "proxy.blackhole_ms", 1, 600_000)?),
            always: p.always,
            kafka: p.kafka,
        })
    }

    /// Roles and instances named under `key`, resolved to instance names
    /// (`workload`, `service-1`, `relay-2`, `notifier-1`). Empty: every
    /// one when `all_when_empty` (the proxy's default), else none (the
    /// caller reads "no filter").
    fn targets(
        &self,
        raw: &RawScenario,
        named: &[Spanned<String>],
        key: &str,
        all_when_empty: bool,
    ) -> Result<Vec<String>, crate::Error> {
        let relays = if own_relay(raw) { 0 } else { self.count(&raw.relay.instances, "relay.instances", 1, 64)? };
        let notifiers = self.count(&raw.notifier.instances, "notifier.instances", 1, 64)?;
        // A declared system's service is a program too; its workload is
        // an HTTP client, with no database session to proxy.
        let services =
            raw.system.as_ref().and_then(|s| s.service.as_ref()).map_or(0, |s| *s.instances.get_ref()).clamp(0, 16);
        let all = |role: &'static str, n: i64| (1..=n).map(move |i| format!("{role}-{i}"));
        let mut targets: Vec<String> = Vec::new();
        for t in named {
            let name = t.get_ref().as_str();
            let named: Vec<String> = match name {
                "workload" => vec!["workload".into()],
                "relay" => all("relay", relays).collect(),
                "notifier" => all("notifier", notifiers).collect(),
                "service" if services > 0 => all("service", services).collect(),
                _ if all("relay", relays)
                    .chain(all("notifier", notifiers))
                    .chain(all("service", services))
                    .any(|n| n == name) =>
                {
                    vec![name.into()]
                }
                _ => {
                    return self.err(
                        t.span(),
                        &format!(
                            "`{key}` names {name:?}; expected \"workload\", \"relay\", \"notifier\" or an instance such as \"relay-1\" (relays 1 to {relays}, notifiers 1 to {notifiers})"
                        ),
                    )
                }
            };
            targets.extend(named.into_iter().filter(|n| !targets.contains(n)).collect::<Vec<_>>());
        }
        if targets.is_empty() && all_when_empty {
            targets = std::iter::once("workload".to_string())
                .filter(|_| services == 0)
                .chain(all("service", services))
                .chain(all("relay", relays))
                .chain(all("notifier", notifiers))
                .collect();
        }
        Ok(targets)
    }

    fn retention(&self, raw: &RawRetention) -> Result<Retention, crate::Error> {
        Ok(Retention {
            outbox: self.duration(&raw.outbox, "retention.outbox")?,
            inbox: self.duration(&raw.inbox, "retention.inbox")?,
            purge_interval: ms(self.count(&raw.purge_interval_ms, "retention.purge_interval_ms", 10, 3_600_000)?),
        })
    }
}

/// The variants a scenario picks for the reference components, checked
/// before the rest so that their messages come first.
struct Variants {
    producer: RelayProducer,
    inbox: InboxMode,
    projection: ProjectionMode,
    order: RelayOrder,
    event_id: RelayEventId,
    acks: RelayAcks,
    cursor: RelayCursor,
    publish: PublishMode,
}

/// Milliseconds from a validated, non-negative count.
fn ms(v: i64) -> Duration {
    Duration::from_millis(v as u64)
}

/// A declared service with no `relay.command` is its own relay: it sends
/// its outbox rows itself (an externalizer after its commits), and no
/// relay process runs.
fn own_relay(raw: &RawScenario) -> bool {
    raw.system.as_ref().is_some_and(|s| s.service.is_some()) && raw.relay.command.is_none()
}

impl Validator<'_> {
    /// `[system]`, with what it needs of the rest: the user's consumer (and
    /// relay, unless the service is its own) as commands, and only faults that act from outside (inside
    /// faults strike our reference components, which do not run).
    fn declared(
        &self,
        raw: &RawScenario,
        path: &Path,
        faults: &FaultRates,
        consumer: &Option<ProgramCommand>,
    ) -> Result<Option<System>, crate::Error> {
        let Some(sys) = &raw.system else { return Ok(None) };
        let span = 0..0;
        // A declaration without a service runs nothing of its own: the
        // payments pipeline's, built in, judges the pipeline's runs.
        // Without `relay.command` the service is its own relay (it sends
        // its outbox rows itself, after its commits): no relay runs.
        if sys.service.is_some() && consumer.is_none() {
            return self.err(
                span,
                "`[system]` runs your own consumer, and `notifier.command` is not set; set `notifier.command` (your consumer), and `relay.command` unless your service sends its outbox rows itself",
            );
        }
        if raw.workload.payments.span() != (0..0) {
            return self.err(
                raw.workload.payments.span(),
                "`workload.payments` drives the payments pipeline, which a `[system]` scenario does not run; set `system.operation.count`",
            );
        }
        // The provider runs when an effect is a call to it: its faults apply.
        let provider = sys.effects.iter().any(|e| e.provider.is_some());
        let inside = FaultPoint::ALL.iter().find(|p| {
            faults.get(**p) > 0.0
                && !(p.needs_process() || p.proxied() || p.is_service() || (provider && p.strike() == Strike::Provider))
        });
        if let Some(p) = inside {
            return self.err(
                raw.faults.get(*p).span(),
                &format!(
                    "`faults.{}` strikes inside {}, which a `[system]` scenario does not run; use `process_kill`, `process_pause` or a fault of the proxy (`db_*`, `kafka_*`)",
                    p.key(),
                    p.strike().needs()
                ),
            );
        }
        Ok(Some(self.system(sys, path)?))
    }

    /// `[notifier] command` and `[relay] command`, each checked against
    /// what only the reference component has (its variants and its inner
    /// fault points); and kills and pauses from outside, which need a
    /// component that runs as a process.
    fn programs(
        &self,
        raw: &RawScenario,
        path: &Path,
        faults: &FaultRates,
    ) -> Result<(Option<ProgramCommand>, Option<ProgramCommand>), crate::Error> {
        let n = &raw.notifier;
        let r = &raw.relay;
        let notifier = self.program(
            n.command.as_ref(),
            "notifier",
            &[("notifier.inbox", &n.inbox), ("notifier.projection", &n.projection)],
            path,
            (faults, &raw.faults),
        )?;
        let relay = self.program(
            r.command.as_ref(),
            "relay",
            &[
                ("relay.order", &r.order),
                ("relay.event_id", &r.event_id),
                ("relay.acks", &r.acks),
                ("relay.cursor", &r.cursor),
                ("relay.producer", &r.producer),
            ],
            path,
            (faults, &raw.faults),
        )?;
        if notifier.is_none() && relay.is_none() && raw.run.components.get_ref() != "process" {
            if let Some(p) = FaultPoint::ALL.iter().find(|p| p.needs_process() && faults.get(**p) > 0.0) {
                return self.err(
                    raw.faults.get(*p).span(),
                    &format!(
                        "`faults.{}` acts on a component that runs as a process; set `notifier.command` or `relay.command` to a program under test, or `run.components = \"process\"`, or remove it",
                        p.key()
                    ),
                );
            }
        }
        Ok((notifier, relay))
    }

    fn program(
        &self,
        cmd: Option<&Spanned<Vec<String>>>,
        role: &str,
        variants: &[(&str, &Spanned<String>)],
        path: &Path,
        (faults, spans): (&FaultRates, &RawFaults),
    ) -> Result<Option<ProgramCommand>, crate::Error> {
        let Some(cmd) = cmd else { return Ok(None) };
        let argv = cmd.get_ref();
        if argv.first().is_none_or(|a| a.trim().is_empty()) {
            return self.err(
                cmd.span(),
                &format!("`{role}.command` is empty; expected the program and its arguments, e.g. [\"python3\", \"{role}.py\"]"),
            );
        }
        for (key, v) in variants {
            if v.span() != (0..0) {
                return self.err(
                    v.span(),
                    &format!("`{key}` shapes the reference {role}; with `{role}.command` the program under test decides, so remove `{key}`"),
                );
            }
        }
        if let Some(p) = FaultPoint::ALL.iter().find(|p| p.strike().component() == Some(role) && faults.get(**p) > 0.0)
        {
            return self.err(
                spans.get(*p).span(),
                &format!(
                    "`faults.{}` strikes inside the reference {role}; a program under test is faulted from outside by `faults.process_kill` and `faults.process_pause`",
                    p.key()
                ),
            );
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Some(ProgramCommand { argv: argv.clone(), dir }))
    }
}

/// "; did you mean `x`?" for the candidate closest to `wrong`, when one is
/// close enough to be a typo (at most a third of its letters apart);
/// otherwise nothing.
pub(super) fn did_you_mean<'a>(wrong: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let best = candidates.map(|c| (edit_distance(wrong, c), c)).min_by_key(|(d, _)| *d);
    match best {
        Some((d, c)) if d > 0 && d <= (wrong.chars().count().max(3) / 3).max(1) => format!("; did you mean `{c}`?"),
        _ => String::new(),
    }
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// The scenario text with each fault point name written as a key in
/// `[faults]` (or as `faults.<name>`) replaced by the point's key: the same
/// length, so every span stays valid. Only keys at the start of a line are
/// touched, with or without quotes.
pub(super) fn fault_names_as_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_faults = false;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            in_faults = trimmed.trim_end().trim_end_matches(|c: char| c == '#' || c.is_whitespace()) == "[faults]"
                || trimmed.starts_with("[faults]");
            out.push_str(line);
            continue;
        }
        let indent = &line[..line.len() - trimmed.len()];
        let (prefix, rest) = match trimmed.strip_prefix("faults.") {
            Some(r) => ("faults.", r),
            None if in_faults => ("", trimmed),
            None => {
                out.push_str(line);
                continue;
            }
        };
        let quote = if rest.starts_with('"') { "\"" } else { "" };
        let body = &rest[quote.len()..];
        let point = FaultPoint::ALL.iter().find(|p| {
            body.strip_prefix(p.name())
                .and_then(|after| after.strip_prefix(quote))
                .is_some_and(|after| after.trim_start().starts_with('='))
        });
        match point {
            Some(p) => {
                out.push_str(indent);
                out.push_str(prefix);
                out.push_str(quote);
                out.push_str(p.key());
                out.push_str(&body[p.name().len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// 1-based line and column of a byte offset, as editors count them.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// Parses "250ms", "30s", "10m", "1h", "7d".
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => return Some(Duration::from_millis(n)),
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}
