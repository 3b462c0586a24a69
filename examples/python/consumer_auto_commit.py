#!/usr/bin/env python3
"""BROKEN ON PURPOSE: lets the client commit the offsets (`enable.auto.commit`).

The batch's transaction is the correct one from consumer.py, and the code
never commits an offset by hand, so it reads as safe; it is the client's
default. But the client stores each message's offset as `consume()` hands it
over and commits the stored offsets from a background thread every
`auto.commit.interval.ms`, whatever the application has done with them. A
kill after such a commit and before the batch's database commit loses the
batch: the group has moved past it. `chaos run auto-commit.toml` reports
"missing effect" and exits 1.
"""
from consumer import batches, handle_batch, setup


def main():
    # BUG: the offsets of a batch are committed in the background while the
    # batch is still being handled.
    consumer, conn, batch_size = setup(**{"enable.auto.commit": True})
    try:
        for msgs in batches(consumer, batch_size):
            handle_batch(conn, msgs)  # no commit_offsets(): the client does it
    finally:
        consumer.close()
        conn.close()


if __name__ == "__main__":
    main()
