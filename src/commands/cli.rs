//! The command line. Flags mirror the README; `main.rs` only parses and
//! dispatches.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "chaos",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CHAOS_COMMIT"), ")"),
    about = "Crash an outbox/inbox payments pipeline at named fault points and prove whether each payment produced exactly one receipt.",
    long_about = "Crash an outbox/inbox payments pipeline at named fault points and prove whether each payment produced exactly one receipt.\n\n\
The pipeline: a payment service writes payments and outbox events in one transaction; relays publish them to Kafka; \
a notifier consumes them through an inbox. The verifier reconciles the database with every message on the topic. \
With `[notifier] command = [...]` in the scenario, your own consumer runs in place of the reference notifier, as OS processes \
that the harness kills (SIGKILL) and pauses (SIGSTOP) for real; its contract is docs/contract.md.\n\n\
Exit codes: 0 pass, 1 invariant violated or anomaly found, 2 bad input, 3 PostgreSQL/Kafka (or pgbench) unreachable or unusable, \
4 inconclusive (a fault never fired or its effect was never seen), 5 incomplete (a merge missing a shard, did not drain, a component panicked or hung, \
a short topic read, a program under test that could not start, exited or never joined), 6 a benchmark target missed, 70 internal error, 74 cannot write a report or file, 130 interrupted.",
    after_help = "First run (embedded, nothing installed): chaos init --example payments payments.toml, then chaos run payments.toml (in a checkout: chaos run scenarios/payments.toml)\n\
On the real services: scripts/services.sh up, then DATABASE_URL=postgres://chaos:chaos@127.0.0.1:5432/chaos KAFKA_BROKERS=127.0.0.1:9092 chaos run scenarios/payments.toml\n\
Prove the verifier can fail: chaos selftest\n\
Your own consumer: PATH=\"$(scripts/python-env.sh):$PATH\" chaos run examples/python/consumer.toml (docs/contract.md)"
)]
pub struct Cli {
    /// More logs on stderr (-v info, -vv debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario end to end, verify it, print the tables and write reports/<run-id>.json, .md and .html.
    Run(RunArgs),
    /// Render a saved report (reports/<run-id>.json) again, or list the runs of a reports folder with their verdicts.
    Report {
        /// The JSON report to render, or a folder of them (e.g. reports/) to list.
        file: PathBuf,
        /// Render as Markdown instead of terminal tables.
        #[arg(long)]
        markdown: bool,
        /// Print the few lines `chaos run` prints (verdict, harm, example, cause, faults) instead of every table.
        #[arg(long, conflicts_with_all = ["markdown", "html"])]
        summary: bool,
        /// Write the HTML report (charts, tables, the anomalies' stories) and print its path.
        #[arg(long, conflicts_with = "markdown")]
        html: bool,
        /// Where --html writes the page (default: <run-id>.html beside the JSON).
        #[arg(long, requires = "html", value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Check that PostgreSQL and Kafka answer; exits 3 with a hint when either does not.
    Doctor(DoctorArgs),
    /// Measure throughput per stage, latency and peak memory, beside a pgbench yardstick; prints which targets are met.
    Bench(BenchArgs),
    /// Remove the schemas, topics, consumer groups and SQLite files of runs older than a duration (and, with --reports, their reports); nothing else.
    Clean(CleanArgs),
    /// Prove the verifier can fail: run every classic mistake with the fault that exposes it, then the correct pipeline.
    Selftest(SelftestArgs),
    /// Run a scenario over many seeds, one after the other (optionally with swarm fault rates per seed); stops at the first failure and can shrink it.
    Sweep(SweepArgs),
    /// Merge the summaries of a sweep's shards (`chaos sweep --shard K/N` on N machines) into one: a table, a summary JSON, JUnit, and the sweep's exit code.
    Merge(MergeArgs),
    /// Write a scenario file with every key at its default and one line of meaning (scenarios/reference.toml), to copy from; or, with --consumer CMD or --relay CMD, the recommended scenario for your program; with --system (and --from FILE), the recommended scenario for your whole declared system.
    Init(InitArgs),
    /// Print a shell completion script: `chaos completions bash > ~/.local/share/bash-completion/completions/chaos`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `chaos man > ~/.local/share/man/man1/chaos.1`, then `man chaos`.
    Man,
    /// Print a JSON Schema: `chaos schema scenario > chaos.schema.json` for an editor to complete and check scenarios with (Taplo: a scenario's first line `#:schema ./chaos.schema.json`); `chaos schema report` for what reports/<run-id>.json holds.
    Schema {
        /// Which: report or scenario.
        #[arg(value_name = "KIND")]
        of: SchemaOf,
    },
    /// One relay or notifier instance as a process of its own; started by `chaos run` with components = "process".
    #[command(hide = true)]
    Component,
}

#[derive(Debug, Args)]
pub struct SelftestArgs {
    #[command(flatten)]
    pub infra: InfraArgs,
    /// First seed; a variant's retries and the correct pipeline's runs count up from it.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many seeds the correct pipeline runs with (the no-false-alarm check).
    #[arg(long, default_value_t = 1)]
    pub clean_seeds: u32,
    /// Run only the variants whose name contains this (skips the correct pipeline).
    #[arg(long)]
    pub only: Option<String>,
    /// Skip the variants: only the correct pipeline's no-false-alarm runs.
    #[arg(long, conflicts_with = "only")]
    pub no_variants: bool,
    /// Where the runs' reports are written.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Print the summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Where every run's reference relays and notifiers run: in-process, or process (each an OS process the harness kills).
    #[arg(long, value_parser = parse_components, default_value = "in-process")]
    pub components: crate::scenario::Components,
    /// Also write JUnit XML here: a test case per variant and one for the correct pipeline.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Variants run at once, each with its own schema, topic and group (or SQLite file and mock cluster); the correct pipeline's seeds count as one. A run mostly waits on its faults and drain, so 3 takes about a third of the time on two cores; default 1, one after the other.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub jobs: u32,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The scenario file, e.g. scenarios/payments.toml.
    pub scenario: PathBuf,
    /// How many seeds to run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub seeds: u32,
    /// The first seed; the others count up from it.
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Draw every fault rate per seed: each fault the scenario sets is off on a quarter of the seeds, and otherwise runs at 1 to 4 times its rate (log-uniform, capped at 1). Faults the scenario leaves at 0 stay off. The rates are printed, saved and part of each replay command.
    #[arg(long)]
    pub swarm: bool,
    /// Run only shard K of N of the seeds (round robin: the seeds whose index from --first-seed is K-1 modulo N), so that N machines share one sweep; `chaos merge` puts their summaries together.
    #[arg(long, value_name = "K/N", value_parser = crate::campaigns::sweep::Shard::parse)]
    pub shard: Option<crate::campaigns::sweep::Shard>,
    /// Seeds run at once on this machine, each with its own schema, topic and group (or SQLite file and mock cluster); default 1, one after the other.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub jobs: u32,
    /// Run every seed, instead of stopping at the first failure.
    #[arg(long)]
    pub keep_going: bool,
    /// Shrink the first failure: replay it on the embedded backend with fewer payments and groups of fault firings switched off, until nothing more can go; prints the minimal schedule and its replay command.
    #[arg(long)]
    pub shrink: bool,
    /// The most replays --shrink may take.
    #[arg(long, default_value_t = crate::campaigns::shrink::DEFAULT_BUDGET, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub shrink_runs: u32,
    #[command(flatten)]
    pub infra: InfraArgs,
    /// Where the runs' reports and the sweep's JSON summary are written.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Print the summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Override the scenario's `[run] components`: in-process, or process.
    #[arg(long, value_parser = parse_components)]
    pub components: Option<crate::scenario::Components>,
    /// Also write JUnit XML here: a test case per seed; a failing one carries its examples, its replay command and, with --shrink, the minimal one.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub changes: ScenarioChanges,
}

#[derive(Debug, Args)]
pub struct InfraArgs {
    /// PostgreSQL url, e.g. postgres://chaos:chaos@127.0.0.1:5432/chaos. Unset: an embedded SQLite file.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Kafka bootstrap servers, e.g. 127.0.0.1:9092. Unset: librdkafka's embedded mock cluster.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The file to write; an existing file is never overwritten. `-` prints it on stdout.
    #[arg(default_value = "scenario.toml")]
    pub path: PathBuf,
    /// Write the recommended scenario for your consumer instead, running this command (split as a shell would, quotes kept together; run from the file's folder), e.g. --consumer "python3 consumer.py": the faults that expose the classic consumer mistakes, one line of meaning each.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["relay", "system"])]
    pub consumer: Option<String>,
    /// Write the recommended scenario for your outbox relay instead, running this command, e.g. --relay "python3 relay.py": held commits that part commit order from insert order, kills right after its marks and after the broker's acks, then a calm half without kills.
    #[arg(long, value_name = "CMD", conflicts_with = "system")]
    pub relay: Option<String>,
    /// Write the recommended scenario for your whole system instead: a `[system]` declaration skeleton to fill in (service, outbox, relays, consumers, effects), above the faults, proxy latency and consumer pauses a declared system should start from.
    #[arg(long)]
    pub system: bool,
    /// With --consumer: your consumer sends each receipt as an email through the provider chaos runs (CHAOS_PROVIDER_URL): the scenario turns on `[notifier] email` and loses some of the provider's answers, so a retry without an idempotency key doubles an email.
    #[arg(long, requires = "consumer")]
    pub email: bool,
    /// With --system: keep the declaration of this scenario file (its [system] tables, [topic], [relay], [notifier]) and put the recommended faults under it in place of its own. Write the new file beside it: commands and `setup` are relative to the file's folder.
    #[arg(long, value_name = "FILE", requires = "system")]
    pub from: Option<PathBuf>,
    /// Write one of the shipped scenarios instead (the binary carries them, no checkout needed): payments, smoke,
    /// inbox-off, heavy-faults, infra-faults, broker-failover, many-partitions, bench.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["consumer", "relay", "system"])]
    pub example: Option<String>,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' summaries, reports/sweep-<id>.json, one per shard; or a folder, whose sweep-*.json files are taken.
    #[arg(required = true)]
    pub summaries: Vec<PathBuf>,
    /// Where the merged summary is written.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Print the merged summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write JUnit XML here: a test case per seed, the seeds of missing shards skipped.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Judge the shards given even when others are missing: exit with the merged verdict of the seeds that ran.
    /// Without it, a missing shard ends the merge with exit 5 (incomplete), naming its seeds: they never ran.
    #[arg(long)]
    pub allow_partial: bool,
}

/// `chaos doctor`'s flags: the same as a run's, but an unset one is probed
/// at its default address, since a doctor is asked about services.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// PostgreSQL url to probe. Unset: postgres://chaos:chaos@127.0.0.1:5432/chaos, the address scripts/services.sh starts (a run with it unset needs no PostgreSQL: it uses an embedded SQLite file).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Kafka bootstrap servers to probe. Unset: 127.0.0.1:9092 (a run with it unset needs no Kafka: it uses librdkafka's embedded mock cluster).
    #[arg(long, env = "KAFKA_BROKERS", hide_env_values = true)]
    pub brokers: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The scenario file, e.g. scenarios/payments.toml.
    pub scenario: PathBuf,
    /// Override the scenario's seed; the report prints the command that replays a run.
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub infra: InfraArgs,
    /// Where reports are written.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Keep an embedded run's SQLite file beside its report even when it passes (a run that does not pass always keeps it).
    #[arg(long)]
    pub keep: bool,
    /// Print the JSON report on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Print every table (verification, faults, invariants, anomalies and their causes), wrapped to the terminal's width, instead of the summary (-v is the log's verbosity, not this).
    #[arg(long, conflicts_with = "json")]
    pub tables: bool,
    /// Override the scenario's `[run] components`: in-process, or process (each relay and notifier an OS process).
    #[arg(long, value_parser = parse_components)]
    pub components: Option<crate::scenario::Components>,
    /// Also write JUnit XML here: a test case per invariant, per chaos check and one for the run itself.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub changes: ScenarioChanges,
    /// Pin the firings by occurrence instead of the seed's decisions, e.g. 'relay.after_produce:3,17;notifier.mid_batch:2' (or none): each listed point fires at exactly those occurrences (counted from 0 across the run), the others never. `chaos sweep --shrink` prints one.
    #[arg(long, value_name = "SCHEDULE", value_parser = parse_schedule)]
    pub schedule: Option<crate::faults::Schedule>,
}

