//! One function per subcommand: turns its parsed arguments into the
//! library's options, runs it, prints its result on stdout (tables, or JSON
//! with `--json`), and says which exit code it ends with. `main.rs` only
//! parses, sets up the process and calls [`execute`].

use crate::commands::cli::{BenchArgs, CleanArgs, Command, InitArgs, MergeArgs, RunArgs, SelftestArgs, SweepArgs};
use crate::error::{Error, Result};
use crate::harness::run::{self, RunOptions};
use crate::report::{self, Report, Style};
use exit::Exit;
use std::path::{Path, PathBuf};

/// Writes to stdout, where tables and JSON go. A reader that went away
/// (`chaos report x.json | head`) is no error: the rest has nowhere to go,
/// and the command still ends with its own exit code. SIGPIPE stays
/// ignored, as Rust leaves it: at its default, a peer hanging up on any
/// socket of the run (a client leaving the email provider while an answer
/// was held) killed the whole run with it.
pub(crate) fn out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => tracing::error!("cannot write to stdout: {e}"),
    }
}

/// `print!` through [`out`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::commands::out(format_args!($($arg)*)) };
}

/// `println!` through [`out`].
macro_rules! outln {
    ($($arg:tt)*) => { $crate::commands::out(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) mod clean;
pub mod cli;
pub(crate) mod doctor;
pub mod exit;
pub mod exits;
mod reporters;

/// Runs one subcommand to its exit code.
pub async fn execute(command: Command) -> Result<Exit> {
    match command {
        Command::Run(a) => run_scenario(a).await,
        Command::Report { file, html: true, out, .. } => html_report(&file, out.as_deref()),
        Command::Report { file, summary: true, .. } => show_summary(&file),
        Command::Report { file, markdown, .. } => show_report(&file, markdown),
        Command::Doctor(a) => Ok(crate::commands::doctor::doctor(a.database_url, a.brokers).await),
        Command::Bench(a) => bench(a).await,
        Command::Clean(a) => clean(a).await,
        Command::Selftest(a) => selftest(a).await,
        Command::Sweep(a) => sweep(a).await,
        Command::Merge(a) => merge(a),
        Command::Init(a) => init(&a),
        Command::Completions { shell } => {
            let mut cmd = <cli::Cli as clap::CommandFactory>::command();
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut cmd, "chaos", &mut text);
            out!("{}", String::from_utf8_lossy(&text));
            Ok(Exit::Pass)
        }
        Command::Man => {
            let cmd = <cli::Cli as clap::CommandFactory>::command();
            let mut text = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut text)
                .map_err(|e| Error::Internal(format!("rendering the man page: {e}")))?;
            out!("{}", String::from_utf8_lossy(&text));
            Ok(Exit::Pass)
        }
        Command::Schema { of } => {
            out!(
                "{}",
                match of {
                    cli::SchemaOf::Report => crate::report::schema::json_schema(),
                    cli::SchemaOf::Scenario => crate::scenario::json_schema(),
                }
            );
            Ok(Exit::Pass)
        }
        Command::Component => crate::harness::component::serve().await.map(|()| Exit::Pass),
    }
}

/// `chaos init [PATH]`: the scenario reference, every key at its default,
/// written where the user can edit it, or printed with `-`; with
/// `--consumer CMD` or `--relay CMD`, the recommended scenario for that
/// program.
/// What `chaos init` says of a recommended file for a program.
const RECOMMENDED: &str =
    "the recommended scenario for your program; change nothing but the command and run it as it is";

