"""Audit retention (issue 21), on SQLite and PostgreSQL: `prune` removes the records written before a time of
finished sessions only (and the webhook deliveries of those events), behind an anchor per chain in a checkpoint it
signs in the same transaction; what remains verifies from the anchors on, and an edit of it is still caught. A dry
run, a prune without the signing key and a prune with a time without a zone write nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from taskgate.application.audit.ledger import Scope
from taskgate.application.audit.linking import link_pending
from taskgate.application.operators.decisions import Decide
from taskgate.application.webhooks.outbox import Subscriber, WebhookDispatcher
from taskgate.domain.audit.chain import session_chain
from taskgate.domain.audit.checkpoints import Checkpoint
from taskgate.domain.entities import Session
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.webhooks import HttpWebhookSender
from tests.audit_support import (
    AUDITED_TABLES,
    ledger_of,
    new_signer,
    problems,
    raw,
    record_count,
    stored_time,
    whole_chains,
)
from tests.builders import OPERATOR, fire, seed, start
from tests.conftest import Services

PK = {"transition_log": "seq", "decisions": "id", "events": "id"}


@dataclass
class History:
    completed: Session  # approved by a decision, merged and cleaned up, all before `before`
    late: Session  # worked on before `before`, cancelled after it
    running: Session  # worked on before `before`, still running
    before: datetime


async def make_history(svc: Services, repo) -> History:
    seeded = await seed(svc, repo, tasks=3)
    completed = await fire(svc, await start(svc, seeded.tasks[0]), "plan_complete", "work_complete")
    await svc.decisions.decide(Decide(completed.id, OPERATOR, "approve", reason="looks good"))
    completed = await fire(svc, completed, "merge")  # merged, then cleaned up: completed
    assert completed.state == SessionState.COMPLETED
    late = await fire(svc, await start(svc, seeded.tasks[1]), "plan_complete")
    running = await fire(svc, await start(svc, seeded.tasks[2]), "plan_complete")
    await svc.access.create_operator_token(OPERATOR, "ci")  # a global record before the time
    before = SystemClock().now()
    late = await fire(svc, late, "cancel")
    running = await fire(svc, running, "suspend")
    await link_pending(svc.uow)  # as `taskgate serve` does within a second
    return History(completed, late, running, before)


async def records_of(svc: Services, session_id: str, *, before: datetime | None = None) -> dict[str, int]:
    """A session's records per table (those written before `before`, if given)."""
    counts = {}
    for table in AUDITED_TABLES:
        stamps = [stored_time(at) for (at,) in await raw(svc, f"SELECT at FROM {table} WHERE session_id = :s",
                                                         s=session_id)]  # fmt: skip
        counts[table] = len([at for at in stamps if before is None or at < before])
    return counts


async def global_records(svc: Services) -> int:
    return (await raw(svc, "SELECT count(*) FROM events WHERE session_id IS NULL"))[0][0]


async def link_at(svc: Services, chain: str, seq: int) -> tuple[str, int, str]:
    rows = await raw(svc, "SELECT record_table, record_id, hash FROM audit_links "
                          "WHERE chain_id = :c AND chain_seq = :s", c=chain, s=seq)  # fmt: skip
    return rows[0]


@dataclass
class Expected:
    """What a prune at `History.before` must remove and keep, read before it runs."""

    removed: dict[str, int]  # per table: the completed session's and the late one's records before the time
    kept: dict[str, dict[str, int]]  # per session: its records per table after the prune
    anchors: dict[str, tuple[int, str]]  # per pruned chain: the seq and hash of its last record removed
    lengths: dict[str, int]  # every chain's length before the prune
    globals: int  # records of no session
    events: set[int]  # every event's id
    pruned_events: set[int]  # the events the prune removes


