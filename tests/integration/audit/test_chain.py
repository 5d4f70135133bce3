"""The tamper-evident audit log on SQLite and PostgreSQL: every audited write is chained by the linker after its
commit, checkpoints are signed, and `verify` names the first broken record for each way of editing the database by
hand (issue 21)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta

import pytest

from taskgate.application.audit.ledger import AuditLedger, Scope
from taskgate.application.audit.linking import link_pending
from taskgate.domain.audit.chain import session_chain
from taskgate.infrastructure.audit.keys import create_key, load_public
from taskgate.infrastructure.system import SystemClock
from tests.audit_support import Keys, problems, raw, stored_time
from tests.builders import fire, seed, start

pytestmark = pytest.mark.asyncio


@pytest.fixture
def key(tmp_path):
    signer, _ = create_key(tmp_path / "keys" / "audit.pem")
    return signer


def ledger_of(services, key) -> AuditLedger:
    return AuditLedger(services.uow, SystemClock(), Keys(key))


async def busy(services, git_repo, sessions: int = 2):
    """A few sessions moved through some transitions (transitions, events and a blocked row), then linked, as
    `taskgate serve`'s linker does within a second."""
    seeded = await seed(services, git_repo, tasks=sessions)
    made = []
    for task in seeded.tasks:
        session = await start(services, task)
        made.append(await fire(services, session, "plan_complete", "suspend", "resume"))
    assert await link_pending(services.uow) > 10
    return made