fn init(a: &InitArgs) -> Result<Exit> {
    let program = |flag: &str, cmd: &str, template: &str| {
        // Split as a shell would, quotes kept together: --consumer "python3 -c 'import x'".
        let argv: Vec<String> = shlex::split(cmd).ok_or_else(|| {
            Error::Usage(format!(
                "{flag} {cmd:?} has an unclosed quote; close it, e.g. {flag} \"python3 app.py --name 'a b'\""
            ))
        })?;
        match argv.is_empty() {
            true => Err(Error::Usage(format!(
                "{flag} is empty; give the command that starts your program, e.g. {flag} \"python3 app.py\""
            ))),
            false => Ok((crate::scenario::with_command(template, &argv), RECOMMENDED)),
        }
    };
    if let Some(name) = &a.example {
        let Some((_, text)) = crate::scenario::EXAMPLES.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = crate::scenario::EXAMPLES.iter().map(|(n, _)| *n).collect();
            return Err(Error::Usage(format!(
                "--example {name:?} is no shipped scenario; name one of: {}",
                names.join(", ")
            )));
        };
        return write_scenario(&a.path, text, &format!("the shipped scenario {name}; run it as it is"));
    }
    let (text, what) = match (&a.consumer, &a.relay, &a.from) {
        (Some(c), _, _) => {
            let (text, what) = program("--consumer", c, crate::scenario::RECOMMENDED_CONSUMER)?;
            (if a.email { crate::scenario::with_email_lines(&text) } else { text }, what)
        }
        (_, Some(r), _) => program("--relay", r, crate::scenario::RECOMMENDED_RELAY)?,
        (_, _, Some(from)) => {
            let declaration = std::fs::read_to_string(from).map_err(|e| {
                Error::Usage(format!(
                    "--from {}: cannot read it ({e}); name the scenario that declares your [system]",
                    from.display()
                ))
            })?;
            if !declaration.lines().any(|l| l.trim_start().starts_with("[system")) {
                return Err(Error::Usage(format!(
                    "--from {} declares no [system]; name a scenario that does (examples/orders/orders.toml), or drop --from for a skeleton",
                    from.display()
                )));
            }
            (
                crate::scenario::system_from(&declaration, &from.display().to_string()),
                "your declaration under the recommended faults; run it as it is",
            )
        }
        _ if a.system => (
            crate::scenario::RECOMMENDED_SYSTEM.to_string(),
            "the recommended scenario for your system; fill in the declaration",
        ),
        _ => (crate::scenario::REFERENCE.to_string(), "every scenario key at its default"),
    };
    write_scenario(&a.path, &text, what)
}

/// Writes a scenario `chaos init` made at `path` (`-`: stdout), never over
/// an existing file, and says how to run it.
fn write_scenario(path: &Path, text: &str, what: &str) -> Result<Exit> {
    if path.as_os_str() == "-" {
        out!("{text}");
        return Ok(Exit::Pass);
    }
    let shown = path.display();
    // create_new: an existing scenario is the user's work, never replaced.
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path);
    match file {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::Usage(format!(
            "{shown} already exists; name another file (chaos init my.toml) or print it with chaos init -"
        ))),
        Err(e) => Err(Error::Write { path: path.to_path_buf(), cause: e.to_string() }),
        Ok(mut f) => {
            use std::io::Write;
            f.write_all(text.as_bytes())
                .map_err(|e| Error::Write { path: path.to_path_buf(), cause: e.to_string() })?;
            // One instruction: a recommended file is run as written; the
            // reference and the skeleton are there to be edited.
            match what.ends_with("as it is") {
                true => outln!("wrote {shown}: {what}: chaos run {shown}"),
                false => outln!("wrote {shown}: {what}; edit it, then: chaos run {shown}"),
            }
            Ok(Exit::Pass)
        }
    }
}

/// Prints a value as pretty JSON on stdout; an encoding failure is an error,
/// never an empty line.
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Internal(format!("encoding JSON: {e}")))?;
    outln!("{text}");
    Ok(())
}

async fn run_scenario(a: RunArgs) -> Result<Exit> {
    let opts = RunOptions {
        scenario: a.scenario,
        seed: a.seed,
        database_url: a.infra.database_url,
        brokers: a.infra.brokers,
        reports_dir: a.reports_dir,
        components: a.components,
        payments: a.changes.payments,
        faults: a.changes.faults,
        schedule: a.schedule,
        keep: a.keep,
    };
    let terminal = reporters::Terminal { tables: a.tables };
    let reporter: &dyn run::Reporter = if a.json { &reporters::Json } else { &terminal };
    let report = run::run(opts, reporter).await?;
    if let Some(path) = &a.junit {
        crate::report::junit::write(&crate::report::junit::for_run(&report), path)?;
    }
    Ok(exits::of_verdict(report.verdict))
}

