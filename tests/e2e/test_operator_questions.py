"""The REAL Claude Code, through the `claude` preset as shipped, asks the operator: a Bash command its preset does not
allow outright becomes a permission prompt (`--permission-prompt-tool mcp__taskgate__permission_prompt`), then it
calls `ask_operator`. The operator answers from a second terminal (`taskgate session answer`), or nobody does and
`[questions] timeout_s` passes; the scripted model server sees what the agent was told, and the audit export has every
question and answer with who gave it. The console's answer is driven in Chromium in test_console_questions.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from tests.e2e.test_init import TASKGATE, User, git
from tests.e2e.test_real_agents_in_sessions import session_for, set_up
from tests.support.model_server import ASK_ARGUMENTS, ModelServer

TIMEOUT_S = 120


def execute_in_background(user: User, sid: str) -> subprocess.Popen[str]:
    """`taskgate session execute SID --agent claude` in a terminal of its own: it blocks while the agent runs."""
    return subprocess.Popen([TASKGATE, "session", "execute", sid, "--agent", "claude"], cwd=user.repo, env=user.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def next_question(user: User, sid: str, seen: set[str], launcher: subprocess.Popen[str]) -> dict:
    """The next open question of the session, as a second terminal sees it (`session questions --json`)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for question in user.json("session", "questions"):
            if question["session_id"] == sid and question["id"] not in seen:
                seen.add(question["id"])
                return question
        if launcher.poll() is not None:
            raise AssertionError(f"the agent ended without asking: {launcher.communicate()}")
        time.sleep(0.2)
    raise AssertionError("no question within the time")


def tool_results(model: ModelServer) -> list[str]:
    """The tool results the agent sent back to the model, in order (what taskgate's answers became)."""
    last = model.model_requests()[-1]["body"]["messages"]
    results = []
    for message in last:
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                results.append(content if isinstance(content, str) else json.dumps(content))
    return results


def question_events(user: User, sid: str) -> list[tuple[str, dict]]:
    """(kind, payload) of the question.* events in the session's audit export (each a hash-chained record)."""
    found = []
    for line in user.ok("audit", "export", "--session", sid).splitlines():
        record = json.loads(line)
        fields = record.get("fields") or {}
        if record.get("type") == "record" and record.get("table") == "events":
            kind, payload = fields.get("kind") or "", fields.get("payload")
            if kind.startswith("question."):
                found.append((kind, json.loads(payload) if isinstance(payload, str) else payload))
    return found


def test_a_permission_prompt_and_a_question_answered_from_another_terminal_reach_the_agent(tmp_path: Path):
    with ModelServer("ask") as model:
        user = set_up(tmp_path, "claude", model)
        sid = session_for(user, "Pick a colour")
        launcher = execute_in_background(user, sid)
        seen: set[str] = set()
        try:
            permission = next_question(user, sid, seen, launcher)
            assert permission["kind"] == "permission" and permission["tool_name"] == "Bash", permission
            assert "asked.txt" in permission["tool_input"]  # the command the agent wants to run, shown
            shown = user.ok("session", "show", sid)
            assert "waiting_for_operator" in shown and "may the agent use Bash?" in shown, shown
            began = time.monotonic()
            user.ok("session", "answer", sid, "allow")
            question = next_question(user, sid, seen, launcher)
            took_permission = time.monotonic() - began
            assert (question["kind"], question["text"]) == ("question", ASK_ARGUMENTS["question"])
            assert question["choices"] == ASK_ARGUMENTS["choices"]
            refused = user.fails("session", "answer", sid, "green")
            assert "takes one of 'red', 'blue'" in refused, refused
            began = time.monotonic()
            user.ok("session", "answer", sid, "blue")
            out, err = launcher.communicate(timeout=TIMEOUT_S)
            took_answer = time.monotonic() - began
        finally:
            if launcher.poll() is None:
                launcher.kill()
        assert launcher.returncode == 0, (out, err)
        results = tool_results(model)
    assert user.json("session", "status", sid)["state"] == "verifying"
    worktree = Path(user.json("session", "status", sid)["worktree_path"])
    assert "feat: asked" in git(worktree, "log", "--format=%s").splitlines()  # the allowed command ran; committed
    assert (worktree / "asked.txt").read_text() == "asked"
    assert any('"blue"' in r or r == "blue" for r in results), results  # the answer reached the agent
    history = user.json("session", "questions", sid)
    me = history[0]["answered_by"]
    assert me.startswith("operator:")
    assert {(q["kind"], q["status"], q["answer"], q["answered_by"]) for q in history} == {
        ("permission", "answered", "allow", me),
        ("question", "answered", "blue", me),
    }
    events = question_events(user, sid)
    kinds = [k for k, _ in events]
    assert kinds.count("question.asked") == 2 and kinds.count("question.answered") == 2, kinds
    assert {p["answered_by"] for k, p in events if k == "question.answered"} == {me}
    print(
        f"permission answered → next question asked: {took_permission:.2f} s; answer → agent done: {took_answer:.2f} s"
    )


