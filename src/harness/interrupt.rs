//! Ctrl-C and SIGTERM, as the library sees them. The binary owns the
//! signals: it listens for them and delivers each one here ([`deliver`]);
//! every phase of a run (workload, drain, stop, verification) and every
//! component process waits on [`requested`]. The first signal asks the run
//! to stop and still write its report; a second one is the binary's to act
//! on (it exits at once with 130).

use std::sync::OnceLock;
use tokio::sync::watch;

fn signals() -> &'static watch::Sender<u32> {
    static SIGNALS: OnceLock<watch::Sender<u32>> = OnceLock::new();
    SIGNALS.get_or_init(|| watch::channel(0).0)
}

/// Records one signal; returns how many have arrived so far.
pub fn deliver() -> u32 {
    let tx = signals();
    tx.send_modify(|n| *n += 1);
    *tx.borrow()
}

/// Resolves once a signal has arrived (at once if one already has).
pub async fn requested() {
    let mut rx = signals().subscribe();
    let _ = rx.wait_for(|n| *n > 0).await;
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_delivered_signal_wakes_every_waiter_now_and_later() {
        let waiter = tokio::spawn(super::requested());
        assert_eq!(super::deliver(), 1);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter).await.unwrap().unwrap();
        // A phase that starts waiting after the signal is not left waiting.
        tokio::time::timeout(std::time::Duration::from_secs(1), super::requested()).await.unwrap();
        assert_eq!(super::deliver(), 2);
    }
}
