"""The audit log's hash chains: which chain a record belongs to, its canonical encoding and its link hash.

Format `taskgate-audit-v1` (docs/audit.md): an audited record is one row of `transition_log`, `decisions` or
`events`, given as the fields of `AUDITED_FIELDS` (its primary key included, so that swapping two rows' contents
shows). Its *link hash* is the SHA-256 of the canonical JSON of
`["taskgate-audit-v1", chain, seq, prev, table, fields]`: keys sorted, no spaces, ASCII (other characters as
JSON's backslash-u escapes), no NaN, datetimes as UTC ISO 8601 with microseconds and `Z`. `prev` is the hash of
the record before it in its chain (the genesis hash, 64 zeros, for the first). Changing this encoding changes the
format's name.

Chains: a session's records form the chain `session:<id>`; a record of no session forms the chain of its event
kind's noun (`global:operator`, `global:task`, …). Records are linked after their commit, in batches, by one
linker at a time (`link_records`, application/audit/linking.py): writers never meet on a chain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import orjson

FORMAT = "taskgate-audit-v1"
GENESIS = "0" * 64

AUDITED_FIELDS: dict[str, tuple[str, ...]] = {
    "transition_log": (
        "seq",
        "session_id",
        "trigger",
        "from_state",
        "to_state",
        "outcome",
        "actor",
        "reason",
        "guard_results",
        "session_version",
        "at",
    ),
    "decisions": (
        "id",
        "session_id",
        "operator_id",
        "decision",
        "reason",
        "instructions",
        "override_policies",
        "compensation",
        "session_version",
        "policy_results",
        "at",
        "outcome",
        "to_state",
    ),
    "events": ("id", "session_id", "kind", "payload", "at"),
}
PRIMARY_KEYS = {"transition_log": "seq", "decisions": "id", "events": "id"}
# A chain's records are linked in the order of their time, then of this rank, then of their id: within one instant
# the order a fire writes them (its transition row, a decision, their events). Migration 0014 linked the records
# written before the chains existed in the same order.
TABLE_RANK = {"transition_log": 0, "decisions": 1, "events": 2}


def chain_of(table: str, fields: Mapping[str, Any]) -> str:
    """The chain a record of `table` with these fields belongs to."""
    session_id = fields.get("session_id")
    if session_id:
        return f"session:{session_id}"
    kind = str(fields.get("kind") or table)
    return f"global:{kind.split('.', 1)[0]}"


def session_chain(session_id: str) -> str:
    """The chain of one session's records."""
    return f"session:{session_id}"


def canonical_value(value: Any) -> Any:
    """A stored value as the chain encodes it: datetimes as UTC ISO 8601 text, enums as their value."""
    if isinstance(value, datetime):
        return canonical_time(value)
    if isinstance(value, Enum):
        return value.value
    return value


def canonical_time(value: datetime) -> str:
    """`2026-11-25T10:00:00.000000Z`. Raises: ValueError for a naive datetime (its instant is unknown)."""
    # The last pair is one tuple rebound whole: a thread reads the old pair or the new, never half of each.
    global _last_time
    last, text = _last_time
    if value == last and value.tzinfo is not None:  # a transition row and its event share their time
        return text
    if value.tzinfo is None:
        raise ValueError("a naive datetime cannot be chained: its instant is unknown")
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    text = value.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" off: UTC's offset, always six characters
    _last_time = (value, text)
    return text


# The last time encoded and its text: equal aware datetimes are the same instant, whatever their zone, and so have
# the same text.
_last_time: tuple[datetime, str] = (datetime.min.replace(tzinfo=UTC), "0001-01-01T00:00:00.000000Z")


