//! `process.kill_per_message`: kills paced by the topic's growth.

use super::*;

/// How often the topic's size is read for `process.kill_per_message`.
pub(super) const GROWTH_POLL: Duration = Duration::from_millis(50);

/// A slot's kill channel (the per-message nemesis and the fault proxy send
/// the kills they claimed), and its occupant, on which a kill is claimed.
pub(super) type KillLine = (String, tokio::sync::mpsc::UnboundedSender<Struck>, Arc<Occupant>);

/// `process.kill_per_message`: while the nemesis acts, each message the
/// topic gains is an occurrence for one slot, picked from the seed; a
/// firing kills that slot's process. A message whose slot has no process
/// (between incarnations) or already has a kill on its way is not an
/// occurrence: the topic grows in bursts between two reads, and one burst
/// would otherwise kill each new process before it starts.
pub(super) async fn by_messages(ctx: Ctx, mut acting: watch::Receiver<bool>, kills: Vec<KillLine>) {
    let (grew, mut growth) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = ctx.shutdown.clone();
    let sc = &ctx.scenario;
    let watch = crate::broker::watch_topic_growth(
        ctx.broker.clone(),
        ctx.topic(),
        GROWTH_POLL,
        move || shutdown.is_set(),
        grew,
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(sc.seed ^ 0x6b69_6c6c);
    let mut shutdown = ctx.shutdown.clone();
    let mut total = 0u64;
    loop {
        let n = tokio::select! {
            n = growth.recv() => match n { Some(n) => n, None => break },
            _ = shutdown.wait() => break,
        };
        let before = total;
        total += n;
        if !*acting.borrow_and_update() || kills.is_empty() {
            continue;
        }
        for m in before..total {
            let (name, kill, occupant) = &kills[rng.gen_range(0..kills.len())];
            let hit = || format!("the topic's message {}", m + 1);
            if let Some(claim) = occupant.claim(|| ctx.faults.strike(FaultPoint::ProcessKillPerMessage, name, hit)) {
                // The keeper sends it, once its process is ready.
                let _ = kill.send((FaultPoint::ProcessKillPerMessage, claim.serial(), Some(claim)));
            }
        }
    }
    let _ = watch.await;
}