async def expected_prune(svc: Services, h: History) -> Expected:
    old = {s.id: await records_of(svc, s.id, before=h.before) for s in (h.completed, h.late)}
    kept = {s.id: await records_of(svc, s.id) for s in (h.late, h.running)} | {
        h.completed.id: dict.fromkeys(AUDITED_TABLES, 0)
    }
    kept[h.late.id] = {t: n - old[h.late.id][t] for t, n in kept[h.late.id].items()}  # its cancel stays
    lengths = await whole_chains(svc)
    upto = {
        session_chain(h.completed.id): lengths[session_chain(h.completed.id)],
        session_chain(h.late.id): sum(old[h.late.id].values()),
    }  # the records before the time come first
    anchors = {chain: (seq, (await link_at(svc, chain, seq))[2]) for chain, seq in upto.items()}
    events = await raw(svc, "SELECT id, session_id, at FROM events")
    finished = (h.completed.id, h.late.id)
    pruned = {i for i, session, at in events if session in finished and stored_time(at) < h.before}
    removed = {t: old[h.completed.id][t] + old[h.late.id][t] for t in AUDITED_TABLES}
    return Expected(removed, kept, anchors, lengths, await global_records(svc), {i for i, _s, _a in events}, pruned)


async def test_prune_removes_finished_sessions_records_before_the_time_behind_a_signed_anchor(
    sql_services, git_repo, tmp_path
):
    svc, h = sql_services, await make_history(sql_services, git_repo)
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    await ledger.checkpoint()
    hook = Subscriber("auditor", "http://127.0.0.1:9/hook", "s3cret", backfill="all")
    await WebhookDispatcher(svc.uow, SystemClock(), HttpWebhookSender(), [hook]).enqueue_new()  # one per event
    await raw(svc, "UPDATE webhook_deliveries SET status = 'delivered'")  # the outbox is done with them
    expected = await expected_prune(svc, h)
    assert await delivered_events(svc) == expected.events and expected.pruned_events

    report = await ledger.prune(h.before)

    assert (report.sessions, report.dry_run, report.checkpoint, report.records) == (2, False, 2, expected.removed)
    for session, kept in expected.kept.items():  # the late session's cancel stays; a running one is untouched
        assert await records_of(svc, session) == kept, session
    assert await global_records(svc) == expected.globals + 1  # untouched, and the audit.pruned event
    assert await delivered_events(svc) == expected.events - expected.pruned_events
    links = await raw(svc, "SELECT chain_id, min(chain_seq), count(*) FROM audit_links GROUP BY chain_id")
    remaining = {chain: (first, count) for chain, first, count in links}
    for chain, (seq, _hash) in expected.anchors.items():  # each resumes after its anchor, if anything remains
        length = expected.lengths[chain]
        assert remaining.get(chain, (seq + 1, 0)) == (seq + 1, length - seq)
    cps = await raw(svc, "SELECT number, reason, body FROM audit_checkpoints ORDER BY number")
    assert [(n, reason) for n, reason, _ in cps] == [(1, "demand"), (2, "prune")]
    assert dict(Checkpoint.parse(cps[-1][2].encode()).anchors) == expected.anchors
    after = await ledger.verify(Scope(), record=False)
    assert after.ok and after.records == await record_count(svc), problems(after)

    # a later prune takes the late session's cancel too, moving its anchor on; every chain still verifies
    again = await ledger.prune(SystemClock().now() + timedelta(seconds=1))
    assert (again.sessions, again.checkpoint) == (1, 3)
    assert await records_of(svc, h.late.id) == dict.fromkeys(AUDITED_TABLES, 0)
    final = await ledger.verify(Scope(), record=False)
    assert final.ok and final.records == await record_count(svc), problems(final)


async def test_a_prune_reads_its_sessions_a_chunk_at_a_time_with_the_same_outcome(
    sql_services, git_repo, tmp_path, monkeypatch
):
    # The prunable records are read _PRUNE_CHUNK sessions per query (500) and deleted _IDS_CHUNK records per
    # statement (5,000); one session and one record each here, so the two finished sessions above take two reads
    # and a delete per record: the same removals, anchors, checkpoints and verify.
    monkeypatch.setattr("taskgate.infrastructure.db.audit_store._PRUNE_CHUNK", 1)
    monkeypatch.setattr("taskgate.infrastructure.db.audit_store._IDS_CHUNK", 1)
    await test_prune_removes_finished_sessions_records_before_the_time_behind_a_signed_anchor(
        sql_services, git_repo, tmp_path
    )


