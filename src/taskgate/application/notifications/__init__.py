"""Notifications where the operator is: events worth a look, batched per channel, sent through Apprise."""
