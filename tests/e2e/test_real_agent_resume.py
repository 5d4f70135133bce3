"""The REAL Claude Code and Codex CLIs, through their presets as shipped, continue their own conversation when the
operator requests changes: the scripted model server sees the first run's messages in the second run's requests,
and the run record names the conversation continued (docs/agents.md, resuming). Offline, configured only by the
variables a user sets (tests/e2e/test_real_agents_in_sessions.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_real_agents_in_sessions import session_for, set_up
from tests.support.model_server import ModelServer

INSTRUCTIONS = "Also write goodbye.txt"


def first_prompt(request: dict) -> str:
    """The request's whole conversation as text (Claude Code: `messages`; Codex: `input`)."""
    body = request["body"]
    return json.dumps(body.get("messages") or body.get("input") or [])


def request_changes(user, sid: str) -> None:
    user.ok("session", "decide", sid, "request_changes", "--reason", "more", "--instructions", INSTRUCTIONS)


# confined (the sandbox's per-session HOME and the session folder keep the conversation) and unconfined (the
# user's HOME keeps Claude Code's)
@pytest.mark.parametrize(("cli", "sandbox"), [("claude", "auto"), ("codex", "auto"), ("claude", "off")])
def test_request_changes_continues_the_clis_own_conversation_and_the_record_names_it(
    tmp_path: Path, cli: str, sandbox: str
):
    with ModelServer("ok") as model:
        user = set_up(tmp_path, cli, model, table=f'[sandbox]\nmode = "{sandbox}"\n')
        sid = session_for(user, "Say hello")
        user.ok("session", "execute", sid, "--agent", cli)
        first_run = len(model.model_requests())
        request_changes(user, sid)
        requests = model.model_requests()
    status = user.json("session", "status", sid)
    assert status["state"] == "verifying", status
    first, second = sorted(status["agents"], key=lambda a: a["run"])
    assert first["conversation_id"] and first["resumed_from"] is None
    assert second["resumed_from"] == first["conversation_id"], second  # the run record names what it continued
    assert second["status"] == "completed" and second["resume_failed"] is None, second
    assert sandbox == "auto" or (second["sandbox"] or "").startswith("off"), second["sandbox"]  # auto: bwrap if any
    # the second run's requests carry the first run's conversation: its task prompt and the hello.txt it wrote
    later = [first_prompt(r) for r in requests[first_run:]]
    continuing = [text for text in later if INSTRUCTIONS in text]
    assert continuing, later
    assert any("Say hello" in text and "hello.txt" in text for text in continuing), continuing[0][:2000]
    # it was told what changed, not the task again: the instructions appear once, in the new turn
    assert all(text.count("continuing your earlier work") == 1 for text in continuing)
    # its usage is the rerun's own (Codex reports the whole thread's after `exec resume`: taskgate takes the first
    # run's share off), as the server counted it
    assert second["report"]["input_tokens"] == sum(r["input_tokens"] for r in requests[first_run:]), second["report"]
    assert first["report"]["input_tokens"] == sum(r["input_tokens"] for r in requests[:first_run]), first["report"]
    shown = user.ok("session", "show", sid)
    assert f"[continued conversation {first['conversation_id']}]" in shown, shown


def test_a_conversation_gone_runs_afresh_and_the_record_says_why(tmp_path: Path):
    with ModelServer("ok") as model:
        user = set_up(tmp_path, "codex", model)
        sid = session_for(user, "Say hello")
        user.ok("session", "execute", sid, "--agent", "codex")
        [agent] = user.json("session", "status", sid)["agents"]
        for rollout in (Path(agent["output_path"]).parent / f"{agent['id']}.codex" / "sessions").rglob("*.jsonl"):
            rollout.unlink()  # Codex's record of the thread, lost
        request_changes(user, sid)
    status = user.json("session", "status", sid)
    second = max(status["agents"], key=lambda a: a["run"])
    assert status["state"] == "verifying" and second["status"] == "completed", status
    assert second["resumed_from"] is None and agent["conversation_id"] in second["resume_failed"], second
    assert second["conversation_id"] not in (None, agent["conversation_id"])