fn show_report(file: &Path, markdown: bool) -> Result<Exit> {
    if file.is_dir() {
        out!("{}", report::list(file)?);
        return Ok(Exit::Pass);
    }
    if let Some(s) = crate::campaigns::sweep::Summary::load_if_sweep(file)? {
        out!("{}", crate::campaigns::sweep::render(&s));
        return Ok(exits::of_sweep(&s));
    }
    let r = saved_report(file)?;
    out!("{}", report::render(&r, if markdown { Style::Markdown } else { Style::Terminal }));
    Ok(exits::of_verdict(r.verdict))
}

/// A saved report, with its kind of system's words when it was saved
/// before the report carried them.
fn saved_report(file: &Path) -> Result<Report> {
    let mut r = Report::load(file)?;
    crate::harness::run::shown_of_saved(&mut r);
    Ok(r)
}

/// `chaos report <file.json> --summary`: the lines `chaos run` printed at
/// the end of that run, drawn again from the saved report alone.
fn show_summary(file: &Path) -> Result<Exit> {
    let r = saved_report(file)?;
    let html = file.with_extension("html");
    out!("{}", report::summary::render(&r, &html.display().to_string(), report::summary::width()));
    Ok(exits::of_verdict(r.verdict))
}

/// `chaos report <file.json> --html [--out FILE]`: the page drawn again
/// from the saved report alone; prints the path written and exits with the
/// saved verdict's code, as the text rendering does.
fn html_report(file: &Path, out: Option<&Path>) -> Result<Exit> {
    if file.is_dir() {
        return Err(Error::Usage(format!(
            "--html draws one report: pass a report file such as {}/<run-id>.json",
            file.display()
        )));
    }
    if crate::campaigns::sweep::Summary::load_if_sweep(file)?.is_some() {
        return Err(Error::Usage(format!(
            "{} is a sweep's summary, which has no page: draw one of its runs' reports (each row's run_id) with --html",
            file.display()
        )));
    }
    let r = saved_report(file)?;
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => file.with_file_name(format!("{}.html", r.run_id)),
    };
    crate::report::html::write(&r, &path)?;
    outln!("{}", path.display());
    Ok(exits::of_verdict(r.verdict))
}

async fn bench(a: BenchArgs) -> Result<Exit> {
    let opts = crate::campaigns::bench::Options {
        scenario: a.scenario,
        payments: a.payments,
        database_url: a.infra.database_url,
        brokers: a.infra.brokers,
        reports_dir: a.reports_dir,
        pgbench_clients: a.pgbench_clients,
        pgbench_seconds: a.pgbench_seconds,
        runs: a.runs,
        warmup: a.warmup,
        processes: a.processes,
        proxy: a.proxy,
        emails_off: a.emails_off,
        max_rss_mb: a.max_rss_mb.map(|m| m as f64),
    };
    let (figures, _) = crate::campaigns::bench::bench(&opts, &reporters::Campaign::new()).await?;
    let (table, exit) = (crate::campaigns::bench::render(&figures), exits::of_bench(&figures, !a.no_targets));
    if a.json {
        print_json(&figures)?;
    } else {
        out!("{table}");
    }
    Ok(exit)
}

async fn clean(a: CleanArgs) -> Result<Exit> {
    let c = crate::commands::clean::clean(
        a.older_than,
        a.infra.database_url.as_deref(),
        a.infra.brokers.as_deref(),
        &a.reports_dir,
        a.dry_run,
        a.reports,
    )
    .await?;
    let verb = if a.dry_run { "would remove" } else { "removed" };
    outln!(
        "{verb}: {} schemas, {} replication slots and publications, {} topics, {} consumer groups, {} files",
        c.schemas.len(),
        c.replication.len(),
        c.topics.len(),
        c.groups.len(),
        c.files.len()
    );
    for n in c.schemas.iter().chain(&c.replication).chain(&c.topics).chain(&c.groups).chain(&c.files) {
        outln!("  {n}");
    }
    Ok(Exit::Pass)
}