async def test_a_busy_log_verifies_before_and_after_a_checkpoint(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    unsigned = await ledger.verify(Scope(), record=False)
    assert unsigned.ok, [f.describe() for f in unsigned.findings]
    assert unsigned.records > 10 and unsigned.unsigned == unsigned.records
    cp = await ledger.checkpoint()
    assert cp is not None and session_chain(sessions[0].id) in cp.heads
    signed = await ledger.verify(Scope(), record=False)
    assert signed.ok and signed.unsigned == 0 and signed.records == unsigned.records
    assert signed.last_checkpoint["number"] == 1


async def first_link(services, session_id: str, table: str, offset: int = 0) -> int:
    rows = await raw(
        services,
        "SELECT record_id FROM audit_links WHERE chain_id = :c AND record_table = :t ORDER BY chain_seq",
        c=session_chain(session_id),
        t=table,
    )
    return rows[offset][0]


async def test_changing_one_field_of_a_transition_row_is_named(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    await ledger.checkpoint()
    seq = await first_link(sql_services, sessions[1].id, "transition_log", 1)
    await raw(sql_services, "UPDATE transition_log SET actor = 'operator:mallory' WHERE seq = :s", s=seq)
    report = await ledger.verify(Scope(), record=False)
    assert not report.ok
    assert report.findings[0].where == f"transition_log {seq}"
    assert "does not hash to its link" in report.findings[0].problem


async def test_deleting_a_row_in_the_middle_is_named(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    event = await first_link(sql_services, sessions[0].id, "events", 1)
    await raw(sql_services, "DELETE FROM events WHERE id = :i", i=event)
    report = await ledger.verify(Scope(), record=False)
    assert report.findings[0].where == f"events {event}" and "is missing" in report.findings[0].problem
    # the careful forger deletes the link too: the chain then has a gap, named at the record after it
    await raw(sql_services, "DELETE FROM audit_links WHERE record_table = 'events' AND record_id = :i", i=event)
    report = await ledger.verify(Scope(), record=False)
    assert "follows no record" in report.findings[0].problem


async def test_a_session_verify_names_records_deleted_in_the_middle_and_at_the_end(sql_services, git_repo, key):
    # Nothing is indexed by chain (0017): a session's links are found through its records, and walked back by
    # `prev_no` from its head and from each of them, so a link whose record is gone is still found and named.
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    chain = session_chain(sessions[0].id)
    links = await raw(sql_services, "SELECT record_table, record_id FROM audit_links WHERE chain_id = :c "
                                    "ORDER BY chain_seq", c=chain)  # fmt: skip
    events = [link for link in links if link[0] == "events"]
    gone = [events[1], events[-1]]
    assert links[-1] == events[-1], "the chain ends with an event"
    for _table, record_id in gone:
        await raw(sql_services, "DELETE FROM events WHERE id = :i", i=record_id)
    for scope in (Scope(session_id=sessions[0].id), Scope()):
        report = await ledger.verify(scope, record=False)
        assert [f.where for f in report.findings] == [f"events {i}" for _t, i in gone], problems(report)
        assert all("the record was deleted, its link remains" in f.problem for f in report.findings)
    assert (await ledger.verify(Scope(session_id=sessions[0].id), record=False)).records == len(links)
    assert (await ledger.verify(Scope(session_id=sessions[1].id), record=False)).ok


async def test_a_window_starts_from_the_hash_its_first_records_prev_no_leads_to(sql_services, git_repo, key):
    [session] = await busy(sql_services, git_repo, sessions=1)
    ledger = ledger_of(sql_services, key)
    chain = session_chain(session.id)
    [[seq, record_id]] = await raw(sql_services, "SELECT chain_seq, record_id FROM audit_links WHERE chain_id = :c "
                                                 "ORDER BY chain_seq DESC LIMIT 1", c=chain)  # fmt: skip
    [[at]] = await raw(sql_services, "SELECT at FROM events WHERE id = :i", i=record_id)
    window = Scope(session_id=session.id, since=stored_time(at))
    report = await ledger.verify(window, record=False)
    assert report.ok and 1 <= report.records < seq, problems(report)
    first = seq - report.records + 1  # the window holds the chain's tail
    [[foreign]] = await raw(sql_services, "SELECT min(link_no) FROM audit_links WHERE chain_id <> :c", c=chain)
    await raw(sql_services, "UPDATE audit_links SET prev_no = :f WHERE chain_id = :c AND chain_seq = :s",
              f=foreign, c=chain, s=first)  # fmt: skip
    report = await ledger.verify(window, record=False)
    assert (report.findings[0].seq, report.findings[0].chain) == (first, chain), problems(report)
    assert "follows no record" in report.findings[0].problem
    # a whole chain's verify carries each link's hash to the next: the altered number misleads it nowhere
    assert (await ledger.verify(Scope(session_id=session.id), record=False)).ok


async def test_swapping_two_rows_is_named(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    a = await first_link(sql_services, sessions[0].id, "transition_log", 0)
    b = await first_link(sql_services, sessions[0].id, "transition_log", 1)
    columns = "trigger, from_state, to_state, outcome, actor, reason, session_version"
    rows = await raw(sql_services, f"SELECT seq, {columns} FROM transition_log WHERE seq IN (:a, :b)", a=a, b=b)
    one, two = sorted(rows)
    for target, source in ((one, two), (two, one)):
        await raw(
            sql_services,
            "UPDATE transition_log SET trigger = :tr, from_state = :fs, to_state = :ts, outcome = :o, actor = :ac, "
            "reason = :r, session_version = :v WHERE seq = :s",
            tr=source[1], fs=source[2], ts=source[3], o=source[4], ac=source[5], r=source[6], v=source[7], s=target[0],
        )  # fmt: skip
    report = await ledger.verify(Scope(), record=False)
    assert report.findings[0].where == f"transition_log {a}"


async def test_deleting_the_last_rows_is_caught_by_the_checkpoint(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    await ledger.checkpoint()
    chain = session_chain(sessions[0].id)
    tail = await raw(
        sql_services,
        "SELECT record_table, record_id, chain_seq FROM audit_links WHERE chain_id = :c "
        "ORDER BY chain_seq DESC LIMIT 3",
        c=chain,
    )
    for table, record_id, _seq in tail:  # the forger removes the records, their links, and rewinds the head row
        pk = "seq" if table == "transition_log" else "id"
        await raw(sql_services, f"DELETE FROM {table} WHERE {pk} = :i", i=record_id)
        await raw(
            sql_services, "DELETE FROM audit_links WHERE record_table = :t AND record_id = :i", t=table, i=record_id
        )
    last = await raw(
        sql_services, "SELECT chain_seq, hash FROM audit_links WHERE chain_id = :c ORDER BY chain_seq DESC", c=chain
    )
    await raw(
        sql_services,
        "UPDATE audit_chains SET seq = :s, hash = :h WHERE chain_id = :c",
        s=last[0][0],
        h=last[0][1],
        c=chain,
    )
    report = await ledger.verify(Scope(), record=False)
    assert not report.ok
    finding = report.findings[0]
    assert finding.where == f"chain {chain}" and "checkpoint #1 signed" in finding.problem
    assert "last 3 record(s) were removed" in finding.problem


async def test_rewriting_a_whole_chain_consistently_is_caught_by_the_signature(sql_services, git_repo, key):
    from taskgate.domain.audit.chain import GENESIS, link_hash

    sessions = await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    await ledger.checkpoint()
    chain = session_chain(sessions[0].id)
    await raw(
        sql_services, "UPDATE transition_log SET actor = 'operator:mallory' WHERE session_id = :s", s=sessions[0].id
    )
    # the forger recomputes every link of the chain from the edited rows, and the head row
    async with sql_services.uow(write=False) as uow:
        links = [link async for link in _chain_links(uow, chain)]
    prev = GENESIS
    for link in links:
        prev = link_hash(chain, link.seq, prev, link.table, link.fields)  # read back canonical
        await raw(
            sql_services,
            "UPDATE audit_links SET hash = :h WHERE chain_id = :c AND chain_seq = :s",
            h=prev,
            c=chain,
            s=link.seq,
        )
    await raw(sql_services, "UPDATE audit_chains SET hash = :h WHERE chain_id = :c", h=prev, c=chain)
    report = await ledger.verify(Scope(), record=False)
    assert not report.ok
    assert "the chain was rewritten" in report.findings[0].problem and "checkpoint #1" in report.findings[0].problem


async def _chain_links(uow, chain):
    from taskgate.application.audit.ledger import links_in

    async for link in links_in(uow, Scope()):
        if link.chain == chain:
            yield link


async def test_a_replaced_public_key_fails_every_checkpoint(sql_services, git_repo, key, tmp_path):
    await busy(sql_services, git_repo)
    ledger = ledger_of(sql_services, key)
    await ledger.checkpoint()
    other, _ = create_key(tmp_path / "other" / "audit.pem")
    pub = tmp_path / "keys" / "audit.pem.pub"
    pub.write_text((tmp_path / "other" / "audit.pem.pub").read_text())  # the public key file is replaced
    report = await ledger.verify(Scope(), load_public(pub), record=False)
    assert not report.ok
    assert report.findings[0].where == "checkpoint #1"
    assert f"signed by key {key.key_id}, not by the verifying key {other.key_id}" in report.findings[0].problem


async def test_a_forged_checkpoint_signed_with_another_key_fails(sql_services, git_repo, key, tmp_path):
    await busy(sql_services, git_repo)
    forger, _ = create_key(tmp_path / "forger" / "audit.pem")
    await AuditLedger(sql_services.uow, SystemClock(), Keys(forger)).checkpoint()
    report = await ledger_of(sql_services, key).verify(Scope(), record=False)
    assert report.findings[0].where == "checkpoint #1" and "not by the verifying key" in report.findings[0].problem


async def test_a_record_added_by_hand_below_the_mark_is_named(sql_services, git_repo, key):
    # Every record at or below its table's mark was linked; one there without a link was not written by taskgate.
    sessions = await busy(sql_services, git_repo)
    await raw(
        sql_services,
        "INSERT INTO events (id, session_id, kind, payload, at) VALUES (0, :s, 'decision.recorded', '{}', :at)",
        s=sessions[0].id,
        at=(SystemClock().now() - timedelta(hours=1)).replace(tzinfo=None),
    )
    report = await ledger_of(sql_services, key).verify(Scope(), record=False)
    assert not report.ok and report.findings[-1].where == "events 0" and "has no link" in report.findings[-1].problem


async def test_a_verify_links_what_was_committed_before_it_first(sql_services, git_repo, key):
    [session] = await busy(sql_services, git_repo, sessions=1)
    await fire(sql_services, session, "suspend")  # a transition row and its events, not linked yet
    assert (await ledger_of(sql_services, key).status())["pending_records"] >= 2
    report = await ledger_of(sql_services, key).verify(Scope(), record=False)
    assert report.ok and report.linked_now >= 2, [f.describe() for f in report.findings]
    assert (await ledger_of(sql_services, key).status())["pending_records"] == 0


async def test_prune_removes_a_finished_sessions_old_records_behind_a_signed_anchor(sql_services, git_repo, key):
    sessions = await busy(sql_services, git_repo)
    done = await fire(sql_services, sessions[0], "cancel")
    ledger = ledger_of(sql_services, key)
    pruned = await ledger.prune(SystemClock().now() + timedelta(seconds=1))
    assert pruned.sessions == 1 and pruned.records["transition_log"] > 0 and pruned.checkpoint == 1
    left = await raw(sql_services, "SELECT count(*) FROM transition_log WHERE session_id = :s", s=done.id)
    assert left[0][0] == 0
    report = await ledger.verify(Scope(), record=False)
    assert report.ok, [f.describe() for f in report.findings]


async def test_a_reason_with_a_nul_character_is_refused_by_name_and_nothing_is_written(sql_services, git_repo):
    from taskgate.application.sessions.commands import FireTrigger
    from taskgate.domain.errors import InvalidInput
    from tests.builders import ACTOR

    session = (await busy(sql_services, git_repo, sessions=1))[0]
    before = await sql_services.snapshot()
    with pytest.raises(InvalidInput, match="NUL"):
        await sql_services.sessions.fire(FireTrigger(session.id, "suspend", ACTOR, "bad\x00reason"))
    assert await sql_services.snapshot() == before


@pytest.mark.parametrize(("appended", "batch"), [(1, 2000), (9, 2000), (9, 4), (40, 3)])
async def test_records_one_unit_appended_are_linked_in_order_in_batches(sql_services, git_repo, key, appended,
                                                                        batch):  # fmt: skip
    # A batch holds `batch` records of each table; more go into the batches after it. Either way the chain ends
    # contiguous, in the order the records were written.
    [session] = await busy(sql_services, git_repo, sessions=1)
    chain = session_chain(session.id)
    [[before]] = await raw(sql_services, "SELECT seq FROM audit_chains WHERE chain_id = :c", c=chain)
    async with sql_services.uow(write=True) as uow:
        for i in range(appended):
            await uow.events.append("test.noted", SystemClock().now(), {"i": i}, session.id)
        await uow.commit()
    assert await link_pending(sql_services.uow, batch=batch) == appended
    rows = await raw(sql_services, "SELECT l.chain_seq, e.payload FROM audit_links l JOIN events e "
                                   "ON l.record_table = 'events' AND e.id = l.record_id WHERE l.chain_id = :c "
                                   "AND l.chain_seq > :b ORDER BY l.chain_seq", c=chain, b=before)  # fmt: skip
    assert [(seq, _json(payload)["i"]) for seq, payload in rows] == [(before + 1 + i, i) for i in range(appended)]
    [[head]] = await raw(sql_services, "SELECT seq FROM audit_chains WHERE chain_id = :c", c=chain)
    assert head == before + appended
    report = await ledger_of(sql_services, key).verify(Scope(session_id=session.id), record=False)
    assert report.ok, [f.describe() for f in report.findings]
    assert report.records == before + appended


@pytest.mark.parametrize(("appended", "expected"), [(4, (4, False)), (5, (4, True))])
async def test_a_batch_asks_for_another_only_while_records_are_left_below_the_tops(sql_services, git_repo, appended,
                                                                                  expected):  # fmt: skip
    # A full batch that ends at its table's top leaves nothing: another unit would cost a commit for nothing (an
    # fsync on SQLite).
    [session] = await busy(sql_services, git_repo, sessions=1)
    await link_pending(sql_services.uow)
    async with sql_services.uow(write=True) as uow:
        for i in range(appended):
            await uow.events.append("test.noted", SystemClock().now(), {"i": i}, session.id)
        await uow.commit()
    async with sql_services.uow(write=False) as unit:
        tops = await unit.audit.committed_tops()
    async with sql_services.uow(write=True) as unit:
        assert await unit.audit.link_pending(tops, 4) == expected
        await unit.commit()


async def test_two_linkers_at_once_link_every_record_once(sql_services, git_repo, key):
    # The second linker waits for the first one's marks, then starts after them: no record linked twice, none
    # skipped (whole_chains checks both), whichever wins.
    from tests.audit_support import whole_chains

    sessions = await busy(sql_services, git_repo, sessions=3)
    for session in sessions:
        await fire(sql_services, session, "suspend", "resume")
    linked = await asyncio.gather(*(link_pending(sql_services.uow, batch=5) for _ in range(4)))
    assert sum(linked) >= 3 * 4
    lengths = await whole_chains(sql_services)
    assert all(lengths[session_chain(s.id)] > 6 for s in sessions)
    report = await ledger_of(sql_services, key).verify(Scope(), record=False)
    assert report.ok, [f.describe() for f in report.findings]


async def test_a_linker_with_older_tops_never_moves_a_mark_back(sql_services, git_repo, key):
    # A reads its tops; B (another process) reads later ones and links past them; A then links nothing, and must
    # leave the marks where B put them, or the next pass would link B's records a second time.
    from tests.audit_support import whole_chains

    [session] = await busy(sql_services, git_repo, sessions=1)
    await fire(sql_services, session, "suspend")
    async with sql_services.uow(write=False) as unit:
        older = await unit.audit.committed_tops()
    await fire(sql_services, session, "resume")
    assert await link_pending(sql_services.uow) >= 4  # B: both transitions' records
    marks = dict(await raw(sql_services, "SELECT record_table, linked_upto FROM audit_marks"))
    async with sql_services.uow(write=True) as unit:
        assert await unit.audit.link_pending(older, 500) == (0, False)
        await unit.commit()
    assert dict(await raw(sql_services, "SELECT record_table, linked_upto FROM audit_marks")) == marks
    await whole_chains(sql_services)  # every record linked exactly once


@pytest.mark.parametrize("sql_services", ["postgresql"], indirect=True)
async def test_a_record_whose_transaction_commits_after_a_later_one_is_not_skipped(sql_services, git_repo, key):
    # PostgreSQL hands ids out before commit: A takes an event id, B a later one and commits first. A linker that
    # marked B's id as linked without A's would skip A's record forever; its SHARE lock waits for A instead.
    [session] = await busy(sql_services, git_repo, sessions=1)
    async with sql_services.uow(write=True) as a:
        await a.events.append("test.noted", SystemClock().now(), {"note": "A"}, session.id)
        # PostgreSQL's unit holds an event's INSERT for its next statement (pg_writes.py): a read sends it, so A
        # has taken its id before B
        await a.events.high_water()
        async with sql_services.uow(write=True) as b:
            await b.events.append("test.noted", SystemClock().now(), {"note": "B"}, session.id)
            await b.commit()
        linking = asyncio.create_task(link_pending(sql_services.uow))
        await asyncio.sleep(0.3)
        assert not linking.done(), "the linker read its tops while A could still commit an id below them"
        await a.commit()
    assert await asyncio.wait_for(linking, 10) == 2
    rows = await raw(sql_services, "SELECT e.payload FROM audit_links l JOIN events e ON l.record_table = 'events' "
                                   "AND e.id = l.record_id WHERE l.chain_id = :c ORDER BY l.chain_seq DESC LIMIT 2",
                     c=session_chain(session.id))  # fmt: skip
    assert sorted(_json(payload)["note"] for (payload,) in rows) == ["A", "B"]
    report = await ledger_of(sql_services, key).verify(Scope(session_id=session.id), record=False)
    assert report.ok, [f.describe() for f in report.findings]


def _json(value):
    """A JSON column as raw SQL reads it back: text on SQLite, decoded on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.parametrize("sql_services", ["postgresql"], indirect=True)
async def test_a_writer_that_inserts_its_event_before_its_log_row_never_deadlocks_with_the_linker(
    sql_services, git_repo, key
):
    # An approval writes its decision and its events, then its log row (application/sessions/records.py): the
    # reverse of the linker's LOCK TABLE order (transition_log, decisions, events). The linker holding SHARE on
    # transition_log waits for the writer's events; the writer then waits for transition_log. The linker gives way
    # (its short lock timeout, below the deadlock detector's second), the writer commits at once, and the linker,
    # trying again, links the writer's records too.
    [session] = await busy(sql_services, git_repo, sessions=1)
    async with sql_services.uow(write=False) as unit:
        [last] = await unit.transitions.history(session.id, limit=1)
    loop = asyncio.get_running_loop()
    async with sql_services.uow(write=True) as writer:
        await writer.events.append("test.noted", SystemClock().now(), {"note": "W"}, session.id)
        await writer.events.high_water()  # the event's INSERT is sent: ROW EXCLUSIVE on events is held
        async with sql_services.uow(write=True) as other:  # a committed record: the linker has work, takes its lock
            await other.events.append("test.noted", SystemClock().now(), {"note": "B"}, session.id)
            await other.commit()
        linking = asyncio.create_task(link_pending(sql_services.uow))
        await asyncio.sleep(0.1)  # the linker has SHARE on transition_log and waits for events
        began = loop.time()
        await writer.transitions.append(replace(last, seq=None, at=SystemClock().now()))
        await writer.commit()
        waited = loop.time() - began
    assert waited < 0.8, f"the writer waited {waited:.2f} s: the deadlock detector's second, not the linker, ended it"
    assert await asyncio.wait_for(linking, 15) == 3  # B's, and the writer's event and log row once it committed
    report = await ledger_of(sql_services, key).verify(Scope(session_id=session.id), record=False)
    assert report.ok, [f.describe() for f in report.findings]
