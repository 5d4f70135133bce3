"""The audit log's use cases: queries and replay, the hash-chain linker, signed checkpoints, verify, export and
prune."""
