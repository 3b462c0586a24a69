//! The names of every violation the verifier can find. They are shared
//! words: a scenario lists the anomalies it allows, the self-test the one
//! each classic mistake must cause.

choices! {
    /// Every violation the verifier can name.
    AnomalyKind {
        /// The workload committed fewer payments than the scenario asks
        /// for, or a committed payment has no row.
        LostPayment = "lost payment",
        /// A payment row the workload never committed.
        PhantomPayment = "phantom payment",
        /// A payment row that differs from what was committed.
        PaymentMismatch = "payment mismatch",
        /// A payment's outbox events are not exactly the ones committed.
        OutboxMismatch = "outbox mismatch",
        /// An event that never reached the topic.
        LostEvent = "lost event",
        /// A message on the topic that is no outbox event.
        ForeignEvent = "foreign event",
        /// A message whose key, type or payload differ from its outbox row.
        /// A JSON payload counts by value: re-serialised with other key
        /// order or spacing it is the same; a changed value is not.
        MessageMismatch = "message mismatch",
        /// The payments pipeline's former name for a split key, which no
        /// check finds now: a scenario that allows it allows `split key`.
        SplitPayment = "split payment",
        /// An outbox row still unpublished after the drain.
        UnpublishedLeftover = "unpublished leftover",
        /// An effect applied more than once.
        DuplicateEffect = "duplicate effect",
        /// An effect never applied.
        MissingEffect = "missing effect",
        /// An effect whose cause is not the event that should cause it.
        MisattributedEffect = "misattributed effect",
        /// The projection does not show the payment's final status.
        StaleProjection = "stale projection",
        /// Inbox rows per handler differ from the distinct events it handles.
        InboxMismatch = "inbox mismatch",
        /// Dead letters differ from the malformed events.
        DeadLetterMismatch = "dead letter mismatch",
        /// A non-idempotent counter that does not add up.
        CounterDrift = "counter drift",
        /// More than one email sent for one payment, by the provider's record.
        DuplicateExternalEffect = "duplicate external effect",
        /// A captured payment for which the provider sent no email.
        MissingExternalEffect = "missing external effect",
        /// An email not caused by its payment's captured event, or one that
        /// disagrees with the receipt rows (an email without its row, a row
        /// without its email).
        MisattributedExternalEffect = "misattributed external effect",
        /// A declared system's acknowledged operation that produced none
        /// of its events.
        LostOperation = "lost operation",
        /// Events for a key the workload never asked for, or whose
        /// request the service refused.
        PhantomOperation = "phantom operation",
        /// One key's messages on more than one partition (for the payments
        /// pipeline, one payment's: its key is its id).
        SplitKey = "split key",
        /// A declared check (`[[system.checks]]`) returned rows.
        FailedCheck = "failed check",
        /// A declared system's pending work (`[system] pending`) still there
        /// when the settle ran out: accepted, never applied. Late is not
        /// lost: its keys are left out of the missing effects.
        StalledConsumer = "stalled consumer",
        /// A declared system's outbox rows still unpublished when the drain
        /// ran out, and again once the faults had stopped and its relays
        /// had one more drain timeout: written, never published. Late is
        /// not lost: their keys are left out of the missing effects.
        StalledRelay = "stalled relay",
        /// An idempotency key sent again with a different body: the provider
        /// refused it, so that request's email was never sent.
        IdempotencyKeyReused = "idempotency key reused",
    }
}
