-- The reference payments pipeline for the embedded mode: one SQLite file per
-- run. Same tables and the same meaning as migrations/postgres/; only the
-- types differ. uuids are 16-byte BLOBs; times are milliseconds since the
-- epoch (SQLite has no timestamp type).

CREATE TABLE payments (
    id           BLOB    PRIMARY KEY,
    account_id   INTEGER NOT NULL,
    -- Integer cents: money is never a float.
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    status       TEXT    NOT NULL CHECK (status IN ('authorized', 'captured')),
    created_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    updated_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);

-- The outbox. `seq` is the rowid, so relays publish oldest first; `id` is the
-- event id that travels with the message and that the inbox deduplicates on.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           BLOB    NOT NULL UNIQUE,
    -- The payment id, used as the message key.
    aggregate_id BLOB    NOT NULL,
    event_type   TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    created_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    -- NULL until a relay has the broker's ack and commits the mark.
    published_at INTEGER,
    -- The relay lease (SQLite has no SKIP LOCKED): which relay incarnation
    -- holds the row, and until when. An expired lease is free to claim, so
    -- a crashed relay's rows come back without anyone cleaning up.
    lease_owner  TEXT,
    lease_until  INTEGER
);
-- Relays only look for unpublished rows; the partial index stays as small as the backlog.
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- One row per (message, handler) that has taken effect; the primary key is
-- the whole deduplication mechanism (INSERT … ON CONFLICT DO NOTHING).
CREATE TABLE inbox (
    message_id   BLOB    NOT NULL,
    handler      TEXT    NOT NULL,
    processed_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    PRIMARY KEY (message_id, handler)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- One row per receipt sent. Deliberately NO unique constraint on payment_id:
-- a duplicate effect must stay visible to the verifier.
CREATE TABLE receipts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id BLOB    NOT NULL,
    message_id BLOB    NOT NULL,
    sent_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);
CREATE INDEX receipts_payment ON receipts (payment_id);

-- The read model; state-based, never back from captured to authorized.
CREATE TABLE payment_projection (
    payment_id BLOB    PRIMARY KEY,
    status     TEXT    NOT NULL CHECK (status IN ('authorized', 'captured')),
    updated_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);

-- The non-idempotent counter: points += amount on every capture, striped by
-- topic partition as in PostgreSQL; an account's points are its stripes' sum.
CREATE TABLE loyalty_points (
    account_id INTEGER NOT NULL,
    stripe     INTEGER NOT NULL,
    points     INTEGER NOT NULL,
    PRIMARY KEY (account_id, stripe)
);

-- Messages the notifier could not decode, recorded once per message.
CREATE TABLE dead_letters (
    message_id      TEXT    PRIMARY KEY,
    topic_partition INTEGER NOT NULL,
    topic_offset    INTEGER NOT NULL,
    payload         TEXT    NOT NULL,
    error           TEXT    NOT NULL,
    failed_at       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);
