//! The one path every component crash and restart takes. A component
//! incarnation (a relay's producer and connection, a notifier's consumer)
//! runs until it ends; its supervisor loop asks [`after`] what the ending
//! costs: it counts the crash or the error, logs the error, and says how
//! long to pause before the next incarnation, or that the run is stopping.

use crate::context::{Shutdown, RESTART_FLOOR};
use crate::faults::FaultPoint;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tracing::warn;

/// How an incarnation ended.
#[derive(Debug)]
pub enum Ending {
    /// The run is stopping.
    Shutdown,
    /// A fault point fired. `confirmed_by_restart` names it when the next
    /// incarnation starting is the effect that confirms it.
    Crash { confirmed_by_restart: Option<FaultPoint> },
    /// Start again at once, with nothing counted (a consumer the mock
    /// cluster never let join).
    Again,
    /// An error the component does not handle in place (a dead connection,
    /// a failed mark): logged, counted, and restarted after the floor.
    Error { what: &'static str, cause: String },
}

/// What a component's supervisor counts.
pub struct Counters<'a> {
    pub crashes: &'a AtomicU64,
    pub errors: &'a AtomicU64,
}

/// Counts `ending` and pauses before the next incarnation: the scenario's
/// `restart_delay` after a fault, at least [`RESTART_FLOOR`] after an error.
/// Returns false when the run is stopping (no next incarnation).
pub async fn after(
    ending: Ending,
    component: &str,
    counters: Counters<'_>,
    restart_delay: Duration,
    shutdown: &mut Shutdown,
) -> bool {
    let pause = match ending {
        Ending::Shutdown => return false,
        Ending::Again => return !shutdown.is_set(),
        Ending::Crash { .. } => {
            crate::context::Stats::add(counters.crashes, 1);
            restart_delay
        }
        Ending::Error { what, cause } => {
            warn!(%component, %cause, "{what} failed; restarting");
            crate::context::Stats::add(counters.errors, 1);
            restart_delay.max(RESTART_FLOOR)
        }
    };
    !shutdown.sleep(pause).await
}
