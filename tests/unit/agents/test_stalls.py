"""ProgressWatch: what counts as progress, and when an agent is stalled (pure)."""

from __future__ import annotations

import pytest

from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.stalls import ProgressWatch
from taskgate.domain.errors import InvalidInput

CODEX = PRESETS["codex"].agent_type().stall_patterns


def test_lines_of_output_are_progress_but_retry_notices_and_blank_lines_are_not():
    watch = ProgressWatch(10, CODEX, now=0)
    watch.output('{"type":"turn.started"}\n', now=3)
    assert watch.last_progress == 3 and not watch.stalled(12.9) and watch.stalled(13)
    watch.output('{"type":"error","message":"Reconnecting... 2/5 (stream disconnected)"}\n\n  \n', now=8)
    watch.output('{"type":"error","message":"Reconnecting... waiting for network"}\r\n', now=12)
    assert watch.last_progress == 3 and watch.stalled(13)
    assert watch.describe(13) == (
        "stalled: no progress for 10 s (only retry notices, the last: "
        '\'{"type":"error","message":"Reconnecting... waiting for network"}\')'
    )


def test_a_line_is_judged_once_it_is_complete_even_across_chunks():
    watch = ProgressWatch(10, ["Retrying in"], now=0)
    watch.output("Retry", now=1)
    watch.output("ing in 2.0 seconds...", now=2)
    assert watch.last_progress == 0  # incomplete: not judged yet
    watch.output("\nedited app.py", now=3)
    assert watch.last_progress == 0
    watch.output("\n", now=4)
    assert watch.last_progress == 4 and watch.last_retry is None


def test_heartbeats_and_tool_calls_are_progress_and_stall_s_zero_never_stalls():
    watch = ProgressWatch(5, [], now=0)
    watch.progress(4)
    assert not watch.stalled(8.9) and watch.stalled(9)
    assert not ProgressWatch(0, [], now=0).stalled(10**9)


def test_bad_stall_settings_are_refused_by_name():
    with pytest.raises(InvalidInput, match=r"agents.x.stall_patterns: '\(' is not a regular expression"):
        AgentType("x", ("true",), stall_patterns=("(",))
    with pytest.raises(InvalidInput, match=r"agents\.x\.stall_s must be 0"):
        AgentType("x", ("true",), stall_s=-1)


def test_each_cli_preset_has_patterns_and_a_stall_s_in_minutes():
    for name in ("claude", "codex", "aider"):
        kind = PRESETS[name].agent_type()
        assert kind.stall_patterns and 60 <= kind.stall_s < kind.timeout_s
