#!/usr/bin/env python3
"""BROKEN ON PURPOSE: a last-write-wins projection.

Everything else is consumer.py: one transaction claims the batch in the
inbox and applies the effects of what it claimed, and the offsets are
committed after it. Receipts and loyalty points stay exactly once. But the
projection simply overwrites the payment's status with the event it handled
last, as if the topic delivered a payment's events in the order they
happened. It does not: when one relay holds its batch while another
publishes the next one, a payment's `payment.captured` can reach the topic
before its `payment.authorized` (docs/contract.md section 3: "old events
after new ones"). The inbox has not seen that `authorized` yet, so it is
claimed and applied, and the payment goes back from `captured` to
`authorized` for good. The classic mistake: a projection that follows
delivery order instead of the state machine's (seed 002's projection never
goes back; this one does). `chaos run last-write-wins.toml` reports
"stale projection" and exits 1.
"""
import consumer

_apply = consumer.apply


def apply(cur, event, handler):
    if handler != "projection":
        _apply(cur, event, handler)
        return
    # BUG: whatever came last wins, even an `authorized` after `captured`.
    cur.execute(
        """INSERT INTO payment_projection (payment_id, status, event_id)
           VALUES (%s, %s, %s)
           ON CONFLICT (payment_id) DO UPDATE
             SET status = EXCLUDED.status, event_id = EXCLUDED.event_id""",
        (event.payment_id, consumer.STATUS[event.event_type], event.event_id))


# consumer.apply_claimed looks `apply` up in its module at each call.
consumer.apply = apply

if __name__ == "__main__":
    consumer.run(consumer.handle_batch)
