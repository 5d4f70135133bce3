"""The session engine: a session's state machine run as one transaction per transition, its guards and policy book, the
effects around transitions, crash points and node affinity."""
