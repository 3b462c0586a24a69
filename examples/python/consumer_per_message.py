#!/usr/bin/env python3
"""A correct notifier that commits once per message, where consumer.py
commits once per batch.

Each message gets its own database transaction (inbox claim and effects
together) and then its own offset commit, in that order: what
docs/contract.md asks of any consumer, one message at a time. It meets ten
times as many commit windows as consumer.py does with batches of ten, and
a scenario whose aimed kills are read per second (`[nemesis] aimed =
"per-second"`) strikes it about as often. Expected verdict under
consumer-at-commit.toml: PASS, exit 0.
"""
from consumer import batches, commit_offsets, handle_batch, setup


def main():
    consumer, conn, _ = setup()
    try:
        for msgs in batches(consumer, 1):  # one message at a time
            handle_batch(conn, msgs)       # 1. its inbox claim and effects, one transaction
            commit_offsets(consumer)       # 2. only then its offset
    finally:
        consumer.close()
        conn.close()


if __name__ == "__main__":
    main()
