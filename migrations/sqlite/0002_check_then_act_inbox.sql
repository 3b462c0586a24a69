-- The inbox of the `check-then-act` variant (a classic mistake, kept for
-- `chaos selftest`). Deliberately NO primary key and no unique constraint.
CREATE TABLE inbox_unkeyed (
    message_id   BLOB    NOT NULL,
    handler      TEXT    NOT NULL,
    processed_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);
