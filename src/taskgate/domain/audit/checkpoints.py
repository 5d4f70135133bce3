"""Signed checkpoints over the audit chains' heads (format `taskgate-audit-v1`, docs/audit.md).

A checkpoint's body is canonical JSON: its `number` (1, 2, …), `at`, `prev` (the SHA-256 of the previous
checkpoint's body; the genesis hash for the first), `reason`, `heads` (for each chain that grew since the previous
checkpoint: `[seq, hash]` of its last record), `anchors` (for each chain pruned by this checkpoint: `[seq, hash]`
of the last record removed; the chain goes on from there), `key` (the id of the key that signs it) and `by` (who
asked for it: an operator's actor for one on demand, `system` for a periodic one, a seal or a prune by the
system; absent from bodies written before revision 0015, read as `system`). The
Ed25519 signature is over the body's bytes. Checkpoints form a chain of their own, so a removed or reordered one
shows, and a rewritten record chain shows against the head a checkpoint signed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from taskgate.domain.audit.chain import FORMAT, GENESIS, encode

SignatureCheck = Callable[[bytes, str], bool]
"""Whether a base64 signature is the verifying key's over these bytes."""


@dataclass(frozen=True, slots=True)
class ChainPoint:
    """A record's place in its chain: its `seq` and link hash; `checkpoint` is the number that signed it."""

    seq: int
    hash: str
    checkpoint: int = 0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint's body."""

    number: int
    at: str
    prev: str
    reason: str
    key: str
    heads: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    anchors: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    by: str = "system"

    def body(self) -> bytes:
        """The canonical bytes that are stored, hashed and signed."""
        return encode(
            {
                "format": FORMAT,
                "number": self.number,
                "at": self.at,
                "prev": self.prev,
                "reason": self.reason,
                "key": self.key,
                "heads": {c: list(p) for c, p in self.heads.items()},
                "anchors": {c: list(p) for c, p in self.anchors.items()},
                "by": self.by,
            }
        )

    @staticmethod
    def parse(body: bytes) -> Checkpoint:
        """The checkpoint stored as `body`. Raises: ValueError when it is not a v1 checkpoint body."""
        data = json.loads(body)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} checkpoint body")
        heads = {str(c): (int(p[0]), str(p[1])) for c, p in data["heads"].items()}
        anchors = {str(c): (int(p[0]), str(p[1])) for c, p in data["anchors"].items()}
        return Checkpoint(
            int(data["number"]), str(data["at"]), str(data["prev"]), str(data["reason"]), str(data["key"]),
            heads, anchors, str(data.get("by", "system")),
        )  # fmt: skip


def digest(body: bytes) -> str:
    """The SHA-256 of a checkpoint body: what the next checkpoint's `prev` names."""
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as kept: its body bytes, and its signature (base64) if it was signed."""

    body: bytes
    signature: str | None


@dataclass(slots=True)
class CheckpointReport:
    """What the checkpoint chain says: its problems, and per chain the newest signed head and prune anchor."""

    problems: list[tuple[str, str]] = field(default_factory=list)  # (where, what)
    heads: dict[str, ChainPoint] = field(default_factory=dict)
    anchors: dict[str, ChainPoint] = field(default_factory=dict)
    last: Checkpoint | None = None
    count: int = 0


def verify_checkpoints(stored: Iterable[StoredCheckpoint], key_id: str, signed_by: SignatureCheck) -> CheckpointReport:
    """Check the checkpoints in number order: each parses, follows the one before, and is signed by `key_id`'s key.

    Only a checkpoint that passes every check contributes heads and anchors: a forged one vouches for nothing.
    """
    report, prev, expected = CheckpointReport(), GENESIS, 1
    for item in stored:
        report.count += 1
        try:
            cp = Checkpoint.parse(item.body)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            report.problems.append((f"checkpoint #{expected}", f"its body does not parse ({exc})"))
            prev, expected = digest(item.body), expected + 1
            continue
        problem = _checkpoint_problem(cp, item, expected, prev, key_id, signed_by)
        if problem:
            report.problems.append((f"checkpoint #{cp.number}", problem))
        else:
            for chain, (seq, hash_) in cp.heads.items():
                report.heads[chain] = ChainPoint(seq, hash_, cp.number)
            for chain, (seq, hash_) in cp.anchors.items():
                report.anchors[chain] = ChainPoint(seq, hash_, cp.number)
            report.last = cp
        prev, expected = digest(item.body), cp.number + 1
    return report


def _checkpoint_problem(
    cp: Checkpoint, item: StoredCheckpoint, expected: int, prev: str, key_id: str, signed_by: SignatureCheck
) -> str | None:
    if cp.number != expected:
        return f"comes where #{expected} should: checkpoint #{expected} is missing or the order was changed"
    if cp.prev != prev:
        return (
            f"does not follow checkpoint #{expected - 1}: its prev is {cp.prev[:16]}…, that body hashes to {prev[:16]}…"
        )
    if item.signature is None:
        return "is not signed (`taskgate audit checkpoint` signs it with the key)"
    if cp.key != key_id:
        return (
            f"was signed by key {cp.key}, not by the verifying key {key_id}: the key was replaced or is the wrong one"
        )
    if not signed_by(item.body, item.signature):
        return f"its signature does not verify with key {key_id}: the checkpoint was changed after it was signed"
    return None
