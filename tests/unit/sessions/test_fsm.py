"""The transition table as data: complete, consistent, and drawn from itself."""

from collections import deque

import pytest

from taskgate.domain.session_fsm import (
    TRANSITIONS,
    allowed_triggers,
    find_transition,
    prior_state_after,
    to_mermaid,
)
from taskgate.domain.states import (
    SUSPENDABLE_STATES,
    TERMINAL_STATES,
    WIP_STATES,
    SessionState,
    Trigger,
)

S, T = SessionState, Trigger


def successors(state: SessionState) -> set[SessionState]:
    return {row.dest for row in TRANSITIONS if state in row.sources}


def reachable_from(start: SessionState) -> set[SessionState]:
    seen, queue = {start}, deque([start])
    while queue:
        for nxt in successors(queue.popleft()) - seen:
            seen.add(nxt)
            queue.append(nxt)
    return seen


def test_the_table_has_the_fifteen_states_of_the_design():
    assert len(SessionState) == 15
    assert {s.value for s in TERMINAL_STATES} == {"completed", "cancelled"}


def test_every_trigger_of_the_design_has_at_least_one_row():
    assert {row.trigger for row in TRANSITIONS} == set(Trigger)


def test_every_state_is_reachable_from_created():
    assert reachable_from(S.CREATED) == set(SessionState)


def test_every_non_terminal_state_can_still_reach_a_terminal_state():
    for state in set(SessionState) - TERMINAL_STATES:
        assert reachable_from(state) & TERMINAL_STATES, state


def test_terminal_states_have_no_way_out():
    for state in TERMINAL_STATES:
        assert successors(state) == set()
        assert allowed_triggers(state, None) == []


def test_each_state_and_trigger_selects_at_most_one_row():
    for state in SessionState:
        for prior in [None, *SUSPENDABLE_STATES]:
            for trigger in Trigger:
                rows = [r for r in TRANSITIONS if r.trigger == trigger and r.allows(state, prior)]
                assert len(rows) <= 1, (state, prior, trigger)


@pytest.mark.parametrize("prior", sorted(SUSPENDABLE_STATES))
def test_resume_returns_to_the_state_the_session_was_suspended_from(prior):
    suspend = find_transition(prior, T.SUSPEND, None)
    assert suspend is not None and suspend.dest == S.SUSPENDED
    remembered = prior_state_after(suspend, prior, None)
    resume = find_transition(S.SUSPENDED, T.RESUME, remembered)
    assert remembered == prior and resume is not None and resume.dest == prior
    assert prior_state_after(resume, S.SUSPENDED, remembered) is None


def test_resume_from_abandoned_goes_to_ready():
    assert find_transition(S.ABANDONED, T.RESUME, None).dest == S.READY


def test_a_trigger_not_in_the_table_for_a_state_finds_no_row():
    assert find_transition(S.CREATED, T.APPROVE, None) is None
    assert find_transition(S.SUSPENDED, T.RESUME, None) is None  # nothing remembered, nowhere to go


def test_start_retry_and_resume_enter_the_wip_window_but_moves_inside_it_do_not():
    entering = {(r.trigger, r.dest) for r in TRANSITIONS if r.enters_wip}
    assert (T.START, S.PLANNING) in entering and (T.RETRY, S.EXECUTING) in entering
    assert find_transition(S.PLANNING, T.PLAN_COMPLETE, None).enters_wip is False
    assert find_transition(S.SUSPENDED, T.RESUME, S.EXECUTING).enters_wip is True
    assert all(r.dest in WIP_STATES for r in TRANSITIONS if r.enters_wip)


def test_the_mermaid_diagram_has_one_edge_per_source_of_every_row():
    diagram = to_mermaid()
    assert diagram.startswith("stateDiagram-v2")
    for row in TRANSITIONS:
        for src in row.sources:
            assert f"    {src.value} --> {row.dest.value}: {row.trigger.value}" in diagram
    edges = [line for line in diagram.splitlines() if line.startswith("    ") and "-->" in line and "[*]" not in line]
    edges = [line for line in edges if not line.startswith("        ")]  # the pull request's sub-states, nested
    assert len(edges) == sum(len(r.sources) for r in TRANSITIONS)


def test_the_diagram_nests_the_pull_request_sub_states_in_awaiting_merge():
    from taskgate.domain.forge import SUBSTATES

    diagram = to_mermaid()
    nested = diagram.split("    state awaiting_merge {\n", 1)[1].split("\n    }", 1)[0].splitlines()
    assert nested[0] == "        [*] --> pr_pushing"
    assert nested[1:] == [f"        pr_{a.value} --> pr_{b.value}: {what}" for a, b, what in SUBSTATES]