def test_an_unanswered_permission_and_question_time_out_and_the_agent_carries_on(tmp_path: Path):
    with ModelServer("ask") as model:
        user = set_up(tmp_path, "claude", model, table="[questions]\ntimeout_s = 3\n")
        sid = session_for(user, "Pick a colour")
        began = time.monotonic()
        done = user.run("session", "execute", sid, "--agent", "claude")
        took = time.monotonic() - began
        results = tool_results(model)
    assert done.returncode == 0, done.stderr
    assert user.json("session", "status", sid)["state"] == "verifying"
    assert 6 <= took < 90, took  # two questions, 3 s each
    history = user.json("session", "questions", sid)
    assert [(q["kind"], q["status"], q["answered_by"]) for q in reversed(history)] == [
        ("permission", "timed_out", "policy"),
        ("question", "timed_out", "policy"),
    ]
    assert any("did not answer in time" in r for r in results), results  # the permission denied, then the question
    worktree = Path(user.json("session", "status", sid)["worktree_path"])
    assert not (worktree / "asked.txt").exists()  # the command that was never allowed did not run
    kinds = [k for k, _ in question_events(user, sid)]
    assert kinds.count("question.timed_out") == 2, kinds


def responses_outputs(model: ModelServer) -> list[str]:
    """The tool outputs Codex sent back to the model in its last request (Responses `*_output` items)."""
    items = model.model_requests()[-1]["body"].get("input") or []
    return [json.dumps(i.get("output")) for i in items if isinstance(i, dict) and str(i.get("type")).endswith("output")]


def test_codex_asks_with_ask_operator_and_gets_the_answer_from_another_terminal(tmp_path: Path):
    """Codex (`codex exec`, the preset as shipped) has no permission prompt to route, but calls ask_operator: the
    preset raises its MCP tool timeout (60 s by default) so the call may wait for a person."""
    with ModelServer("ask") as model:
        user = set_up(tmp_path, "codex", model)
        sid = session_for(user, "Pick a colour")
        argv = [TASKGATE, "session", "execute", sid, "--agent", "codex"]
        launcher = subprocess.Popen(argv, cwd=user.repo, env=user.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
        try:
            question = next_question(user, sid, set(), launcher)
            assert (question["kind"], question["text"]) == ("question", ASK_ARGUMENTS["question"])
            user.ok("session", "answer", sid, "1")  # by its number: red
            out, err = launcher.communicate(timeout=TIMEOUT_S)
        finally:
            if launcher.poll() is None:
                launcher.kill()
        outputs = responses_outputs(model)
    assert launcher.returncode == 0, (out, err)
    assert any(re.search(r"answer\W+red", o) for o in outputs), outputs  # the answer came back to the model
    [asked] = user.json("session", "questions", sid)
    assert (asked["status"], asked["answer"]) == ("answered", "red")
    assert user.json("session", "status", sid)["state"] == "verifying"
