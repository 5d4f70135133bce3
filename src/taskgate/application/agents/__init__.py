"""Agents launched into session worktrees and supervised, and the session folders they write their outputs to."""
