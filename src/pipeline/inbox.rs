//! The notifier's inbox: how one micro-batch claims its messages and
//! applies their effects, in the correct shape and in each classic
//! mistake's, and the pure core that decides what a batch applies.
//!
//! The strategies, one per [`InboxMode`] family:
//! - [`single_transaction`]: the correct inbox (`on`), and the mistakes that
//!   keep its one transaction but break its key: `off` (no claim at all),
//!   `consumer-made-id` (a key made up on receipt), `message-id-only` (one
//!   key for every handler), `commit-offset-first` (the notifier commits
//!   the offsets before calling this);
//! - [`separate_transactions`]: the claim commits, then the effects do;
//! - [`check_then_act`]: SELECT, act, then INSERT, with no unique key.
//!
//! Where the fault decided for a batch strikes is part of each strategy: a
//! crash between the claim and the effects (`notifier.mid_batch`), a stall
//! while holding the batch (`notifier.stall`).

use crate::domain::events::ReceiptEmail;
use crate::domain::events::{Decoded, EventKind};
use crate::domain::handlers::Handler;
use crate::error::{Error, Result};
use crate::faults::{FaultInjector, FaultPoint, Reach};
use crate::provider::client::{EmailClient, EmailError};
use crate::scenario::{EmailMode, InboxMode};
use crate::store::{
    BatchFaults, BatchOutcome, EffectPlan, Incoming, Modes, Store, HANDLER_LOYALTY, HANDLER_PROJECTION,
    HANDLER_RECEIPTS,
};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

/// One notifier micro-batch: inbox claims, effects for what was claimed,
/// dead letters, in the shape the notifier's inbox mode prescribes (the
/// correct one: a single transaction). The caller commits offsets only
/// after this returns Ok and not crashed, except in the
/// commit-offset-first variant, which commits them before.
pub async fn apply_batch(
    store: &Store,
    batch: &[Incoming],
    modes: Modes,
    faults: BatchFaults,
    injector: &FaultInjector,
    email: Option<&EmailClient>,
    who: &str,
) -> Result<BatchOutcome> {
    let bad: Vec<&Incoming> = batch.iter().filter(|m| m.decoded.is_err()).collect();
    let mut events: Vec<Decoded> = batch.iter().filter_map(|m| m.decoded.as_ref().ok().cloned()).collect();
    if modes.inbox == InboxMode::ConsumerMadeId {
        // The mistake: a dedup key made up on receipt, so a redelivered
        // message looks new every time.
        for e in &mut events {
            e.event_id = Uuid::new_v4();
        }
    }
    let refs: Vec<&Decoded> = events.iter().collect();
    let pairs = match modes.inbox {
        // The mistake: one claim per message, whatever the handlers. The
        // first handler's claim is the only one; the others find the message
        // taken and skip it.
        InboxMode::MessageIdOnly => refs.iter().map(|e| (e.event_id, HANDLER_PROJECTION)).collect(),
        _ => claims(&refs),
    };
    let reach = || Reach::topic(batch.iter().map(|m| m.position));
    let b = Batch { store, refs: &refs, bad: &bad, pairs: &pairs, modes, faults, injector, email, who, reach: &reach };
    match modes.inbox {
        InboxMode::On
        | InboxMode::CommitOffsetFirst
        | InboxMode::ConsumerMadeId
        | InboxMode::MessageIdOnly
        | InboxMode::ReapplyOnCommitError
        | InboxMode::Off => single_transaction(b).await,
        InboxMode::SeparateTransactions => separate_transactions(b).await,
        InboxMode::CheckThenAct => check_then_act(b).await,
    }
}

/// A batch as the strategies see it.
struct Batch<'a> {
    store: &'a Store,
    refs: &'a [&'a Decoded],
    bad: &'a [&'a Incoming],
    pairs: &'a [(Uuid, &'static str)],
    modes: Modes,
    faults: BatchFaults,
    /// Where a crash or a stall point asks to be struck in a component
    /// process.
    injector: &'a FaultInjector,
    /// The email provider's client, when receipts go out as emails.
    email: Option<&'a EmailClient>,
    /// The notifier instance, for the fault log.
    who: &'a str,
    /// The batch's topic positions, for the fault log.
    reach: &'a (dyn Fn() -> Reach + Sync),
}