async def test_a_record_deleted_after_a_prune_is_still_caught(sql_services, git_repo, tmp_path):
    svc, h = sql_services, await make_history(sql_services, git_repo)
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    await ledger.prune(h.before)
    chain = session_chain(h.late.id)
    first = (await raw(svc, "SELECT min(chain_seq) FROM audit_links WHERE chain_id = :c", c=chain))[0][0]
    table, record_id, _hash = await link_at(svc, chain, first)

    await raw(svc, f"DELETE FROM {table} WHERE {PK[table]} = :i", i=record_id)
    missing = await ledger.verify(Scope(), record=False)
    assert [(f.where, f.chain, f.seq) for f in missing.findings] == [(f"{table} {record_id}", chain, first)]
    assert "is missing" in missing.findings[0].problem

    # the careful forger removes its link too, as if the prune had taken it: the next record follows nothing
    await raw(svc, "DELETE FROM audit_links WHERE chain_id = :c AND chain_seq = :s", c=chain, s=first)
    gap = await ledger.verify(Scope(), record=False)
    assert [(f.chain, f.seq) for f in gap.findings] == [(chain, first + 1)]
    assert f"follows no record: #{first} of its chain is missing" in gap.findings[0].problem


async def test_a_dry_run_a_prune_without_the_key_and_a_time_without_a_zone_write_nothing(
    sql_services, git_repo, tmp_path
):
    svc, h = sql_services, await make_history(sql_services, git_repo)
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    old = [await records_of(svc, s.id, before=h.before) for s in (h.completed, h.late)]
    before = await svc.snapshot()

    report = await ledger.prune(h.before, dry_run=True)
    assert (report.sessions, report.dry_run, report.checkpoint) == (2, True, None)
    assert report.records == {"total": sum(sum(counts.values()) for counts in old)}
    assert await svc.snapshot() == before

    with pytest.raises(InvalidInput, match="no audit signing key here"):
        await ledger_of(svc, None).prune(h.before)
    assert await svc.snapshot() == before

    with pytest.raises(InvalidInput, match="--before must carry a timezone"):
        await ledger.prune(h.before.replace(tzinfo=None))
    assert await svc.snapshot() == before


async def delivered_events(svc: Services) -> set[int]:
    return {row[0] for row in await raw(svc, "SELECT event_id FROM webhook_deliveries WHERE subscriber = 'auditor'")}


async def test_a_prune_does_not_make_a_subscriber_lose_the_events_it_has_not_scanned_yet(
    sql_services, git_repo, tmp_path
):
    svc = sql_services
    seeded = await seed(svc, git_repo, tasks=2)
    finished = await start(svc, seeded.tasks[0])
    waiting = await fire(svc, await start(svc, seeded.tasks[1]), "plan_complete", "work_complete")
    await fire(svc, finished, "cancel")  # the newest events are the finished session's
    hook = Subscriber("decisions", "http://127.0.0.1:9/hook", "s3cret", events=("decision.*",))
    dispatcher = WebhookDispatcher(svc.uow, SystemClock(), HttpWebhookSender(), [hook])
    await dispatcher.enqueue_new()  # a new subscriber: it starts after the newest event, with a `start` marker
    marked = await raw(svc, "SELECT e.session_id FROM webhook_deliveries d JOIN events e ON e.id = d.event_id")
    assert marked == [(finished.id,)]
    await svc.decisions.decide(Decide(waiting.id, OPERATOR, "approve"))  # decision.recorded: for the subscriber
    wanted = {row[0] for row in await raw(svc, "SELECT id FROM events WHERE kind LIKE 'decision.%'")}

    await ledger_of(svc, new_signer(tmp_path / "keys")).prune(SystemClock().now())
    await dispatcher.enqueue_new()

    pending = await raw(svc, "SELECT event_id FROM webhook_deliveries WHERE status = 'pending'")
    assert wanted and wanted <= {row[0] for row in pending}


