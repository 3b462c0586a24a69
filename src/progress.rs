//! The live progress line on stderr. It only reads the shared counters, and
//! indicatif hides it when stderr is not a terminal (CI logs stay clean).

use crate::context::Stats;
use crate::faults::FaultInjector;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Arc;
use std::time::Duration;

pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub fn start(total: u64, stats: Arc<Stats>, faults: Arc<FaultInjector>, visible: bool) -> Self {
        let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} payments · {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
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

    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