/// Each receipt of `plan` as an email, inside the receipt's transaction and
/// before its commit: an error or a timeout fails the batch, which rolls
/// back and comes again, and the retry carries the same idempotency key, so
/// the provider sends each receipt once however often it is asked.
/// Committing first and calling after would lose the email to a crash in
/// between; calling first is safe only because of the key.
async fn send_receipts(b: &Batch<'_>, receipts: &[(Uuid, Uuid)]) -> Result<u64> {
    let Some(client) = b.email else { return Ok(0) };
    if matches!(b.modes.email, EmailMode::Off | EmailMode::AfterCommit) {
        return Ok(0);
    }
    let emails = receipt_emails(b, receipts);
    let calls = emails.len() as u64;
    // A batch's emails are independent: pipelined, shared evenly over a few
    // connections at once, so a batch of hundreds waits for one round trip
    // per connection, not hundreds, and the provider's cores all serve it.
    // A batch of 200 in chunks of 32, four at a time, waited for two rounds.
    let per_connection = emails.len().div_ceil(CONNECTIONS_AT_ONCE).clamp(1, MAX_EMAILS_PER_CONNECTION);
    for group in emails.chunks(per_connection * CONNECTIONS_AT_ONCE) {
        let sent = futures::future::join_all(group.chunks(per_connection).map(|c| send_chunk(client, c))).await;
        for (outcome, body) in sent.into_iter().flatten() {
            match outcome {
                Ok(_) => {}
                // The mistake: a refusal read as a success.
                Err(EmailError::Status(503, _)) if b.modes.email == EmailMode::ErrorAsSuccess => {}
                Err(err) => {
                    return Err(Error::Provider(format!(
                        "sending the receipt email of payment {}: {err}; the batch rolls back",
                        body.payment_id
                    )));
                }
            }
        }
    }
    Ok(calls)
}

/// One connection's share of a batch's emails, each outcome with its body.
async fn send_chunk<'a>(
    client: &EmailClient,
    chunk: &'a [(Option<String>, ReceiptEmail)],
) -> Vec<(std::result::Result<crate::provider::client::EmailSent, EmailError>, &'a ReceiptEmail)> {
    let refs: Vec<_> = chunk.iter().map(|(key, body)| (key.as_deref(), body)).collect();
    client.send_all(&refs).await.into_iter().zip(chunk.iter().map(|(_, body)| body)).collect()
}

/// How many connections a batch's emails are shared over at once, and how
/// many emails at most go out pipelined on one (a batch larger than their
/// product waits for more than one round).
const CONNECTIONS_AT_ONCE: usize = 4;
const MAX_EMAILS_PER_CONNECTION: usize = 64;

/// Each receipt's email: its idempotency key, as the notifier's email mode
/// makes it, and its body.
fn receipt_emails(b: &Batch<'_>, receipts: &[(Uuid, Uuid)]) -> Vec<(Option<String>, ReceiptEmail)> {
    let mut out = Vec::new();
    for (payment, message) in receipts {
        let Some(e) = b.refs.iter().find(|e| e.event_id == *message) else { continue };
        let body = ReceiptEmail::of(*payment, *message, &e.body);
        let key = match b.modes.email {
            // The message id and the handler: the receipt's inbox claim,
            // which is what makes it one effect.
            EmailMode::Keyed | EmailMode::AfterCommit | EmailMode::ErrorAsSuccess => {
                Some(format!("{message}:{HANDLER_RECEIPTS}"))
            }
            // The mistake: a key, but not one a retry would carry again.
            EmailMode::KeyPerAttempt => Some(Uuid::new_v4().to_string()),
            // The mistake: nothing lets the provider tell a retry.
            EmailMode::NoKey | EmailMode::Off => None,
        };
        out.push((key, body));
    }
    out
}

/// `notifier.after_external_call`: the provider answered and the
/// transaction is still open. In a component process, stop here for the
/// harness's SIGKILL.
async fn crash_after_call(b: &Batch<'_>, calls: u64) -> bool {
    let what = || format!("{calls} receipt email(s) sent, the transaction open");
    if calls == 0 || !b.injector.strike_reaching(FaultPoint::NotifierAfterExternalCall, b.who, what, b.reach) {
        return false;
    }
    b.injector.halt(FaultPoint::NotifierAfterExternalCall).await;
    true
}

/// `notifier.stall` while holding the batch: in a component process the
/// harness stops the process (SIGSTOP) and resumes it; in process, a sleep.
async fn stall(injector: &FaultInjector, d: Option<Duration>) {
    if let Some(d) = d {
        if !injector.stall(FaultPoint::NotifierStall, d).await {
            tokio::time::sleep(d).await;
        }
    }
}

/// `notifier.mid_batch`: in a component process, stop here for the
/// harness's SIGKILL, the transaction still open.
async fn halt_mid_batch(injector: &FaultInjector) {
    injector.halt(FaultPoint::NotifierMidBatch).await;
}

