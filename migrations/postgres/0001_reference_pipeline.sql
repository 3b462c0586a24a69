-- The reference payments pipeline. Every run applies this in a schema of its
-- own (chaos_<run id>), so concurrent runs never see each other's rows.

-- The business rows the payment service writes. Status moves one way only:
-- authorized, then captured.
CREATE TABLE payments (
    id           uuid        PRIMARY KEY,
    -- Customer account; the loyalty counter is kept per account.
    account_id   integer     NOT NULL,
    -- Integer cents: money is never a float.
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    status       text        NOT NULL CHECK (status IN ('authorized', 'captured')),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The outbox: one row per event, written in the same transaction as the
-- payment change it announces.
CREATE TABLE outbox (
    -- The event id. It travels with the message (header `event_id`) and is
    -- the key the inbox deduplicates on.
    id           uuid        PRIMARY KEY,
    -- Commit-order-ish sequence, so relays publish oldest first.
    seq          bigserial   NOT NULL,
    -- The payment id; used as the message key so that all events of one
    -- payment land on one partition, in order.
    aggregate_id uuid        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    -- clock_timestamp(), not now(): the latency clock must not stop at the
    -- start of the transaction.
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL until a relay has the broker's ack and commits the mark.
    published_at timestamptz
);

-- Relays only ever look for unpublished rows; this index stays as small as
-- the backlog, however large the table grows.
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;
-- Retention purges published rows by age.
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- The inbox: one row per (message, handler) that has taken effect. The
-- primary key is the whole deduplication mechanism: INSERT … ON CONFLICT DO
-- NOTHING claims a message atomically, inside the effects' transaction.
CREATE TABLE inbox (
    message_id   uuid        NOT NULL,
    -- One message may feed several handlers; each claims it separately.
    handler      text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (message_id, handler)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- One row per receipt sent: the effect a customer would see twice.
-- Deliberately NO unique constraint on payment_id: a duplicate effect must
-- stay visible to the verifier instead of being hidden by the schema.
CREATE TABLE receipts (
    id          bigserial   PRIMARY KEY,
    payment_id  uuid        NOT NULL,
    -- The message that caused it, so an engineer can trace a duplicate.
    message_id  uuid        NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX receipts_payment ON receipts (payment_id);

-- The read model: each payment's latest status. State-based: it never goes
-- back from captured to authorized, so a replayed stale event is absorbed.
CREATE TABLE payment_projection (
    payment_id uuid        PRIMARY KEY,
    status     text        NOT NULL CHECK (status IN ('authorized', 'captured')),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A non-idempotent counter: loyalty points += amount on every capture. A row
-- count can hide a duplicate; a sum cannot.
-- Striped by the topic partition the capture was read from: a partition has
-- one notifier at a time, so notifiers never wait on each other's counter
-- rows (with one row per account, every notifier transaction queued behind
-- the others' commits). An account's points are the sum of its stripes.
CREATE TABLE loyalty_points (
    account_id integer NOT NULL,
    stripe     integer NOT NULL,
    points     bigint  NOT NULL,
    PRIMARY KEY (account_id, stripe)
);

-- Messages the notifier could not decode. Keyed by message id (or by
-- partition/offset when even that is unreadable) so a redelivered poison
-- message is recorded once.
CREATE TABLE dead_letters (
    message_id      text        PRIMARY KEY,
    topic_partition integer     NOT NULL,
    topic_offset    bigint      NOT NULL,
    payload         text        NOT NULL,
    error           text        NOT NULL,
    failed_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
