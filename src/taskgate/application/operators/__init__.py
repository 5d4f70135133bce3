"""The people: operators and their roles, tokens and access, their decisions, and the queue of what waits for them."""