async fn selftest(a: SelftestArgs) -> Result<Exit> {
    let opts = crate::campaigns::selftest::Options {
        database_url: a.infra.database_url,
        brokers: a.infra.brokers,
        reports_dir: a.reports_dir,
        seed: a.seed,
        clean_seeds: a.clean_seeds,
        only: a.only,
        variants: !a.no_variants,
        components: a.components,
        jobs: a.jobs,
    };
    let summary = crate::campaigns::selftest::selftest(&opts, &reporters::Campaign::new()).await?;
    if let Some(path) = &a.junit {
        crate::report::junit::write(&crate::campaigns::junit::for_selftest(&summary, &opts.reports_dir), path)?;
    }
    let (table, exit) = (crate::campaigns::selftest::render(&summary), exits::of_selftest(&summary));
    if a.json {
        print_json(&summary)?;
    } else {
        out!("{table}");
    }
    Ok(exit)
}

/// A sweep's summary (a whole one, a shard, or a merge): saved, as JUnit
/// when asked, printed as a table or JSON; its exit code.
fn show_sweep(
    summary: &crate::campaigns::sweep::Summary,
    reports_dir: &Path,
    junit: Option<&Path>,
    json: bool,
) -> Result<Exit> {
    let saved = summary.save(reports_dir)?;
    if let Some(path) = junit {
        crate::report::junit::write(&crate::campaigns::junit::for_sweep(summary), path)?;
    }
    if json {
        print_json(summary)?;
    } else {
        out!("{}", crate::campaigns::sweep::render(summary));
        outln!("summary: {} and {}", saved.display(), saved.with_extension("html").display());
    }
    Ok(exits::of_sweep(summary))
}

/// `chaos merge`: the shards' summaries as one sweep.
fn merge(a: MergeArgs) -> Result<Exit> {
    let mut parts = Vec::new();
    for path in &shard_files(&a.summaries)? {
        match crate::campaigns::sweep::Summary::load_if_sweep(path)? {
            Some(s) => parts.push(s),
            None => {
                return Err(Error::ReportRead {
                    path: path.clone(),
                    cause: "not a sweep's summary (reports/sweep-<id>.json)".into(),
                })
            }
        }
    }
    let summary = crate::campaigns::sweep::merge(parts)?;
    let exit = show_sweep(&summary, &a.reports_dir, a.junit.as_deref(), a.json)?;
    // A shard that never arrived is seeds never run: the gate cannot judge
    // them, and says so, unless the user asked for the shards given alone.
    if summary.missing_shards.is_empty() || a.allow_partial {
        return Ok(exit);
    }
    let count = summary.merged.len() + summary.missing_shards.len();
    let missing: Vec<String> = summary.missing_shards.iter().map(|k| format!("{k}/{count}")).collect();
    let seeds = crate::campaigns::sweep::missing_seeds(&summary);
    eprintln!(
        "chaos merge: shard(s) {} not given, so seeds {} never ran: give every shard's summary, or --allow-partial to judge only the {} given (exit 5)",
        missing.join(", "),
        seeds,
        summary.merged.len()
    );
    Ok(match exit {
        Exit::Fail | Exit::Interrupted => exit,
        _ => Exit::Incomplete,
    })
}

/// The summaries `chaos merge` is given: each file, and the `sweep-*.json`
/// files of each folder, in name order.
fn shard_files(given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in given {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let read = std::fs::read_dir(path)
            .map_err(|e| Error::ReportRead { path: path.clone(), cause: format!("reading the folder: {e}") })?;
        let mut found: Vec<PathBuf> = read
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("sweep-") && name.ends_with(".json")
            })
            .collect();
        if found.is_empty() {
            return Err(Error::ReportRead {
                path: path.clone(),
                cause: "a folder with no sweep-*.json summary in it".into(),
            });
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

async fn sweep(a: SweepArgs) -> Result<Exit> {
    let opts = crate::campaigns::sweep::Options {
        run: RunOptions {
            scenario: a.scenario,
            seed: None,
            database_url: a.infra.database_url,
            brokers: a.infra.brokers,
            reports_dir: a.reports_dir.clone(),
            components: a.components,
            payments: a.changes.payments,
            faults: a.changes.faults,
            schedule: None,
            keep: false,
        },
        first_seed: a.first_seed,
        seeds: a.seeds,
        swarm: a.swarm,
        keep_going: a.keep_going,
        jobs: a.jobs,
        shrink: a.shrink.then_some(a.shrink_runs),
        shard: a.shard,
    };
    let summary = crate::campaigns::sweep::sweep(&opts, &reporters::Campaign::new()).await?;
    show_sweep(&summary, &a.reports_dir, a.junit.as_deref(), a.json)
}
