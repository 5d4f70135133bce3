"""The linker's SQLite reader against the verify's: the same stored row gives the same canonical fields and link
hash whether it is read as stored by the driver (`_stored_record`, the linker's) or through SQLAlchemy's types
(`canonical_fields`, the verify's), for any JSON the columns can hold and for rows written by hand (issue 21)."""

from __future__ import annotations

import math
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, select, text

from taskgate.domain.audit.chain import AUDITED_FIELDS, canonical_fields, link_hash
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.audit_link_store import _PENDING_SQLITE, _stored_record

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
MOMENTS = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


@pytest.fixture(scope="module")
def engine(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory):
    target = tmp_path_factory.mktemp("linker") / "linker.db"
    shutil.copy(sqlite_template, target)
    engine = create_engine(f"sqlite:///{target}")
    yield engine
    engine.dispose()


def both_ways(engine, table: str, record_id: int) -> tuple[tuple, dict]:
    """The record as the linker reads it (table, id, fields, plain) and as the verify reads it (canonical fields)."""
    key = t.transition_log.c.seq if table == "transition_log" else getattr(t, table).c.id
    with engine.connect() as conn:
        raw = conn.exec_driver_sql(_PENDING_SQLITE[table], (record_id - 1, record_id, 1)).one()
        typed = conn.execute(select(getattr(t, table)).where(key == record_id)).mappings().one()
    return _stored_record(table, raw), canonical_fields(table, typed)


def assert_same(linker: tuple, verify: dict) -> None:
    table, _record_id, fields, plain = linker
    assert fields == verify
    chain = "session:x"
    assert link_hash(chain, 3, "ab" * 32, table, fields, plain=plain) == link_hash(chain, 3, "ab" * 32, table, verify)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=JSON_VALUES, at=MOMENTS, kind=st.text(min_size=1, max_size=12))
def test_an_event_written_by_taskgate_reads_the_same_both_ways(engine, payload, at, kind):
    with engine.begin() as conn:
        event_id = conn.execute(t.events.insert().values(kind=kind, at=at, payload=payload, session_id=None))
        record_id = event_id.inserted_primary_key[0]
    assert_same(*both_ways(engine, "events", record_id))


@given(guards=st.lists(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3), max_size=3), at=MOMENTS,
       reason=st.none() | st.text(), version=st.integers(min_value=0, max_value=2**62))  # fmt: skip
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_transition_row_reads_the_same_both_ways(engine, guards, at, reason, version):
    values = {"session_id": "no-such-session", "trigger": "start", "from_state": "ready", "to_state": "planning",
              "outcome": "applied", "actor": "operator:zoë", "reason": reason, "guard_results": guards,
              "session_version": version, "at": at}  # fmt: skip
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA foreign_keys = OFF")  # a row of no session: the reader is what is tested
        record_id = conn.execute(t.transition_log.insert().values(**values)).inserted_primary_key[0]
    linker, verify = both_ways(engine, "transition_log", record_id)
    assert_same(linker, verify)
    assert set(verify) == set(AUDITED_FIELDS["transition_log"])


@pytest.mark.parametrize(
    ("payload", "at", "plain"),
    [
        ('{"b": 1, "a": [true, null]}', "2026-11-27 10:00:00.000001", True),
        ('{"n": 123456789012345678901}', "2026-11-27 10:00:00.000000", False),  # orjson would read a float
        ('{"x": 1.5e-7, "y": "15:00:00.5"}', "2026-11-27 10:00:00.250000", False),
        ('{"nan": NaN}', "2026-11-27 10:00:00.000000", False),
        ('{"s": "caf\\u00e9 \\u2615"}', "2026-11-27 10:00:00", True),  # a time without microseconds
        ("[1, 2]", "2026-11-27T10:00:00.123456", True),  # another separator
        ('{"a": 1, "a": 2}', "2026-11-27 10:00:00.000000", True),  # a repeated key: the last one, both ways
    ],
)
def test_rows_written_by_hand_read_the_same_both_ways(engine, payload, at, plain):
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO events (kind, at, payload) VALUES ('hand.made', :at, :p)"), {"at": at, "p": payload}
        )
        record_id = conn.exec_driver_sql("SELECT max(id) FROM events").scalar_one()
    linker, verify = both_ways(engine, "events", record_id)
    assert linker[3] is plain
    if payload.startswith('{"nan"'):  # NaN cannot be chained: both ways refuse it, by the same error
        assert math.isnan(linker[2]["payload"]["nan"]) and math.isnan(verify["payload"]["nan"])
        with pytest.raises(ValueError):
            link_hash("c", 1, "0" * 64, "events", linker[2], plain=linker[3])
        with pytest.raises(ValueError):
            link_hash("c", 1, "0" * 64, "events", verify)
        return
    assert_same(linker, verify)


def test_a_time_past_the_last_microsecond_reads_the_same_both_ways(engine):
    at = datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) + timedelta(microseconds=1)
    with engine.begin() as conn:
        record_id = conn.execute(
            t.events.insert().values(kind="k", at=at, payload={}, session_id=None)
        ).inserted_primary_key[0]
    linker, verify = both_ways(engine, "events", record_id)
    assert linker[2]["at"] == verify["at"] == "2027-01-01T00:00:00.000000Z"
