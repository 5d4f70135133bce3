"""The audit log's format `taskgate-audit-v1`, pinned (docs/audit.md): a link hash and a checkpoint body of fixed
inputs against digests computed once and read by eye, the canonical timestamps, which columns the chains cover,
and which chain a record belongs to. A change here breaks every verification of an existing database: it needs a
new format name, not a new expected value."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum, StrEnum
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgate.domain.audit import chain as audit_chain
from taskgate.domain.audit.chain import (
    AUDITED_FIELDS,
    FORMAT,
    GENESIS,
    PRIMARY_KEYS,
    canonical_fields,
    canonical_time,
    canonical_value,
    chain_of,
    encode,
    link_hash,
    link_records,
    session_chain,
)
from taskgate.domain.audit.checkpoints import Checkpoint, digest
from taskgate.infrastructure.db import tables

SESSION = "00000000-0000-4000-8000-000000000001"

APPROVAL = {
    "seq": 42,
    "session_id": SESSION,
    "trigger": "approve",
    "from_state": "verifying",
    "to_state": "awaiting_merge",
    "outcome": "applied",
    "actor": "operator:zoë",
    "reason": "looks good",
    "guard_results": [{"policy": "require_tests", "passed": True}],
    "session_version": 7,
    "at": datetime(2026, 11, 25, 10, 0, 0, 123456, tzinfo=UTC),
}

# What the chain hashes for APPROVAL at seq 3 after a record whose hash is "ab" * 32: keys sorted at every level,
# no spaces, non-ASCII as a backslash-u escape, the time in UTC with microseconds and Z.
APPROVAL_CANONICAL = (
    '["taskgate-audit-v1","session:00000000-0000-4000-8000-000000000001",3,'
    '"abababababababababababababababababababababababababababababababab","transition_log",'
    '{"actor":"operator:zo\\u00eb","at":"2026-11-25T10:00:00.123456Z","from_state":"verifying",'
    '"guard_results":[{"passed":true,"policy":"require_tests"}],"outcome":"applied","reason":"looks good","seq":42,'
    '"session_id":"00000000-0000-4000-8000-000000000001","session_version":7,"to_state":"awaiting_merge",'
    '"trigger":"approve"}]'
)
APPROVAL_HASH = "1cb567c85848fadb1fa01af0fb0489d17feb451e071f02eab06141dffcc02dee"

CHECKPOINT = Checkpoint(
    number=2,
    at="2026-11-25T10:05:00.000000Z",
    prev="cd" * 32,
    reason="interval",
    key="0123456789abcdef",
    heads={f"session:{SESSION}": (3, "ef" * 32), "global:operator": (1, "12" * 32)},
    anchors={"session:00000000-0000-4000-8000-000000000002": (5, "34" * 32)},
    by="operator:zoë",
)
CHECKPOINT_BODY = (
    '{"anchors":{"session:00000000-0000-4000-8000-000000000002":[5,'
    '"3434343434343434343434343434343434343434343434343434343434343434"]},"at":"2026-11-25T10:05:00.000000Z",'
    '"by":"operator:zo\\u00eb","format":"taskgate-audit-v1","heads":{"global:operator":[1,'
    '"1212121212121212121212121212121212121212121212121212121212121212"],'
    '"session:00000000-0000-4000-8000-000000000001":[3,'
    '"efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"]},"key":"0123456789abcdef","number":2,'
    '"prev":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","reason":"interval"}'
)
# A body as written before revision 0015, without `by`: it still parses, as asked by the system.
LEGACY_CHECKPOINT_BODY = (
    '{"anchors":{"session:00000000-0000-4000-8000-000000000002":[5,'
    '"3434343434343434343434343434343434343434343434343434343434343434"]},"at":"2026-11-25T10:05:00.000000Z",'
    '"format":"taskgate-audit-v1","heads":{"global:operator":[1,'
    '"1212121212121212121212121212121212121212121212121212121212121212"],'
    '"session:00000000-0000-4000-8000-000000000001":[3,'
    '"efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"]},"key":"0123456789abcdef","number":2,'
    '"prev":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","reason":"interval"}'
)
CHECKPOINT_DIGEST = "436a5c12fe456726ea8170b7fce39e5d05810aed9056a6f88724364e5ab5bebf"


def test_the_format_is_named_v1_and_the_genesis_hash_is_64_zeros():
    assert FORMAT == "taskgate-audit-v1"
    assert GENESIS == "0" * 64


def test_a_link_hash_is_the_sha256_of_the_canonical_json_pinned():
    fields = canonical_fields("transition_log", APPROVAL)
    chain = chain_of("transition_log", fields)
    assert encode([FORMAT, chain, 3, "ab" * 32, "transition_log", fields]) == APPROVAL_CANONICAL.encode()
    assert hashlib.sha256(APPROVAL_CANONICAL.encode()).hexdigest() == APPROVAL_HASH
    assert link_hash(chain, 3, "ab" * 32, "transition_log", fields) == APPROVAL_HASH


def test_every_input_of_a_link_hash_changes_it():
    fields = canonical_fields("transition_log", APPROVAL)
    chain = session_chain(SESSION)
    changed = [
        link_hash("session:other", 3, "ab" * 32, "transition_log", fields),
        link_hash(chain, 4, "ab" * 32, "transition_log", fields),
        link_hash(chain, 3, GENESIS, "transition_log", fields),
        link_hash(chain, 3, "ab" * 32, "events", fields),
        link_hash(chain, 3, "ab" * 32, "transition_log", {**fields, "actor": "operator:mallory"}),
        link_hash(chain, 3, "ab" * 32, "transition_log", {**fields, "seq": 43}),
    ]
    assert APPROVAL_HASH not in changed and len(set(changed)) == len(changed)


def test_a_checkpoint_body_is_pinned_and_parses_back():
    body = CHECKPOINT.body()
    assert body == CHECKPOINT_BODY.encode()
    assert digest(body) == hashlib.sha256(CHECKPOINT_BODY.encode()).hexdigest() == CHECKPOINT_DIGEST
    assert Checkpoint.parse(body) == CHECKPOINT


def test_a_body_from_before_0015_without_who_asked_parses_as_asked_by_the_system():
    legacy = Checkpoint.parse(LEGACY_CHECKPOINT_BODY.encode())
    assert legacy.by == "system" and legacy == replace(CHECKPOINT, by="system")
    assert digest(LEGACY_CHECKPOINT_BODY.encode()) == "2925015ed40628b412c8617dc860fd49270983e503694e08a6645a5edec8dd20"


def test_a_body_of_another_format_does_not_parse():
    other = CHECKPOINT_BODY.replace("taskgate-audit-v1", "taskgate-audit-v2").encode()
    with pytest.raises(ValueError, match="not a taskgate-audit-v1 checkpoint body"):
        Checkpoint.parse(other)


@pytest.mark.parametrize(
    ("moment", "expected"),
    [
        (datetime(2026, 11, 25, 11, 0, 0, 5, tzinfo=ZoneInfo("Europe/Paris")), "2026-11-25T10:00:00.000005Z"),
        (datetime(2026, 6, 30, 22, 30, tzinfo=ZoneInfo("America/New_York")), "2026-07-01T02:30:00.000000Z"),
        (datetime(2026, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))), "2026-01-01T00:00:00.000000Z"),
        (datetime(2026, 1, 1, tzinfo=UTC), "2026-01-01T00:00:00.000000Z"),
    ],
)
def test_an_aware_time_in_any_zone_is_chained_as_utc_with_microseconds_and_z(moment, expected):
    assert canonical_value(moment) == expected
    assert (
        canonical_fields("events", {"id": 1, "session_id": None, "kind": "k", "payload": {}, "at": moment})["at"]
        == expected
    )


def test_a_naive_time_cannot_be_chained():
    with pytest.raises(ValueError, match="naive datetime"):
        canonical_value(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="naive datetime"):
        canonical_fields(
            "events", {"id": 1, "session_id": None, "kind": "k", "payload": {}, "at": datetime(2026, 1, 1)}
        )


def test_a_str_enum_is_chained_as_its_value():
    class Outcome(StrEnum):
        APPLIED = "applied"

    plain = canonical_fields("transition_log", APPROVAL)
    with_enum = canonical_fields("transition_log", {**APPROVAL, "outcome": Outcome.APPLIED})
    assert encode(with_enum) == encode(plain)


def test_nan_is_refused_by_the_encoding():
    with pytest.raises(ValueError):
        encode({"x": float("nan")})


def test_infinity_and_nan_inside_a_record_are_refused_where_a_null_is_accepted():
    assert encode({"reason": None, "results": [{"ratio": 0.5}]}) == b'{"reason":null,"results":[{"ratio":0.5}]}'
    for bad in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ValueError):
            encode({"reason": None, "results": [{"ratio": bad}]})


_REFERENCE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text()
    | st.uuids()
    | st.datetimes(timezones=st.just(UTC))
    | st.sampled_from(["executing", "1.5", "v2e3", "\x7f", "caf\u00e9", "\u2028", "\x00\x1f", "\ud800"])
)
_json_like = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def test_objects_json_cannot_hold_are_refused_though_orjson_could_write_them():
    # orjson writes datetimes, UUIDs, dataclasses and plain enums; the format's reference refuses them, loudly.
    class Colour(Enum):
        RED = 1

    for value in (datetime(2026, 11, 27, tzinfo=UTC), uuid.UUID(int=1), Colour.RED, replace(CHECKPOINT)):
        with pytest.raises(TypeError):
            encode({"payload": [value]})


def _reference(value: object) -> bytes | type[Exception]:
    try:
        return _REFERENCE.encode(value).encode()
    except (ValueError, TypeError, UnicodeEncodeError) as error:
        return type(error)


def _ours(value: object) -> bytes | type[Exception]:
    try:
        return encode(value)
    except (ValueError, TypeError, UnicodeEncodeError) as error:
        return type(error)


@settings(max_examples=1500, deadline=None)
@given(_json_like)
def test_the_fast_encoding_writes_the_reference_encoders_bytes_or_its_error(value):
    # The reference is the format's definition (json, sorted keys, no spaces, ASCII escapes, no NaN); encode()
    # takes orjson's bytes only where they are the same, and must raise where the reference raises.
    assert _ours(value) == _reference(value)


def test_a_plain_record_takes_the_fast_path_and_a_float_the_reference(monkeypatch):
    # With the reference encoder made to fail: an ASCII record of text, integers and nulls still encodes (the fast
    # path is not dead code), and one holding a float goes to the reference.
    fields = canonical_fields("transition_log", {**APPROVAL, "reason": "approved", "actor": "operator:ada"})
    expected = _REFERENCE.encode(fields).encode()

    class Refusing:
        def encode(self, value: object) -> str:
            raise AssertionError("the reference encoder was used")

    monkeypatch.setattr(audit_chain, "_ENCODER", Refusing())
    assert encode(fields) == expected
    with pytest.raises(AssertionError, match="reference"):
        encode({**fields, "guard_results": [{"coverage": 0.5}]})


def _reference_time(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


_zones = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=11)),
                          ZoneInfo("Europe/Paris"), ZoneInfo("UTC")])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.datetimes(min_value=datetime(1970, 1, 2)), _zones), min_size=1, max_size=8))
def test_a_time_is_its_utc_text_whatever_came_before_it(moments):
    # canonical_time keeps the last time it encoded; a run of times, some equal instants in other zones, each
    # still encodes as its own instant.
    for naive, zone in moments:
        moment = naive.replace(tzinfo=zone)
        assert canonical_time(moment) == _reference_time(moment)
        assert canonical_time(moment.astimezone(UTC)) == _reference_time(moment)


def test_a_naive_time_is_refused_even_right_after_the_same_wall_time_in_utc():
    canonical_time(datetime(2026, 11, 27, 12, 0, tzinfo=UTC))
    with pytest.raises(ValueError, match="naive"):
        canonical_time(datetime(2026, 11, 27, 12, 0))


DECISION_ROW = {
    "id": 9, "session_id": SESSION, "operator_id": 3, "decision": "approve", "reason": "fine", "instructions": None,
    "override_policies": [], "compensation": None, "session_version": 4,
    "policy_results": [{"policy": "tests_pass", "passed": True}], "at": datetime(2026, 11, 27, 9, 0, tzinfo=UTC),
    "outcome": "applied", "to_state": "approved",
}  # fmt: skip
EVENT_ROW = {"id": 12, "session_id": None, "kind": "operator.added", "payload": {"name": "ada"},
             "at": datetime(2026, 11, 27, 9, 1, tzinfo=UTC)}  # fmt: skip


def _record(table: str, row: dict, record_id: int, **changes) -> tuple[str, int, dict, bool]:
    fields = canonical_fields(table, {**row, **changes, PRIMARY_KEYS[table]: record_id})
    return table, record_id, fields, record_id % 2 == 0  # plain or not: the same hash either way for these


def test_the_linker_orders_a_chains_records_by_time_then_table_then_id_after_its_head():
    at = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    event = {**EVENT_ROW, "session_id": SESSION}
    records = [  # as read: table by table, each in id order
        _record("transition_log", APPROVAL, 50, at=at),
        _record("transition_log", APPROVAL, 40, at=at.replace(minute=5)),
        _record("decisions", DECISION_ROW, 9, at=at),
        _record("events", event, 31, at=at),
        _record("events", event, 30, at=at),
        _record("events", EVENT_ROW, 32),  # no session: the chain of its kind
    ]
    head = (7, "ab" * 32)
    links, heads = link_records({f"session:{SESSION}": head}, records)
    chained = [(chain, table, record_id, seq) for chain, seq, table, record_id, _hash in links]
    assert chained == [
        ("global:operator", "events", 32, 1),
        (f"session:{SESSION}", "transition_log", 50, 8),
        (f"session:{SESSION}", "decisions", 9, 9),
        (f"session:{SESSION}", "events", 30, 10),
        (f"session:{SESSION}", "events", 31, 11),
        (f"session:{SESSION}", "transition_log", 40, 12),
    ]
    prev, fields_of = head[1], {(t, i): f for t, i, f, _plain in records}
    for chain, seq, table, record_id, hashed in links[1:]:
        prev = link_hash(chain, seq, prev, table, fields_of[(table, record_id)])
        assert hashed == prev
    assert heads == {"global:operator": (1, links[0][4]), f"session:{SESSION}": (12, prev)}
    assert links[0][4] == link_hash("global:operator", 1, GENESIS, "events", fields_of[("events", 32)])


def test_a_missing_audited_field_is_a_key_error_naming_it():
    row = {k: v for k, v in APPROVAL.items() if k != "guard_results"}
    with pytest.raises(KeyError, match="guard_results"):
        canonical_fields("transition_log", row)


@pytest.mark.parametrize("table", ["transition_log", "decisions", "events"])
def test_the_chains_cover_every_column_of_the_audited_tables(table):
    """A new column in one of these tables must be a format decision: cover it (and name a new format) or not."""
    declared = getattr(tables, table)
    assert set(AUDITED_FIELDS[table]) == {column.name for column in declared.columns}
    assert len(AUDITED_FIELDS[table]) == len(set(AUDITED_FIELDS[table]))
    assert [column.name for column in declared.primary_key.columns] == [PRIMARY_KEYS[table]]


def test_only_the_three_tables_are_audited():
    assert set(AUDITED_FIELDS) == set(PRIMARY_KEYS) == {"transition_log", "decisions", "events"}


@pytest.mark.parametrize(
    ("table", "fields", "chain"),
    [
        ("transition_log", {"session_id": SESSION, "trigger": "start"}, f"session:{SESSION}"),
        ("decisions", {"session_id": SESSION, "decision": "approve"}, f"session:{SESSION}"),
        ("events", {"session_id": SESSION, "kind": "token.issued"}, f"session:{SESSION}"),
        ("events", {"session_id": None, "kind": "operator.added"}, "global:operator"),
        ("events", {"session_id": None, "kind": "token.revoked"}, "global:token"),
        ("events", {"session_id": None, "kind": "audit.verified"}, "global:audit"),
        ("events", {"session_id": None, "kind": "decision.review.bypassed"}, "global:decision"),
        ("events", {"session_id": None, "kind": "startup"}, "global:startup"),
        ("events", {"session_id": "", "kind": "task.added"}, "global:task"),
    ],
)
def test_a_record_belongs_to_its_sessions_chain_or_to_its_kinds_global_chain(table, fields, chain):
    assert chain_of(table, fields) == chain


def test_a_sessions_chain_is_named_after_its_id():
    assert session_chain(SESSION) == f"session:{SESSION}"