/// The inbox claim and the effects in one transaction: a crash between
/// them loses both, so the redelivery finds nothing claimed.
async fn single_transaction(b: Batch<'_>) -> Result<BatchOutcome> {
    let mut out = BatchOutcome::default();
    let mut tx = b.store.begin().await?;
    out.dead_lettered = tx.dead_letters(b.bad).await?;
    let claimed = if b.modes.inbox == InboxMode::Off { HashSet::new() } else { tx.claim(b.pairs).await? };
    if b.faults.crash_mid_batch {
        halt_mid_batch(b.injector).await;
        // The process dies with its transaction open: nothing commits.
        drop(tx);
        out.crashed = true;
        return Ok(out);
    }
    stall(b.injector, b.faults.stall).await;
    let plan = plan_effects(b.refs, b.modes.inbox, &claimed);
    // The receipts' emails go out while the effects are written: both
    // before the commit, which is all their order needs (a failure of
    // either rolls the batch back, and the retry's keys absorb the emails
    // that went out). One after the other, a batch waited for both.
    let (stale, calls) = tokio::join!(tx.apply(&plan, b.modes.projection), send_receipts(&b, &plan.receipts));
    out.stale = stale?;
    let calls = calls?;
    if crash_after_call(&b, calls).await {
        // The emails went out; the receipts roll back with the process.
        drop(tx);
        (out.crashed, out.crashed_after_call) = (true, true);
        return Ok(out);
    }
    match tx.commit().await {
        Ok(()) => {}
        Err(e) if b.modes.inbox == InboxMode::ReapplyOnCommitError => {
            // The mistake: a failed COMMIT taken for "nothing happened".
            // The claim is assumed rolled back, so the effects go again on
            // their own; when the COMMIT did land, they land twice.
            tracing::warn!(cause = %e, "the batch's COMMIT failed; applying its effects again");
            let mut again = b.store.begin().await?;
            out.stale = again.apply(&plan, b.modes.projection).await?;
            again.commit().await?;
        }
        Err(e) => return Err(e),
    }
    (out.applied, out.duplicates) = (plan.applied, plan.duplicates);
    if b.email.is_some() && b.modes.email == EmailMode::AfterCommit {
        out.emails_after_commit = receipt_emails(&b, &plan.receipts);
    }
    Ok(out)
}

/// The mistake: the claim commits in its own transaction, the effects in
/// another. A crash between them leaves messages "processed" with no effect.
async fn separate_transactions(b: Batch<'_>) -> Result<BatchOutcome> {
    let mut out = BatchOutcome::default();
    let mut tx = b.store.begin().await?;
    out.dead_lettered = tx.dead_letters(b.bad).await?;
    let claimed = tx.claim(b.pairs).await?;
    tx.commit().await?;
    if b.faults.crash_mid_batch {
        halt_mid_batch(b.injector).await;
        // The inbox says "processed"; the effects never happen.
        out.crashed = true;
        return Ok(out);
    }
    stall(b.injector, b.faults.stall).await;
    apply_alone(&b, &claimed, &[], &mut out).await?;
    Ok(out)
}

/// The mistake: SELECT the unkeyed inbox, act, then INSERT. Two notifiers
/// that both saw "absent" both act.
async fn check_then_act(b: Batch<'_>) -> Result<BatchOutcome> {
    let mut out = BatchOutcome::default();
    let seen = b.store.unkeyed_seen(b.pairs).await?;
    let claimed: HashSet<(Uuid, &str)> = b.pairs.iter().copied().filter(|p| !seen.contains(p)).collect();
    if b.faults.crash_mid_batch {
        halt_mid_batch(b.injector).await;
        out.crashed = true;
        return Ok(out);
    }
    // A stall here, between the check and the act, is what lets a second
    // notifier see "absent" too.
    stall(b.injector, b.faults.stall).await;
    apply_alone(&b, &claimed, b.bad, &mut out).await?;
    let acted: Vec<(Uuid, &'static str)> = b.pairs.iter().copied().filter(|p| claimed.contains(p)).collect();
    b.store.unkeyed_record(&acted).await?;
    Ok(out)
}

/// The effects in a transaction of their own, for the variants that split
/// them from the inbox claim.
async fn apply_alone(
    b: &Batch<'_>,
    claimed: &HashSet<(Uuid, &str)>,
    bad: &[&Incoming],
    out: &mut BatchOutcome,
) -> Result<()> {
    let plan = plan_effects(b.refs, b.modes.inbox, claimed);
    let mut tx = b.store.begin().await?;
    out.dead_lettered += tx.dead_letters(bad).await?;
    out.stale = tx.apply(&plan, b.modes.projection).await?;
    send_receipts(b, &plan.receipts).await?;
    tx.commit().await?;
    (out.applied, out.duplicates) = (plan.applied, plan.duplicates);
    Ok(())
}

/// Which handlers the reference notifier routes an event type to: the
/// system under test's own table. The verifier holds its own
/// ([`crate::verifier`]'s specification), and a unit test keeps the two
/// equal, so a change here that the specification does not share fails.
pub fn routes(kind: EventKind) -> &'static [Handler] {
    match kind {
        EventKind::Authorized => &[Handler::Projection],
        EventKind::Captured => &[Handler::Projection, Handler::Receipts, Handler::Loyalty],
    }
}

