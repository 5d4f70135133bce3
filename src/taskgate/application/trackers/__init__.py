"""Where tasks come from and go back to: the built-in tracker (projects, plans, tasks), external trackers (Beads) read
live and written back through an outbox, their import, and dispatch."""
