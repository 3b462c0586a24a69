//! How `chaos run` shows a run (the reporters of [`crate::harness::run::Event`]s)
//! and how the campaigns show their progress ([`crate::campaigns::Progress`]).
//! Tables and JSON go to stdout; the progress line and logs to stderr.

use crate::campaigns::{Listener, Progress};
use crate::error::Result;
use crate::harness::run::{Event, Reporter};
use crate::report;

/// The banner on stderr as the run starts; at the end, on stdout, the
/// summary that fits the terminal, or every table with `--tables`.
pub struct Terminal {
    pub tables: bool,
}

impl Reporter for Terminal {
    fn event(&self, event: &Event<'_>) -> Result<()> {
        match event {
            Event::Started { run_id, scenario, seed, infra } if self.tables => {
                let banner = format!("chaos run {run_id} · scenario {scenario} · seed {seed}\ninfra: {infra}\n");
                out!("{}", report::summary::wrap_text(&banner, report::summary::width()));
            }
            Event::Started { run_id, scenario, seed, infra } => {
                eprintln!("chaos run {run_id} · scenario {scenario} · seed {seed}\ninfra: {infra}");
            }
            Event::Finished { report, json, md, html } if self.tables => {
                let text = format!(
                    "{}report: {}, {} and {}\n",
                    report::render_body(report),
                    json.display(),
                    md.display(),
                    html.display()
                );
                out!("{}", report::summary::wrap_text(&text, report::summary::width()));
            }
            Event::Finished { report, html, .. } => {
                out!("{}", report::summary::render(report, &html.display().to_string(), report::summary::width()));
            }
        }
        Ok(())
    }
}

/// The JSON report only, at the end (`--json`).
pub struct Json;

impl Reporter for Json {
    fn event(&self, event: &Event<'_>) -> Result<()> {
        match event {
            Event::Started { .. } => Ok(()),
            Event::Finished { report, .. } => super::print_json(report),
        }
    }
}

/// How the campaigns (sweep, shrink, selftest, bench) show their progress
/// on stderr: a sweep's seeds as a progress bar on a terminal, each event
/// as a line otherwise (a CI log keeps one line per seed).
pub struct Campaign {
    bar: std::sync::Mutex<Option<indicatif::ProgressBar>>,
    on_terminal: bool,
}

impl Campaign {
    pub fn new() -> Self {
        use std::io::IsTerminal;
        Self { bar: std::sync::Mutex::new(None), on_terminal: std::io::stderr().is_terminal() }
    }

    /// A line above the bar when there is one, else on stderr.
    fn line(&self, text: String) {
        match self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Listener for Campaign {
    fn progress(&self, event: &Progress<'_>) {
        match event {
            Progress::SweepStarted { seeds } if self.on_terminal => {
                let bar = indicatif::ProgressBar::new(*seeds as u64);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} seeds · {msg}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.enable_steady_tick(std::time::Duration::from_millis(200));
                *self.bar.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar);
            }
            Progress::SweepStarted { .. } => {}
            Progress::SeedStarted { seed, tally } => {
                if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    bar.set_message(format!("seed {seed} · {tally}"));
                }
            }
            Progress::SeedFinished { seed, verdict, seconds, reason } => {
                self.line(format!("sweep: seed {seed} {} ({seconds:.1} s): {reason}", verdict.as_str()));
                if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    bar.inc(1);
                }
            }
            Progress::SweepFinished => {
                if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    bar.finish_and_clear();
                }
            }
            Progress::Replayed { run, budget, firings, payments, outcome } => self.line(format!(
                "shrink: replay {run} of at most {budget}: {firings} firing(s), {payments} payments: {outcome}"
            )),
            Progress::BenchStage { what } => self.line(format!("bench: {what}")),
            Progress::VariantLeftOut { name } => {
                self.line(format!("selftest: {name:<26} left out: its fault needs the fault proxy, so PostgreSQL"))
            }
            Progress::VariantRun { name, run, caught } => {
                self.line(format!("selftest: {name:<26} run {run} {}", if *caught { "caught" } else { "not caught" }))
            }
            Progress::CorrectRun { flavour, seed, verdict } => {
                self.line(format!("selftest: correct pipeline ({flavour}) seed {seed} verdict {}", verdict.as_str()))
            }
        }
    }
}
