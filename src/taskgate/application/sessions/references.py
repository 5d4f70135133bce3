"""A session named by its id or a prefix of it: the rules, shared by the engine's reads (`SessionReads.resolve_id`)
and the CLI's engine-free reads, so both accept and refuse alike."""

from __future__ import annotations

import re

from taskgate.domain.errors import InvalidInput, SessionNotFound

FULL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def prefix_of(ref: str) -> str | None:
    """`ref` normalised as a prefix to look up, or None when it is a whole id (nothing to resolve).

    Raises: InvalidInput when it is shorter than 4 characters.
    """
    ref = ref.strip().lower()
    if FULL_ID.fullmatch(ref):
        return None
    if len(ref) < 4:
        raise InvalidInput(f"session id '{ref}' is too short; give at least 4 characters")
    return ref


def upper_bound(prefix: str) -> str:
    """The end of the id range that starts with `prefix` (a range scan on the key instead of LIKE)."""
    return prefix + "\uffff"


def pick(prefix: str, matches: list[str]) -> str:
    """The session id `prefix` names among the (at most two) ids starting with it.

    Raises: SessionNotFound when none does; InvalidInput when it is ambiguous.
    """
    if not matches:
        raise SessionNotFound(prefix)
    if len(matches) > 1 and prefix not in matches:
        raise InvalidInput(f"session id prefix '{prefix}' is ambiguous ({', '.join(matches)}, ...)")
    return prefix if prefix in matches else matches[0]
