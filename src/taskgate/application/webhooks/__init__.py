"""The events outbox delivered to webhook subscribers."""
