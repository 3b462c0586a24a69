-- Every effect names the event that caused it, so the verifier can trace it
-- back to the outbox: a receipt already carries `receipts.message_id`; the
-- projection and the loyalty counter get theirs here.

-- The event that set the projection's current status. The verifier checks
-- that it is an event of this payment whose type gives this status.
ALTER TABLE payment_projection ADD COLUMN event_id uuid;

-- One row per loyalty credit, written in the same transaction as the
-- counter's increment. The counter is what a service reads; this is its
-- audit trail. Deliberately NO unique constraint on event_id: a credit
-- applied twice must stay visible, as a receipt sent twice does.
CREATE TABLE loyalty_credits (
    event_id   uuid    NOT NULL,
    account_id integer NOT NULL,
    points     bigint  NOT NULL
);
