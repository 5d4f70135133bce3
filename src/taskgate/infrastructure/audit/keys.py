"""The audit signing key: an Ed25519 key pair in two files, outside the database (docs/audit.md#the-key).

The private key is PKCS#8 PEM, mode 0600, at `[audit] key_file`; the public key sits beside it (`.pub`) as one
line, `taskgate-audit-ed25519 <base64 of the 32 raw bytes>`, which is what an auditor keeps and passes to
`taskgate audit verify --public-key`. A key's id is the first 16 hex digits of the SHA-256 of its raw public
bytes: every checkpoint names the id of the key that signed it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from taskgate.domain.errors import InvalidInput

_PUBLIC_PREFIX = "taskgate-audit-ed25519"


def key_id(raw_public: bytes) -> str:
    """The id a checkpoint names its key by."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


class AuditPublicKey:
    """The verifying half."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        self.raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = key_id(self.raw)

    def verifies(self, body: bytes, signature: str) -> bool:
        """Whether `signature` (base64) is this key's over `body`."""
        try:
            self._key.verify(base64.b64decode(signature, validate=True), body)
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True

    def line(self) -> str:
        """The public key file's one line."""
        return f"{_PUBLIC_PREFIX} {base64.b64encode(self.raw).decode()}"

    @staticmethod
    def parse(text: str, source: str) -> AuditPublicKey:
        """Raises: InvalidInput naming `source` when it is not a taskgate audit public key."""
        parts = text.split()
        if len(parts) < 2 or parts[0] != _PUBLIC_PREFIX:
            raise InvalidInput(f"{source} is not a taskgate audit public key (expected '{_PUBLIC_PREFIX} <base64>')")
        try:
            raw = base64.b64decode(parts[1], validate=True)
            return AuditPublicKey(Ed25519PublicKey.from_public_bytes(raw))
        except (binascii.Error, ValueError) as exc:
            raise InvalidInput(f"{source}: the public key does not decode ({exc})") from exc


class AuditSigner:
    """The signing half, loaded from the private key file."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public = AuditPublicKey(key.public_key())
        self.key_id = self.public.key_id

    def sign(self, body: bytes) -> str:
        """A base64 Ed25519 signature over `body`."""
        return base64.b64encode(self._key.sign(body)).decode()


def public_path(private: Path) -> Path:
    """Where the public half of the key at `private` is kept."""
    return private.with_name(private.name + ".pub")


def create_key(private: Path) -> tuple[AuditSigner, bool]:
    """The key at `private`, created (with its `.pub`) when there is none; and whether it was created.

    The private file is written 0600 through a temporary name and renamed, so a crash leaves no half key.
    Raises: InvalidInput when a key file exists but is not a taskgate audit key.
    """
    if private.exists():
        return load_signer(private), False
    private.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write(private, pem, 0o600)
    signer = AuditSigner(key)
    _write(public_path(private), (signer.public.line() + "\n").encode(), 0o644)
    return signer, True


def _write(path: Path, data: bytes, mode: int) -> None:
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)


def load_signer(private: Path) -> AuditSigner:
    """Raises: InvalidInput when the file is missing or is not an Ed25519 private key."""
    try:
        key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise InvalidInput(f"no audit key at {private}: `taskgate init` creates one ([audit] key_file)") from exc
    except OSError as exc:  # a folder, no permission: named, never a traceback
        raise InvalidInput(f"the audit key {private} cannot be read: {exc.strerror or exc}") from exc
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"{private} is not a readable Ed25519 private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"{private} holds a {type(key).__name__}, not an Ed25519 key")
    return AuditSigner(key)


def load_public(path: Path) -> AuditPublicKey:
    """Raises: InvalidInput when the file is missing or is not a taskgate audit public key."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise InvalidInput(f"no public key at {path}") from exc
    except OSError as exc:
        raise InvalidInput(f"the public key {path} cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path} is not a taskgate audit public key (not text)") from exc
    return AuditPublicKey.parse(text, str(path))


__all__ = ["AuditPublicKey", "AuditSigner", "create_key", "load_public", "load_signer", "public_path"]
