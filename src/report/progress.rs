//! The live progress line on stderr: the run's phase, then the shared
//! counters. It only reads them (the run tells it the phase), and indicatif
//! hides it when stderr is not a terminal (CI logs stay clean).

use crate::context::Stats;
use crate::faults::FaultInjector;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Arc;
use std::time::Duration;

/// Where a run is, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The run's schema, topic and components being made.
    Setup,
    /// Waiting for the notifiers' group to hold every partition.
    Group,
    /// The payment service writing.
    Workload,
    /// Waiting for an empty outbox and zero group lag, then the stop.
    Drain,
    /// The verifier reading the database and the topic.
    Verify,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Group => "group",
            Phase::Workload => "workload",
            Phase::Drain => "drain",
            Phase::Verify => "verify",
        }
    }
}

pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub fn start(total: u64, stats: Arc<Stats>, faults: Arc<FaultInjector>, visible: bool) -> Self {
        let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {prefix:8} {bar:30} {pos}/{len} payments · {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(Phase::Setup.name());
        let b = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                b.set_position(Stats::get(&stats.payments_written));
                b.set_message(format!(
                    "{} published · {} processed · {} duplicates absorbed · {} faults fired",
                    Stats::get(&stats.messages_published),
                    Stats::get(&stats.events_applied),
                    Stats::get(&stats.duplicates_absorbed),
                    faults.total_fired()
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { bar, task }
    }

    /// The run moved on to `phase`.
    pub fn phase(&self, phase: Phase) {
        self.bar.set_prefix(phase.name());
    }

    /// Clears the line; dropping it does the same (a run that ends early,
    /// on an error, never leaves a line or its task behind).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
