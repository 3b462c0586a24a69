-- The inbox of the `check-then-act` variant (a classic mistake, kept for
-- `chaos selftest`): the notifier SELECTs here, processes, then INSERTs.
-- Deliberately NO primary key and no unique constraint: nothing stops two
-- notifiers that both saw "absent" from both processing the message.
CREATE TABLE inbox_unkeyed (
    message_id   uuid        NOT NULL,
    handler      text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
