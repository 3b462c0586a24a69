//! A declared system (`[system]`, docs/contract.md section 8): the user's
//! own schema, service, outbox, effects and checks, in place of the
//! payments pipeline. The raw tables mirror the TOML; [`System`] is what a
//! run uses, every name checked and every default filled in.

use super::validate::Validator;
use super::*;
use std::collections::BTreeMap;

/// `[system]` as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSystem {
    /// A SQL file applied in the run's schema before anything starts.
    #[schemars(with = "Option<String>")]
    pub setup: Option<Spanned<String>>,
    /// Or the user's migrations, run once.
    #[schemars(with = "Option<Vec<String>>")]
    pub setup_command: Option<Spanned<Vec<String>>>,
    /// Work the system has accepted and not finished (inbox rows a
    /// consumer stored and has not yet applied): one row each, with an
    /// optional `key` column naming its key.
    #[schemars(with = "Option<String>")]
    pub pending: Option<Spanned<String>>,
    /// Unset in the payments pipeline's own declaration, which judges its runs.
    pub service: Option<RawService>,
    pub operation: RawOperation,
    pub outbox: RawOutbox,
    #[serde(default)]
    pub effects: Vec<RawEffect>,
    #[serde(default)]
    pub checks: Vec<RawCheck>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawService {
    #[schemars(with = "Vec<String>")]
    pub command: Spanned<Vec<String>>,
    #[serde(default = "one")]
    #[schemars(with = "i64")]
    pub instances: Spanned<i64>,
    /// The path a GET must answer 2xx on once the service is ready.
    #[serde(default = "health")]
    #[schemars(with = "String")]
    pub health: Spanned<String>,
    /// Or: a text the service writes on its stdout or stderr once ready.
    #[schemars(with = "Option<String>")]
    pub ready_line: Option<Spanned<String>>,
    #[serde(default = "thirty")]
    #[schemars(with = "i64")]
    pub ready_timeout_secs: Spanned<i64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOperation {
    #[serde(default = "three_hundred")]
    #[schemars(with = "i64")]
    pub count: Spanned<i64>,
    #[serde(default = "eight")]
    #[schemars(with = "i64")]
    pub concurrency: Spanned<i64>,
    #[serde(default = "post")]
    #[schemars(with = "String")]
    pub method: Spanned<String>,
    /// Unset in a declaration that only judges another run.
    #[schemars(with = "Option<String>")]
    pub path: Option<Spanned<String>>,
    /// A JSON body template: a string that is exactly `"{name}"` becomes
    /// the value with its type.
    #[schemars(with = "Option<serde_json::Value>")]
    pub body: Option<toml::Value>,
    #[serde(default = "two_seconds")]
    #[schemars(with = "i64")]
    pub timeout_ms: Spanned<i64>,
    /// The outbox event types each operation must produce.
    #[schemars(with = "Vec<String>")]
    pub events: Spanned<Vec<String>>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawValue>")]
    pub values: BTreeMap<String, Spanned<RawValue>>,
}

/// How an operation's value is drawn from the seed.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawValue {
    /// Inclusive bounds of an integer.
    pub range: Option<[i64; 2]>,
    /// One of these, each equally likely.
    #[schemars(with = "Option<Vec<serde_json::Value>>")]
    pub one_of: Option<Vec<toml::Value>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutbox {
    #[schemars(with = "String")]
    pub table: Spanned<String>,
    #[schemars(with = "String")]
    pub id: Spanned<String>,
    #[schemars(with = "String")]
    pub key: Spanned<String>,
    #[serde(rename = "type")]
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    #[schemars(with = "String")]
    pub payload: Spanned<String>,
    /// `"column"`, `"delete"` or `"none"`.
    #[serde(default = "column")]
    #[schemars(with = "String", extend("enum" = ["column", "delete", "none"]))]
    pub published: Spanned<String>,
    #[schemars(with = "Option<String>")]
    pub published_column: Option<Spanned<String>>,
    /// A SQL condition on the outbox log's text columns (`id`, `key`,
    /// `kind`, `payload`) true for a malformed event.
    #[schemars(with = "Option<String>")]
    pub malformed: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawEffect {
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// A query returning one row per effect; or `provider`.
    #[schemars(with = "Option<String>")]
    pub query: Option<Spanned<String>>,
    /// The effect is a call to the provider `chaos` runs: its record's
    /// requests that sent something, with these body fields.
    #[schemars(with = "Option<RawProviderFields>")]
    pub provider: Option<Spanned<RawProviderFields>>,
    /// `"per-message"`, `"per-key"` or `"none"`.
    #[serde(default = "per_message")]
    #[schemars(with = "Once")]
    pub once: Spanned<String>,
    #[schemars(with = "Option<Vec<String>>")]
    pub types: Option<Spanned<Vec<String>>>,
    /// The operation value the rows' `key` column holds.
    #[schemars(with = "Option<String>")]
    pub key: Option<Spanned<String>>,
    /// An integer operation value whose sum per key the amounts equal.
    #[schemars(with = "Option<String>")]
    pub conserve: Option<Spanned<String>>,
}

/// Which fields of a provider request's JSON body an effect row takes.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProviderFields {
    pub message_id: Option<String>,
    pub key: String,
    pub amount: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCheck {
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    #[schemars(with = "String")]
    pub query: Spanned<String>,
}

fn sp<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}
fn one() -> Spanned<i64> {
    sp(1)
}
fn eight() -> Spanned<i64> {
    sp(8)
}
fn thirty() -> Spanned<i64> {
    sp(30)
}
fn three_hundred() -> Spanned<i64> {
    sp(300)
}
fn two_seconds() -> Spanned<i64> {
    sp(2000)
}
fn health() -> Spanned<String> {
    sp("/health".into())
}
fn post() -> Spanned<String> {
    sp("POST".into())
}
fn column() -> Spanned<String> {
    sp("column".into())
}
fn per_message() -> Spanned<String> {
    sp("per-message".into())
}

/// A declared system, validated.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct System {
    pub setup: Setup,
    /// None in the payments pipeline's own declaration: its runs are
    /// judged by it, the service being ours.
    pub service: Option<ServiceDecl>,
    pub operation: OperationDecl,
    pub outbox: OutboxDecl,
    pub effects: Vec<EffectDecl>,
    pub checks: Vec<CheckDecl>,
    /// The declared pending work's query: the run settles until it returns
    /// no rows, and a key it still holds then is stalled, not missing.
    #[serde(default)]
    pub pending: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Setup {
    /// A SQL file's path and text, read at validation.
    Sql {
        path: PathBuf,
        text: String,
    },
    Command(ProgramCommand),
    /// A declaration that judges another run: the schema is that run's.
    None,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServiceDecl {
    pub command: ProgramCommand,
    pub instances: usize,
    pub health: String,
    /// When set, readiness is this text in the service's output, not the
    /// health path.
    pub ready_line: Option<String>,
    pub ready_timeout: Duration,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OperationDecl {
    pub count: u64,
    pub concurrency: usize,
    pub method: String,
    pub path: Option<String>,
    pub body: Option<serde_json::Value>,
    pub timeout: Duration,
    pub events: Vec<String>,
    /// Each value's name and how it is drawn, in name order.
    pub values: Vec<(String, ValueGen)>,
}

impl OperationDecl {
    /// The index of a named value.
    pub fn value_index(&self, name: &str) -> Option<usize> {
        self.values.iter().position(|(n, _)| n == name)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum ValueGen {
    Range(i64, i64),
    OneOf(Vec<serde_json::Value>),
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OutboxDecl {
    pub table: String,
    pub id: OutboxField,
    pub key: OutboxField,
    pub kind: OutboxField,
    pub payload: OutboxField,
    pub published: Published,
    /// What makes an event malformed, as a SQL condition on the outbox
    /// log's text columns; None when the service writes none.
    pub malformed: Option<String>,
}

/// One of `[system.outbox]`'s `id`, `key`, `type` and `payload`: a column
/// of the outbox row, or an SQL expression over the row, for the libraries
/// that keep one serialized envelope per row (`payload->>'eventId'`), so
/// that their table is declared as it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutboxField {
    /// A plain name (unquoted lowercase SQL: letters, digits, _): that column.
    Column(String),
    /// Any other value: evaluated over the row as written.
    Expression(String),
}

impl From<&str> for OutboxField {
    /// A plain name is a column, anything else an expression.
    fn from(value: &str) -> Self {
        match identifier(value) {
            true => Self::Column(value.to_string()),
            false => Self::Expression(value.to_string()),
        }
    }
}

/// How the user's relay marks an outbox row as published.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Published {
    /// This column is NULL until the row is on the topic.
    Column(String),
    /// The relay deletes the row.
    Delete,
    /// No mark (a change-data-capture reader).
    None,
}

choices! {
    /// What exactly once means for a declared effect.
    Once {
        /// One row per event of the effect's types, naming that event.
        PerMessage = "per-message",
        /// One row per malformed event (`system.outbox.malformed`), naming
        /// it: a dead letter.
        PerMalformedMessage = "per-malformed-message",
        /// One row per key of an operation that took effect.
        PerKey = "per-key",
        /// No count: the effect is only conserved.
        Unbounded = "none",
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EffectDecl {
    pub name: String,
    /// Empty for an effect read from the provider's record.
    pub query: String,
    /// The body fields of the provider's requests, for an effect that is a
    /// call to the provider `chaos` runs (an email, a charge).
    pub provider: Option<ProviderFields>,
    pub once: Once,
    /// The event types that cause it.
    pub types: Vec<String>,
    /// The operation value its `key` column holds; None for the operation's key.
    pub key_value: Option<usize>,
    /// The operation value conserved in its `amount` column.
    pub conserve: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderFields {
    pub message_id: Option<String>,
    pub key: String,
    pub amount: Option<String>,
}

impl System {
    /// Whether an effect is read from the provider's record: then the run
    /// starts the provider, and its faults apply.
    pub fn uses_provider(&self) -> bool {
        self.effects.iter().any(|e| e.provider.is_some())
    }

    /// The body fields the effects read from the provider's record: what
    /// the record keeps of each request.
    pub fn provider_fields(&self) -> Vec<String> {
        let mut fields: Vec<String> = Vec::new();
        for f in self.effects.iter().filter_map(|e| e.provider.as_ref()) {
            for name in f.message_id.iter().chain([&f.key]).chain(f.amount.iter()) {
                if !fields.contains(name) {
                    fields.push(name.clone());
                }
            }
        }
        fields
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckDecl {
    pub name: String,
    pub query: String,
}

/// A SQL identifier as the declarations accept it: unquoted PostgreSQL
/// rules, so that the name means the same quoted or not.
fn identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

impl Validator<'_> {
    /// `[system]`, when the scenario declares one.
    pub(super) fn system(&self, raw: &RawSystem, path: &Path) -> Result<System, crate::Error> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let setup = self.setup(raw, &dir)?;
        let service = match &raw.service {
            Some(s) => Some(self.service(s, &dir)?),
            None => None,
        };
        if let (Some(_), None) = (&service, &raw.operation.path) {
            return self.err(
                0..0,
                "`system.operation.path` is not set; name the path each operation is sent to, e.g. \"/orders\"",
            );
        }
        let operation = self.operation(&raw.operation)?;
        let outbox = self.outbox(&raw.outbox)?;
        let mut effects = Vec::new();
        for e in &raw.effects {
            effects.push(self.effect(e, &operation, &effects)?);
        }
        let checks = self.checks(&raw.checks)?;
        let pending = match &raw.pending {
            Some(q) if q.get_ref().trim().is_empty() => {
                return self.err(q.span(), "`system.pending` is empty; give the query whose rows are work accepted and not yet applied, or leave the key out")
            }
            Some(q) => Some(q.get_ref().clone()),
            None => None,
        };
        Ok(System { setup, service, operation, outbox, effects, checks, pending })
    }

    /// `system.setup` (a SQL file beside the scenario) or
    /// `system.setup_command` (the user's migrations), at most one.
    fn setup(&self, raw: &RawSystem, dir: &Path) -> Result<Setup, crate::Error> {
        Ok(match (&raw.setup, &raw.setup_command) {
            (Some(_), Some(c)) => {
                return self.err(c.span(), "`system.setup` and `system.setup_command` are both set; keep one")
            }
            (None, None) if raw.service.is_some() => {
                return self.err(
                    0..0,
                    "`[system]` has no `setup`; set `setup = \"schema.sql\"` (a SQL file applied in the run's schema) or `setup_command = [...]` (your migrations)",
                )
            }
            (Some(file), None) => {
                let p = dir.join(file.get_ref());
                match std::fs::read_to_string(&p) {
                    Ok(text) => Setup::Sql { path: p, text },
                    Err(e) => {
                        return self.err(
                            file.span(),
                            &format!("`system.setup` is {:?}, and {} cannot be read: {e}; the path is relative to the scenario's folder", file.get_ref(), p.display()),
                        )
                    }
                }
            }
            (None, Some(c)) => Setup::Command(ProgramCommand { argv: self.argv(c, "system.setup_command")?, dir: dir.to_path_buf() }),
            (None, None) => Setup::None,
        })
    }

    /// One `[[system.effects]]`, its name not yet taken by `before`.
    fn effect(
        &self,
        e: &RawEffect,
        operation: &OperationDecl,
        before: &[EffectDecl],
    ) -> Result<EffectDecl, crate::Error> {
        let name = e.name.get_ref().trim().to_string();
        if name.is_empty() || before.iter().any(|x| x.name == name) {
            return self.err(
                e.name.span(),
                &format!("`system.effects.name` is {:?}; each effect needs a name of its own", e.name.get_ref()),
            );
        }
        let once = self.choice(&e.once, "system.effects.once", Once::parse, Once::names)?;
        let types = match &e.types {
            Some(t) => {
                if let Some(bad) = t.get_ref().iter().find(|x| !operation.events.contains(x)) {
                    return self.err(t.span(), &format!("`system.effects.types` of {name:?} names {bad:?}, which `system.operation.events` does not list ({})", operation.events.join(", ")));
                }
                t.get_ref().clone()
            }
            None => operation.events.clone(),
        };
        let value = |v: &Option<Spanned<String>>, key: &str| -> Result<Option<usize>, crate::Error> {
            let Some(v) = v else { return Ok(None) };
            match operation.value_index(v.get_ref()) {
                Some(i) => Ok(Some(i)),
                None => self.err(v.span(), &format!("`system.effects.{key}` of {name:?} is {:?}, which is not a value of `[system.operation.values]` ({})", v.get_ref(), operation.values.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", "))),
            }
        };
        let key_value = value(&e.key, "key")?;
        let conserve = value(&e.conserve, "conserve")?;
        if let (Some(i), Some(c)) = (conserve, &e.conserve) {
            if !matches!(operation.values[i].1, ValueGen::Range(..)) {
                return self.err(c.span(), &format!("`system.effects.conserve` of {name:?} is {:?}, which is not an integer value; give it `range = [lo, hi]`", c.get_ref()));
            }
        }
        if matches!(once, Once::PerMessage | Once::PerMalformedMessage) && key_value.is_some() {
            return self.err(e.key.as_ref().map(|k| k.span()).unwrap_or(0..0), &format!("`system.effects.key` of {name:?} is set with `once = \"per-message\"`, whose rows carry their event's key; remove it or use `once = \"per-key\"`"));
        }
        if once == Once::Unbounded && conserve.is_none() {
            return self.err(e.once.span(), &format!("effect {name:?} has `once = \"none\"` and no `conserve`, so nothing would be checked; set `conserve` or another `once`"));
        }
        let (query, provider) = match (&e.query, &e.provider) {
            (Some(q), None) => (q.get_ref().clone(), None),
            (None, Some(p)) => {
                let f = p.get_ref();
                let needs = |field: &Option<String>, what: &str, wanted: bool| match (field, wanted) {
                    (None, true) => self.err(p.span(), &format!("effect {name:?} reads the provider's record and has no `provider.{what}`; name the body field that holds it")),
                    _ => Ok(()),
                };
                needs(&f.message_id, "message_id", matches!(once, Once::PerMessage | Once::PerMalformedMessage))?;
                needs(&f.amount, "amount", conserve.is_some())?;
                (String::new(), Some(ProviderFields { message_id: f.message_id.clone(), key: f.key.clone(), amount: f.amount.clone() }))
            }
            (Some(q), Some(_)) => return self.err(q.span(), &format!("effect {name:?} has both `query` and `provider`; keep one")),
            (None, None) => return self.err(e.name.span(), &format!("effect {name:?} has neither `query` (SQL returning one row per effect) nor `provider` (the provider's record)")),
        };
        Ok(EffectDecl { name, query, provider, once, types, key_value, conserve })
    }

    /// `[[system.checks]]`, each named once.
    fn checks(&self, raw: &[RawCheck]) -> Result<Vec<CheckDecl>, crate::Error> {
        let mut checks = Vec::new();
        for c in raw {
            let name = c.name.get_ref().trim().to_string();
            if name.is_empty() || checks.iter().any(|x: &CheckDecl| x.name == name) {
                return self.err(
                    c.name.span(),
                    &format!("`system.checks.name` is {:?}; each check needs a name of its own", c.name.get_ref()),
                );
            }
            checks.push(CheckDecl { name, query: c.query.get_ref().clone() });
        }
        Ok(checks)
    }

    fn service(&self, raw: &RawService, dir: &Path) -> Result<ServiceDecl, crate::Error> {
        let health = raw.health.get_ref().clone();
        let ready_line = raw.ready_line.as_ref().map(|l| l.get_ref().clone());
        if let (Some(l), false) = (&raw.ready_line, raw.health.span() == (0..0)) {
            return self.err(
                l.span(),
                "`system.service.ready_line` and `health` are both set; the service is ready by one of them, keep one",
            );
        }
        if ready_line.as_deref().is_some_and(|l| l.trim().is_empty()) {
            return self.err(
                raw.ready_line.as_ref().map_or(0..0, |l| l.span()),
                "`system.service.ready_line` is empty; give the text your service prints once it listens",
            );
        }
        if !health.starts_with('/') {
            return self.err(
                raw.health.span(),
                &format!("`system.service.health` is {health:?}; expected a path such as \"/health\""),
            );
        }
        Ok(ServiceDecl {
            command: ProgramCommand {
                argv: self.argv(&raw.command, "system.service.command")?,
                dir: dir.to_path_buf(),
            },
            instances: self.count(&raw.instances, "system.service.instances", 1, 16)? as usize,
            health,
            ready_line,
            ready_timeout: Duration::from_secs(self.count(
                &raw.ready_timeout_secs,
                "system.service.ready_timeout_secs",
                1,
                3600,
            )? as u64),
        })
    }

    fn operation(&self, raw: &RawOperation) -> Result<OperationDecl, crate::Error> {
        let method = raw.method.get_ref().to_ascii_uppercase();
        if !["POST", "PUT", "PATCH", "GET", "DELETE"].contains(&method.as_str()) {
            return self.err(
                raw.method.span(),
                &format!(
                    "`system.operation.method` is {:?}; expected POST, PUT, PATCH, GET or DELETE",
                    raw.method.get_ref()
                ),
            );
        }
        if let Some(p) = raw.path.as_ref().filter(|p| !p.get_ref().starts_with('/')) {
            return self.err(
                p.span(),
                &format!("`system.operation.path` is {:?}; expected a path such as \"/orders\"", p.get_ref()),
            );
        }
        let events = raw.events.get_ref().clone();
        if events.is_empty() || events.iter().any(|e| e.trim().is_empty()) {
            return self.err(raw.events.span(), "`system.operation.events` is empty; list the outbox event types each operation must produce, e.g. [\"OrderPlaced\"]");
        }
        let mut values = Vec::new();
        for (name, v) in &raw.values {
            if name == "key" || !identifier(name) {
                return self.err(v.span(), &format!("`system.operation.values` names {name:?}; a value's name is lowercase letters, digits and _, and not \"key\" (the operation's own key)"));
            }
            let generator = match (&v.get_ref().range, &v.get_ref().one_of) {
                (Some([lo, hi]), None) if lo <= hi => ValueGen::Range(*lo, *hi),
                (None, Some(list)) if !list.is_empty() => {
                    let json = list.iter().map(serde_json::to_value).collect::<Result<Vec<_>, _>>();
                    match json {
                        Ok(j) => ValueGen::OneOf(j),
                        Err(e) => return self.err(v.span(), &format!("`system.operation.values.{name}`: {e}")),
                    }
                }
                _ => {
                    return self.err(v.span(), &format!("`system.operation.values.{name}` must be {{ range = [lo, hi] }} with lo <= hi, or {{ one_of = [...] }} with at least one value"))
                }
            };
            values.push((name.clone(), generator));
        }
        let body = match &raw.body {
            Some(b) => Some(
                serde_json::to_value(b)
                    .map_err(|e| crate::Error::Scenario(format!("{}: `system.operation.body`: {e}", self.shown)))?,
            ),
            None => None,
        };
        // Every placeholder must name a value: a typo would otherwise be sent as is.
        let mut texts: Vec<String> = raw.path.iter().map(|p| p.get_ref().clone()).collect();
        if let Some(b) = &body {
            strings(b, &mut texts);
        }
        for t in &texts {
            for name in placeholders(t) {
                if name != "key" && !values.iter().any(|(n, _)| n == name) {
                    return self.err(raw.path.as_ref().map_or(0..0, |p| p.span()), &format!("`system.operation` uses the placeholder {{{name}}}, which is neither {{key}} nor a value of `[system.operation.values]`"));
                }
            }
        }
        Ok(OperationDecl {
            count: self.count(&raw.count, "system.operation.count", 1, 10_000_000)? as u64,
            concurrency: self.count(&raw.concurrency, "system.operation.concurrency", 1, 1024)? as usize,
            method,
            path: raw.path.as_ref().map(|p| p.get_ref().clone()),
            body,
            timeout: Duration::from_millis(
                self.count(&raw.timeout_ms, "system.operation.timeout_ms", 10, 600_000)? as u64
            ),
            events,
            values,
        })
    }

    fn outbox(&self, raw: &RawOutbox) -> Result<OutboxDecl, crate::Error> {
        let ident = |v: &Spanned<String>, key: &str| -> Result<String, crate::Error> {
            match identifier(v.get_ref()) {
                true => Ok(v.get_ref().clone()),
                false => self.err(
                    v.span(),
                    &format!(
                        "`system.outbox.{key}` is {:?}; expected an unquoted lowercase SQL name (letters, digits, _)",
                        v.get_ref()
                    ),
                ),
            }
        };
        let published = match (raw.published.get_ref().as_str(), &raw.published_column) {
            ("column", Some(c)) => Published::Column(ident(c, "published_column")?),
            ("column", None) => return self.err(raw.published.span(), "`system.outbox.published` is \"column\" and `published_column` is not set; name the column that is NULL until a row is published"),
            ("delete", None) => Published::Delete,
            ("none", None) => Published::None,
            ("delete" | "none", Some(c)) => return self.err(c.span(), "`system.outbox.published_column` is set, and `published` is not \"column\"; remove one"),
            (other, _) => return self.err(raw.published.span(), &format!("`system.outbox.published` is {other:?}; expected \"column\", \"delete\" or \"none\"")),
        };
        // A column or an expression; an expression's SQL is proved on the
        // fresh schema (store::declared::probe_outbox), in the database's words.
        let field = |v: &Spanned<String>, key: &str| -> Result<OutboxField, crate::Error> {
            match v.get_ref().trim().is_empty() {
                true => self.err(v.span(), &format!("`system.outbox.{key}` is empty; name a column of the outbox, or write an SQL expression over its row (\"payload->>'eventId'\")")),
                false => Ok(OutboxField::from(v.get_ref().as_str())),
            }
        };
        Ok(OutboxDecl {
            table: ident(&raw.table, "table")?,
            id: field(&raw.id, "id")?,
            key: field(&raw.key, "key")?,
            kind: field(&raw.kind, "type")?,
            payload: field(&raw.payload, "payload")?,
            published,
            malformed: raw.malformed.as_ref().map(|m| m.get_ref().clone()),
        })
    }
}

/// Every string inside a JSON value.
fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// The names of the `{name}` placeholders in a text.
pub fn placeholders(t: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) if identifier(&after[..close]) => {
                out.push(&after[..close]);
                rest = &after[close + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_names_in_braces() {
        assert_eq!(placeholders("/orders/{key}/items/{sku}"), vec!["key", "sku"]);
        assert_eq!(placeholders("{not a name} {a}"), vec!["a"]);
        assert!(placeholders("no braces").is_empty());
    }

    #[test]
    fn an_outbox_field_is_a_column_when_it_is_a_plain_name_and_an_expression_otherwise() {
        assert_eq!(OutboxField::from("event_id"), OutboxField::Column("event_id".into()));
        for e in ["payload->>'eventId'", "convert_from(envelope, 'UTF8')::jsonb->>'key'", "EventId", "\"eventId\""] {
            assert_eq!(OutboxField::from(e), OutboxField::Expression(e.into()), "{e}");
        }
    }

    #[test]
    fn identifiers_follow_unquoted_sql() {
        assert!(identifier("order_events"));
        assert!(identifier("_x1"));
        assert!(!identifier("Orders"));
        assert!(!identifier("1x"));
        assert!(!identifier("a;drop"));
        assert!(!identifier(""));
    }
}
