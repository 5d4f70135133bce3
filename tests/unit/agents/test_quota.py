"""Quota errors per CLI (domain/agents/quota.py with each preset's `quota_patterns`): recognised at the end of a failed
run's log, never in the agent's own words earlier on, and the back-off doubles up to its cap."""

from __future__ import annotations

import json

import pytest

from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.quota import QUOTA_RETRIED, backoff_s, quota_error, superseded
from taskgate.domain.entities import Agent, AgentStatus

CLAUDE_RETRY = json.dumps({"type": "system", "subtype": "api_retry", "attempt": 3, "error_status": 429,
                           "error": "rate_limit"})  # fmt: skip
CLAUDE_LIMIT = json.dumps({"type": "result", "is_error": True, "result": "Claude AI usage limit reached|1764410400"})
CODEX_ERROR = json.dumps({"type": "error", "message": "exceeded retry limit, last status: 429 Too Many Requests"})
CODEX_FAILED = json.dumps({"type": "turn.failed", "error": {"message": "You exceeded your current quota"}})
AIDER = 'litellm.RateLimitError: AnthropicException - {"type":"rate_limit_error"}'


@pytest.mark.parametrize(
    ("preset", "line"),
    [("claude", CLAUDE_RETRY), ("claude", CLAUDE_LIMIT), ("codex", CODEX_ERROR), ("codex", CODEX_FAILED),
     ("aider", AIDER)],
)  # fmt: skip
def test_each_clis_quota_error_is_recognised_at_the_end_of_its_log(preset, line):
    log = f"some output\n{line}\n"
    assert quota_error(PRESETS[preset].quota_patterns, log) == line.strip()


@pytest.mark.parametrize("preset", ["claude", "codex", "aider"])
def test_other_failures_and_talk_of_rate_limits_long_before_the_end_are_not_quota_errors(preset):
    patterns = PRESETS[preset].quota_patterns
    other = json.dumps({"type": "result", "is_error": True, "result": "API Error: 500 overloaded"})
    assert quota_error(patterns, f"{other}\n") is None
    early = "\n".join([AIDER, CLAUDE_LIMIT, CODEX_ERROR, *(["working…"] * 50)])
    assert quota_error(patterns, early) is None


def test_a_long_event_is_cut_around_what_matched():
    line = json.dumps({"usage": "x" * 1000, "api_error_status": 429, "type": "result"})
    found = quota_error(PRESETS["claude"].quota_patterns, line)
    assert found is not None and len(found) == 300 and '"api_error_status": 429' in found


def test_the_back_off_doubles_each_attempt_up_to_its_cap():
    assert [backoff_s(30, n) for n in (1, 2, 3)] == [30, 60, 120]
    assert backoff_s(30, 20) == 900


def test_an_agent_relaunched_after_a_quota_wait_is_superseded_not_failed():
    agent = Agent("a", "s", "claude", ["claude"], AgentStatus.CANCELLED, error=f"{QUOTA_RETRIED}after a wait: 429")
    assert superseded(agent)
    assert not superseded(Agent("a", "s", "claude", ["claude"], AgentStatus.FAILED, error=agent.error))
