"""Authorisation rules and bearer tokens."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from taskgate.domain.access import (
    AGENT_TRIGGERS,
    Capability,
    Principal,
    authorize,
    authorize_operator,
    check_operator_param,
)
from taskgate.domain.entities import Operator
from taskgate.domain.errors import Forbidden
from taskgate.domain.states import Trigger

ALICE = Principal.operator("alice")
AGENT = Principal.agent("tok", "s-1")


@pytest.mark.parametrize("capability", list(Capability))
def test_operators_may_do_everything_this_release_offers(capability):
    authorize(ALICE, capability, session_id="any", trigger=Trigger.MERGE)


@pytest.mark.parametrize("capability", [Capability.READ, Capability.MANAGE, Capability.START, Capability.AUDIT])
def test_agents_may_not_use_operator_capabilities(capability):
    with pytest.raises(Forbidden, match="agent tokens may not"):
        authorize(AGENT, capability)


def test_agents_reach_only_their_own_session_and_only_the_triggers_of_their_work():
    authorize(AGENT, Capability.READ_SESSION, session_id="s-1")
    for trigger in AGENT_TRIGGERS:
        authorize(AGENT, Capability.FIRE, session_id="s-1", trigger=trigger)
    with pytest.raises(Forbidden, match="scoped to session s-1"):
        authorize(AGENT, Capability.READ_SESSION, session_id="s-2")
    for trigger in set(Trigger) - AGENT_TRIGGERS:
        with pytest.raises(Forbidden, match="agents may not fire"):
            authorize(AGENT, Capability.FIRE, session_id="s-1", trigger=trigger)


def test_steering_a_workflow_stack_is_its_own_capability():
    """Agents steer their own session's stack; an operator without `write` is told what was refused, in the
    words of a stack edit rather than of firing triggers."""
    authorize(AGENT, Capability.STEER, session_id="s-1")
    with pytest.raises(Forbidden, match="scoped to session s-1"):
        authorize(AGENT, Capability.STEER, session_id="s-2")
    reviewer = Operator("rita", "Rita", None, ["reviewer"], [], 2, datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(Forbidden, match="may not change a session's workflow stack: it needs the 'write'"):
        authorize_operator(reviewer, Capability.STEER)
    authorize_operator(Operator("dev", "Dev", None, ["developer"], [], 2, reviewer.created_at), Capability.STEER)


def test_an_operator_parameter_must_match_the_caller():
    assert check_operator_param(ALICE, None) == "alice"
    assert check_operator_param(ALICE, "alice") == "alice"
    with pytest.raises(Forbidden, match="does not match the caller"):
        check_operator_param(ALICE, "mallory")
    with pytest.raises(Forbidden):
        check_operator_param(AGENT, "alice")
