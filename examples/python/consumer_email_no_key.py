#!/usr/bin/env python3
"""BROKEN ON PURPOSE: sends each receipt email without an idempotency key.

Everything else is consumer.py: the email goes out inside the receipt's
transaction, and a failure rolls the batch back and tries it again. The
database stays exactly once. But when the provider's answer is lost after
it sent the email, the retry sends it again, and nothing lets the provider
tell a retry from a new email: the customer gets two.
`chaos run email-no-key.toml` reports "duplicate external effect" and
exits 1.
"""
import consumer

# BUG: no key, so the provider cannot absorb a retry.
consumer.EMAIL_KEY = lambda event: None

if __name__ == "__main__":
    consumer.run(consumer.handle_batch)