/// Changes to the scenario file from the command line, for `run` and
/// `sweep`; the report's replay command repeats them.
#[derive(Debug, Args, Clone, Default)]
pub struct ScenarioChanges {
    /// Override the scenario's `workload.payments`.
    #[arg(long, value_name = "N")]
    pub payments: Option<u64>,
    /// Override one `[faults]` probability, e.g. --fault relay.after_produce=0.05 or --fault relay_after_produce=0.05 (either spelling; repeatable). Lowers a rate, or raises one the file sets; a fault the file leaves at 0 is refused (set it in the file: what it needs is checked there). Under sweep --swarm it is the rate the draws start from.
    #[arg(long = "fault", value_name = "POINT=P", value_parser = parse_fault)]
    pub faults: Vec<(crate::faults::FaultPoint, f64)>,
}

fn parse_fault(s: &str) -> Result<(crate::faults::FaultPoint, f64), String> {
    use crate::faults::FaultPoint;
    let (name, p) = s.split_once('=').ok_or_else(|| format!("{s:?}: write POINT=P, e.g. relay.after_produce=0.05"))?;
    let point = FaultPoint::named(name)?;
    let p: f64 = p.trim().parse().map_err(|_| format!("{p:?} is not a probability; write a number from 0 to 1"))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{p} is not a probability; write a number from 0 to 1"));
    }
    Ok((point, p))
}

