"""taskgate: run AI coding agents safely and in parallel, one audited session per task."""

__version__ = "0.1.0"