def canonical_fields(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `table`'s record `row` that the chain covers, canonical. Raises: KeyError for a missing one.

    `at` is each audited table's one timestamp; the other columns are text, numbers or JSON, which encode as they
    are (a str or int enum encodes as its value, any other object fails the encoding, loudly).
    """
    fields = {name: row[name] for name in AUDITED_FIELDS[table]}
    fields["at"] = canonical_time(fields["at"])
    return fields


# The reference encoder, built once: `json.dumps` with options builds a new one per call, which cost a third of a link.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
# orjson writes the same bytes as the reference several times faster (0.5 µs against 3.3 for a transition row),
# except for: non-ASCII text and DEL (the reference escapes them), floats (orjson writes 1e-05 as 0.00001, NaN and
# the infinities as null, which the reference refuses) and what orjson refuses (integers beyond 64 bits, keys that
# are not text, lone surrogates), or what orjson writes and the reference refuses (a datetime, a UUID, a plain
# enum). Those values are encoded by the reference, which raises where it must. tests/unit/audit/test_format.py
# compares the two on generated values. (Looking for floats in the output instead of the value costs as much:
# a timestamp's "39.429963" and a hex digest's "5e" look like numbers to a pattern.)
_SORTED_KEYS = orjson.OPT_SORT_KEYS
_LEAVES = frozenset({str, int, bool, type(None)})


def encode(value: Any, *, plain: bool = False) -> bytes:
    """The canonical JSON bytes of `value` (sorted keys, no spaces, ASCII with backslash-u escapes, no NaN).
    `plain`: the caller vouches that `value` holds only dicts, lists, texts, integers, booleans and None (no
    float): the walk that looks for anything else is skipped.

    Raises: ValueError for NaN or an infinity, TypeError for an object JSON cannot hold (the reference's errors).
    """
    try:
        fast = orjson.dumps(value, option=_SORTED_KEYS)
    except TypeError:  # orjson.JSONEncodeError: a type, an integer, a key or a text orjson refuses
        return _ENCODER.encode(value).encode()
    if not fast.isascii() or b"\x7f" in fast or (not plain and type(value) not in _LEAVES and needs_reference(value)):
        return _ENCODER.encode(value).encode()
    return fast


def needs_reference(value: Any) -> bool:
    """Whether `value` holds, at any depth, a float or an object that orjson writes and the reference refuses (a
    datetime, a UUID, a dataclass, a plain enum): the reference must then write it, or raise. A flat walk: a
    recursive one cost twice as much, and filtering each container's leaves with `map`/`compress` more than this
    loop on a record's few values."""
    todo = [value]
    for item in todo:  # grows as it goes
        kind = type(item)
        if kind is dict:
            todo.extend(item.values())
        elif kind is list or kind is tuple:
            todo.extend(item)
        elif kind in _LEAVES:
            continue
        elif isinstance(item, float):
            return True
        elif isinstance(item, str | int):
            continue  # a str or int enum: both encoders write its value
        elif isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)
        else:
            return True
    return False


def link_hash(chain: str, seq: int, prev: str, table: str, fields: Mapping[str, Any], *, plain: bool = False) -> str:
    """The hash of the record at `seq` of `chain`, after the record whose hash is `prev`; `fields` canonical
    (`plain`: holding no float nor any object but JSON's, as `encode` says)."""
    return hashlib.sha256(encode([FORMAT, chain, seq, prev, table, fields], plain=plain)).hexdigest()


Record = tuple[str, int, dict[str, Any], bool]
"""A record to link: its table, its id, its canonical fields, and whether they are plain (see `encode`)."""


def link_records(
    heads: Mapping[str, tuple[int, str]], records: Iterable[Record]
) -> tuple[list[tuple[str, int, str, int, str]], dict[str, tuple[int, str]]]:
    """Link `records` into their chains after the chains' `heads` (seq, hash; a chain not in `heads` starts at the
    genesis), each chain's in the order (time, TABLE_RANK, id).

    Returns the links, as rows of `audit_links` (chain, seq, table, record id, hash), and the new head of every
    chain that grew.
    """
    by_chain: dict[str, list[Record]] = {}
    for record in records:
        by_chain.setdefault(chain_of(record[0], record[2]), []).append(record)
    links: list[tuple[str, int, str, int, str]] = []
    moved: dict[str, tuple[int, str]] = {}
    for chain in sorted(by_chain):
        seq, prev = heads.get(chain, (0, GENESIS))
        for table, record_id, fields, plain in sorted(by_chain[chain], key=_link_order):
            seq += 1
            prev = link_hash(chain, seq, prev, table, fields, plain=plain)
            links.append((chain, seq, table, record_id, prev))
        moved[chain] = (seq, prev)
    return links, moved


def _link_order(record: Record) -> tuple[str, int, int]:
    table, record_id, fields, _plain = record
    return fields["at"], TABLE_RANK[table], record_id  # `at` as canonical text: fixed width, so it sorts as time