/// The (event, handler) pairs a batch must claim in the inbox.
pub fn claims(events: &[&Decoded]) -> Vec<(Uuid, &'static str)> {
    events.iter().flat_map(|e| routes(e.kind).iter().map(move |h| (e.event_id, h.as_str()))).collect()
}

/// Decides which effects a batch applies. With the inbox on, only the pairs
/// this transaction newly claimed, each once. With it off, everything, as
/// often as it arrived: that is the bug being demonstrated.
pub fn plan_effects<'a>(events: &[&'a Decoded], mode: InboxMode, claimed: &HashSet<(Uuid, &str)>) -> EffectPlan<'a> {
    let mut plan = EffectPlan::default();
    let mut applied_once: HashSet<(Uuid, &str)> = HashSet::new();
    let mut may_apply = |id: Uuid, h: &'static str| -> bool {
        match mode {
            InboxMode::Off => true,
            _ => claimed.contains(&(id, h)) && applied_once.insert((id, h)),
        }
    };
    for e in events {
        let mut any = false;
        if may_apply(e.event_id, HANDLER_PROJECTION) {
            any = true;
            plan.projection.push(e);
        }
        if e.kind == EventKind::Captured {
            if may_apply(e.event_id, HANDLER_RECEIPTS) {
                any = true;
                plan.receipts.push((e.body.payment_id, e.event_id));
            }
            if may_apply(e.event_id, HANDLER_LOYALTY) {
                any = true;
                *plan.loyalty.entry((e.body.account_id, e.lane)).or_default() += e.body.amount_cents;
                plan.credits.push((e.event_id, e.body.account_id, e.body.amount_cents));
            }
        }
        if any {
            plan.applied += 1;
        } else {
            plan.duplicates += 1;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_routing_is_the_verifiers_specification() {
        // The verifier judges against its own table; the pipeline must
        // route as it says, or the reference pipeline is the wrong one.
        for kind in [EventKind::Authorized, EventKind::Captured] {
            assert_eq!(routes(kind), crate::verifier::spec::handlers_fed_by(kind), "{kind:?}");
        }
    }
    use crate::store::effects::tests::event;

    #[test]
    fn claims_one_pair_per_handler_of_each_event() {
        let (a, c) = (event(1, EventKind::Authorized, 10), event(1, EventKind::Captured, 11));
        let pairs = claims(&[&a, &c]);
        assert_eq!(
            pairs,
            vec![
                (a.event_id, "projection"),
                (c.event_id, "projection"),
                (c.event_id, "receipts"),
                (c.event_id, "loyalty")
            ]
        );
    }

    #[test]
    fn with_the_inbox_only_newly_claimed_pairs_apply_each_once() {
        let c = event(1, EventKind::Captured, 11);
        // Claimed for two of its three handlers: the third was done before.
        let claimed: HashSet<(Uuid, &str)> = [(c.event_id, "projection"), (c.event_id, "receipts")].into();
        // The same message twice in one batch applies once.
        let plan = plan_effects(&[&c, &c], InboxMode::On, &claimed);
        assert_eq!(plan.projection.len(), 1);
        assert_eq!(plan.receipts, vec![(c.body.payment_id, c.event_id)]);
        assert!(plan.loyalty.is_empty() && plan.credits.is_empty());
        assert_eq!((plan.applied, plan.duplicates), (1, 1));
        // Nothing claimed: a pure duplicate.
        let none = plan_effects(&[&c], InboxMode::On, &HashSet::new());
        assert_eq!((none.applied, none.duplicates), (0, 1));
    }

    #[test]
    fn without_the_inbox_everything_applies_as_often_as_it_came() {
        let c = event(1, EventKind::Captured, 11);
        let plan = plan_effects(&[&c, &c], InboxMode::Off, &HashSet::new());
        assert_eq!(plan.receipts.len(), 2);
        assert_eq!(plan.credits.len(), 2);
        assert_eq!(plan.loyalty.get(&(3, 1)), Some(&500), "points per (account, stripe), summed");
    }
}
