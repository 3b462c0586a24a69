#!/usr/bin/env python3
"""BROKEN ON PURPOSE: commits the Kafka offsets BEFORE the database transaction.

"Commit first so a poison message can never block the partition" sounds
reasonable, and the batch's transaction is the correct one from consumer.py.
But a kill between the offset commit and the database commit loses the batch:
the group believes it was handled, nobody ever reads it again, and its
receipts, points and projection updates never happen. `chaos run
offset-first.toml` reports "missing effect" and exits 1.
"""
from consumer import batches, commit_offsets, handle_batch, setup


def main():
    consumer, conn, batch_size = setup()
    try:
        for msgs in batches(consumer, batch_size):
            commit_offsets(consumer)  # BUG: the offsets go first...
            handle_batch(conn, msgs)  # ...so a kill here loses the batch
    finally:
        consumer.close()
        conn.close()


if __name__ == "__main__":
    main()
