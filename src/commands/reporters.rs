//! How `chaos run` shows a run: the reporters of [`crate::harness::run::Event`]s.
//! Tables and JSON go to stdout; the progress line and logs to stderr.

use crate::error::Result;
use crate::report;
use crate::harness::run::{Event, Reporter};

/// The banner first, the tables at the end.
pub struct Terminal;

impl Reporter for Terminal {
    fn event(&self, event: &Event<'_>) -> Result<()> {
        match event {
            Event::Started { run_id, scenario, seed, infra } => {
                println!("chaos run {run_id} · scenario {scenario} · seed {seed}\ninfra: {infra}");
            }
            Event::Finished { report, json, md, html } => {
                print!("{}", report::render_body(report));
                println!("report: {}, {} and {}", json.display(), md.display(), html.display());
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