async def test_a_prune_waits_for_the_webhook_deliveries_still_pending(sql_services, git_repo, tmp_path):
    """An event a subscriber has not received yet is kept, and its chain is pruned only up to the record before it;
    once delivered, the next prune removes it."""
    svc = sql_services
    seeded = await seed(svc, git_repo, tasks=1)
    done = await fire(svc, await start(svc, seeded.tasks[0]), "cancel")
    hook = Subscriber("late", "http://127.0.0.1:9/hook", "s3cret", backfill="all")
    await WebhookDispatcher(svc.uow, SystemClock(), HttpWebhookSender(), [hook]).enqueue_new()
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    await link_pending(svc.uow)
    first_event = await raw(
        svc,
        "SELECT min(chain_seq) FROM audit_links WHERE chain_id = :c AND record_table = 'events'",
        c=session_chain(done.id),
    )
    report = await ledger.prune(SystemClock().now())
    kept = await raw(svc, "SELECT min(chain_seq) FROM audit_links WHERE chain_id = :c", c=session_chain(done.id))
    assert kept[0][0] == first_event[0][0]  # pruned, if at all, only up to the record before the first pending event
    assert (await ledger.verify(Scope(), record=False)).ok
    await raw(svc, "UPDATE webhook_deliveries SET status = 'delivered' WHERE event_id NOT IN "
                   "(SELECT max(event_id) FROM webhook_deliveries)")  # fmt: skip
    report = await ledger.prune(SystemClock().now())
    assert report.records["events"] > 0
    assert (await ledger.verify(Scope(), record=False)).ok


async def test_records_taking_ids_a_prune_freed_are_linked_too(sql_services, git_repo, tmp_path):
    """SQLite hands the largest rowid out again once its row is deleted: when a prune removes a table's newest
    records, the next ones take their ids, below the linker's mark. The prune brings the mark down with them."""
    svc = sql_services
    seeded = await seed(svc, git_repo, tasks=1)
    done = await fire(svc, await start(svc, seeded.tasks[0]), "plan_complete", "cancel")  # the newest records
    await link_pending(svc.uow)
    [[newest]] = await raw(svc, "SELECT max(id) FROM events")
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    assert (await ledger.prune(SystemClock().now())).records["events"] > 0
    assert await records_of(svc, done.id) == dict.fromkeys(AUDITED_TABLES, 0)
    async with svc.uow(write=True) as uow:  # a record after the prune (its own audit.pruned event is one too)
        await uow.events.append("test.noted", SystemClock().now(), {"after": "prune"})
        await uow.commit()
    [[top]] = await raw(svc, "SELECT max(id) FROM events")
    if svc.backend == "sqlite":
        assert top <= newest, "the new records did not take the ids the prune freed: this test proves nothing"
    report = await ledger.verify(Scope(), record=False)
    assert report.ok and report.linked_now >= 2, [f.describe() for f in report.findings]  # not left "has no link"


async def test_a_linker_with_tops_read_before_a_prune_links_the_ids_it_freed(sql_services, git_repo, tmp_path):
    """Tops read before a prune that freed the largest ids must not lift a mark over them once they are given out
    again (SQLite): every record written after the prune is linked, none is left "has no link"."""
    svc = sql_services
    seeded = await seed(svc, git_repo, tasks=1)
    await fire(svc, await start(svc, seeded.tasks[0]), "plan_complete", "cancel")
    async with svc.uow(write=False) as unit:
        older = await unit.audit.committed_tops()  # the newest records' ids among them
    assert older is not None
    await link_pending(svc.uow)
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    await ledger.prune(SystemClock().now())
    for note in ("one", "two", "three"):
        async with svc.uow(write=True) as uow:
            await uow.events.append("test.noted", SystemClock().now(), {"note": note})
            await uow.commit()
        if note == "one":
            async with svc.uow(write=True) as unit:
                await unit.audit.link_pending(older, 500)
                await unit.commit()
    report = await ledger.verify(Scope(), record=False)
    assert report.ok, [f.describe() for f in report.findings]
