//! When the faults from outside strike: from the workload's start until
//! the drain ends. Stopping them also waits for the acts already under way
//! (PostgreSQL restarting, the broker down for its span), so that what the
//! harness reads next, the settle and the verifier, reads services that are
//! up. A `db.restart` that fired as the drain ended once left the settle
//! reading a server in recovery: an INCOMPLETE run the system had not
//! earned.

use std::sync::Arc;
use tokio::sync::{watch, OwnedRwLockReadGuard, RwLock};

/// The switch the harness turns; the nemesis watches it.
pub struct Acting {
    on: watch::Sender<bool>,
    /// Held for reading by each act under way, for writing by `stop`.
    acts: Arc<RwLock<()>>,
}

impl Default for Acting {
    fn default() -> Self {
        Acting { on: watch::channel(false).0, acts: Arc::new(RwLock::new(())) }
    }
}

impl Acting {
    /// The faults strike from now on.
    pub fn begin(&self) {
        let _ = self.on.send(true);
    }

    /// No fault strikes from now on, and the acts under way have ended.
    pub async fn stop(&self) {
        let _ = self.on.send(false);
        drop(self.acts.write().await);
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.on.subscribe()
    }

    /// What a nemesis that acts for a while (a service fault) watches.
    pub fn watch(&self) -> Watch {
        Watch { on: self.on.subscribe(), acts: self.acts.clone() }
    }
}

#[derive(Clone)]
pub struct Watch {
    pub on: watch::Receiver<bool>,
    acts: Arc<RwLock<()>>,
}

impl Watch {
    /// Leave to act, held until the act has ended, or `None` once the
    /// faults have stopped. Taken before `on` is read, so that `stop`
    /// either waits for the act or the act sees the faults stopped.
    pub async fn act(&self) -> Option<OwnedRwLockReadGuard<()>> {
        let guard = self.acts.clone().read_owned().await;
        (*self.on.borrow()).then_some(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn stop_waits_for_an_act_under_way_and_no_act_begins_after_it() {
        let acting = Acting::default();
        let w = acting.watch();
        assert!(w.act().await.is_none(), "no act before the faults begin");
        acting.begin();
        let guard = w.act().await.expect("leave to act while acting");
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = released.clone();
        let act = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            r.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(guard);
        });
        acting.stop().await;
        assert!(released.load(std::sync::atomic::Ordering::SeqCst), "stop returned while an act was under way");
        assert!(w.act().await.is_none(), "an act began after stop");
        act.await.unwrap();
    }
}
