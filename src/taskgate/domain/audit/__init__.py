"""The audit log's rules (pure): the canonical encoding and hash chain, checkpoints, and verification."""
