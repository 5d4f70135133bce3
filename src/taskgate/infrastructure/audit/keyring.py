"""`FileKeyRing`: the audit key files, read when first needed.

Kept apart from `keys.py` so that building the services (every CLI command, `serve`) does not import
`cryptography` (~80 ms here): only a process that signs or verifies loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskgate.infrastructure.audit.keys import AuditPublicKey, AuditSigner


class FileKeyRing:
    """The key pair at `private` (and its `.pub`), each loaded on first use: a process that never signs or
    verifies never reads them. `public` may name another public key file (an auditor's own copy)."""

    def __init__(self, private: Path, public: Path | None = None) -> None:
        self._private = private
        self._public_path = public or private.with_name(private.name + ".pub")  # audit_keys.public_path
        self._signer: AuditSigner | None = None
        self._public: AuditPublicKey | None = None

    def signer(self) -> AuditSigner | None:
        """The signing key, or None when this machine has no private key file. Raises: InvalidInput for a bad one."""
        if self._signer is None and self._private.exists():
            from taskgate.infrastructure.audit.keys import load_signer

            self._signer = load_signer(self._private)
        return self._signer

    def public(self) -> AuditPublicKey | None:
        """The public key file's key (else the signing key's public half), or None when there is neither."""
        if self._public is None:
            if self._public_path.exists():
                from taskgate.infrastructure.audit.keys import load_public

                self._public = load_public(self._public_path)
            elif (signer := self.signer()) is not None:
                self._public = signer.public
        return self._public

    @property
    def private_path(self) -> Path:
        return self._private
