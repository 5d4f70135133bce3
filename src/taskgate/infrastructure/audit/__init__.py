"""The audit signing keys: Ed25519 keys on disk and the key ring of past public keys."""