fn parse_schedule(s: &str) -> Result<crate::faults::Schedule, String> {
    crate::faults::Schedule::parse(s)
}

fn parse_components(s: &str) -> Result<crate::scenario::Components, String> {
    crate::scenario::Components::parse(s).ok_or_else(|| format!("expected {}", crate::scenario::Components::names()))
}

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Remove runs older than this, e.g. 30m, 12h, 7d.
    #[arg(long, value_parser = parse_age)]
    pub older_than: std::time::Duration,
    #[command(flatten)]
    pub infra: InfraArgs,
    /// Where the runs' SQLite files are.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the old runs' reports too (<run-id>.json, .md, .html, .xml in the reports folder); sweeps' summaries are kept.
    #[arg(long)]
    pub reports: bool,
}

fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    crate::scenario::parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration; use e.g. 30m, 12h or 7d"))
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Payments to push through the pipeline.
    #[arg(long, default_value_t = 100_000)]
    pub payments: u64,
    /// The scenario whose settings and faults the benchmark uses.
    #[arg(long, default_value = "scenarios/bench.toml")]
    pub scenario: PathBuf,
    #[command(flatten)]
    pub infra: InfraArgs,
    /// pgbench clients for the yardstick.
    #[arg(long, default_value_t = 16)]
    pub pgbench_clients: u32,
    /// pgbench duration for the yardstick, in seconds.
    #[arg(long, default_value_t = 10)]
    pub pgbench_seconds: u32,
    /// Pipeline runs, one after the other (the yardstick runs once). The
    /// figures and targets are the median run's, by end-to-end events/s;
    /// every run's figure is listed. A shared machine swings single runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Untimed pipeline runs first, at the same size, to warm the broker's
    /// JIT (right after Kafka starts, the first runs are slower). Their
    /// invariants still count; their figures do not.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub warmup: u32,
    /// After each timed run, the same run with every relay and notifier an OS process; prints both and the ratio.
    #[arg(long)]
    pub processes: bool,
    /// After each timed run, the same run with every component's database traffic (and Kafka traffic, with a real broker) through the fault proxy, no fault set (PostgreSQL only); prints both and the ratio: the proxy's own cost.
    #[arg(long)]
    pub proxy: bool,
    /// After each timed run, the same run with no receipt emails (`notifier.email = "off"`); prints both and the ratio: the emails' own cost.
    #[arg(long)]
    pub emails_off: bool,
    /// A peak RSS budget in MB, judged at any size (beside the 500 MB one at 1,000,000 payments): a missed budget exits 6.
    #[arg(long, value_name = "MB", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_rss_mb: Option<u64>,
    /// Print the targets, but do not exit 6 when one is missed.
    #[arg(long)]
    pub no_targets: bool,
    /// Where the runs' reports and the bench's JSON are written.
    #[arg(long, default_value = "reports")]
    pub reports_dir: PathBuf,
    /// Print the figures as JSON instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// The files `chaos schema` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaOf {
    /// A run's report, `reports/<run-id>.json` (docs/schema/report.schema.json).
    Report,
    /// A scenario file, as TOML (docs/schema/scenario.schema.json).
    Scenario,
}
