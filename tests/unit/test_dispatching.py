"""Dispatch's bounds as pure rules (domain/dispatching.py): which cap refuses a start and in which words, the retry
back-off and its maximum, and a property that accepting only what `refusal` allows never exceeds any cap."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgate.domain.dispatching import MAX_RETRY_DELAY, DispatchCaps, Load, RetryVerdict, refusal, retry_verdict

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def loaded(**counts) -> Load:
    """A Load with project 1 running `running`, the given label and agent counts, and `awaiting`."""
    load = Load()
    load.running[1] = counts.get("running", 0)
    load.labels.update(counts.get("labels", {}))
    load.agents.update(counts.get("agents", {}))
    load.awaiting = counts.get("awaiting", 0)
    return load


def test_no_caps_refuse_nothing_however_much_runs() -> None:
    """0 everywhere is no bound at all."""
    load = loaded(running=50, labels={"bug": 50}, agents={"ok": 50}, awaiting=50)
    assert refusal(DispatchCaps(), load, 1, ["bug"], ["ok"]) is None


def test_max_running_counts_the_project_only() -> None:
    """The project cap refuses at the cap with its message; another project's count does not matter."""
    caps = DispatchCaps(max_running=2)
    assert refusal(caps, loaded(running=1), 1, [], []) is None
    assert refusal(caps, loaded(running=2), 1, [], []) == "no slot: 2 running in the project (max_running 2)"
    assert refusal(caps, loaded(running=2), 2, [], []) is None


def test_a_label_cap_refuses_only_tasks_with_that_label() -> None:
    """A label in the map is bounded; a label not in it (or mapped to 0) is not."""
    caps = DispatchCaps(per_label={"bug": 1, "ui": 0})
    load = loaded(labels={"bug": 1, "ui": 9, "docs": 9})
    assert refusal(caps, load, 1, ["docs", "bug"], []) == ("no slot for label bug: 1 running (max_running_per_label 1)")
    assert refusal(caps, load, 1, ["ui", "docs"], []) is None
    assert refusal(caps, loaded(), 1, ["bug"], []) is None


def test_an_agent_cap_refuses_only_workflows_using_that_preset() -> None:
    """A preset in the map is bounded; one not in it is not."""
    caps = DispatchCaps(per_agent={"claude": 2})
    load = loaded(agents={"claude": 2, "codex": 7})
    assert refusal(caps, load, 1, [], ["codex", "claude"]) == (
        "no slot for agent claude: 2 running (max_running_per_agent 2)"
    )
    assert refusal(caps, load, 1, [], ["codex"]) is None
    assert refusal(caps, loaded(agents={"claude": 1}), 1, [], ["claude"]) is None


def test_a_full_review_queue_refuses_everything_first() -> None:
    """max_awaiting_decision is checked before every other cap, and names the queue."""
    caps = DispatchCaps(max_running=1, max_awaiting_decision=1)
    assert refusal(caps, loaded(running=5, awaiting=1), 1, [], []) == (
        "review queue full: 1 session(s) wait for a decision (max_awaiting_decision 1)"
    )
    assert refusal(DispatchCaps(max_awaiting_decision=2), loaded(awaiting=1), 1, [], []) is None


def test_no_failure_goes() -> None:
    """A task never failed (or with no time of failure) is started at once."""
    caps = DispatchCaps()
    assert retry_verdict(caps, 0, None, NOW) == RetryVerdict(0)
    assert retry_verdict(caps, 0, NOW, NOW).why() == ""


@pytest.mark.parametrize("failures, wait", [(1, 60), (2, 120), (3, 240)])
def test_each_failure_doubles_the_wait_and_after_it_the_task_goes(failures: int, wait: int) -> None:
    """The n-th failure waits retry_base_s × 2^(n-1); a second after that, the verdict is go."""
    caps = DispatchCaps(retry_base_s=60, max_retries=3)
    failed = NOW - timedelta(seconds=wait - 1)
    verdict = retry_verdict(caps, failures, failed, NOW)
    until = failed + timedelta(seconds=wait)
    assert verdict == RetryVerdict(failures, until=until) and not verdict.gave_up
    assert verdict.why() == f"failed {failures} time(s): retried after {until.isoformat(timespec='seconds')}"
    assert retry_verdict(caps, failures, NOW - timedelta(seconds=wait + 1), NOW) == RetryVerdict(failures)


def test_the_wait_is_a_day_at_most() -> None:
    """However large the doubling, the wait stops at MAX_RETRY_DELAY (a day)."""
    caps = DispatchCaps(retry_base_s=3600, max_retries=20)
    assert retry_verdict(caps, 10, NOW, NOW).until == NOW + MAX_RETRY_DELAY == NOW + timedelta(days=1)
    assert retry_verdict(caps, 10, NOW - timedelta(days=1, seconds=1), NOW).until is None


def test_more_failures_than_max_retries_gives_up_whatever_the_time() -> None:
    """max_retries + 1 failed attempts: left to the operator, even long after the last one."""
    caps = DispatchCaps(max_retries=2, retry_base_s=1)
    assert retry_verdict(caps, 2, NOW, NOW).until is not None  # the second retry still waits its turn
    verdict = retry_verdict(caps, 3, NOW - timedelta(days=30), NOW)
    assert verdict.gave_up and verdict.until is None
    assert verdict.why() == (
        "failed 3 time(s), more than max_retries allows: dispatch stopped and leaves it to the operator "
        "(look at why, then `taskgate session start` it)"
    )


PROJECTS, LABELS, AGENTS = [1, 2, 3], ["bug", "ui", "docs"], ["ok", "claude", "codex"]
tasks = st.lists(
    st.tuples(
        st.sampled_from(PROJECTS),
        st.lists(st.sampled_from(LABELS), max_size=3),
        st.lists(st.sampled_from(AGENTS), max_size=3),
    ),
    max_size=40,
)
cap_maps = lambda names: st.dictionaries(st.sampled_from(names), st.integers(0, 4))  # noqa: E731


@settings(max_examples=300, deadline=None)
@given(tasks, st.integers(0, 5), cap_maps(LABELS), cap_maps(AGENTS))
def test_accepting_only_what_refusal_allows_never_exceeds_a_cap(sequence, max_running, per_label, per_agent) -> None:
    """Whatever the tasks and the caps: after a pass that starts a task only when `refusal` says None (and adds it
    to the load), no project, label or agent runs more than its cap (when it has one)."""
    caps = DispatchCaps(max_running=max_running, per_label=per_label, per_agent=per_agent)
    load, started = Load(), []
    for project, labels, agents in sequence:
        if refusal(caps, load, project, labels, agents) is None:
            load.add(project, labels, agents)
            started.append((project, set(labels), set(agents)))
    by_project = Counter(p for p, _, _ in started)
    by_label = Counter(label for _, labels, _ in started for label in labels)
    by_agent = Counter(agent for _, _, agents in started for agent in agents)
    assert (by_project, by_label, by_agent) == (load.running, load.labels, load.agents)
    assert all(n <= max_running for n in by_project.values()) or not max_running
    assert all(n <= per_label[k] for k, n in by_label.items() if per_label.get(k))
    assert all(n <= per_agent[k] for k, n in by_agent.items() if per_agent.get(k))
    if not (max_running or any(per_label.values()) or any(per_agent.values())):
        assert len(started) == len(sequence)  # no cap: everything starts
