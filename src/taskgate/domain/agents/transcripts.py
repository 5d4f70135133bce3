"""What an agent's log says, for people (pure): its result (the final message) and its events as readable lines.

An agent's log is what its process printed. Claude Code (`--output-format stream-json --verbose`) and Codex
(`exec --json`) print one JSON event a line; aider prints a banner, its reply and a `Tokens: …` line; scripted
agents print plain text. Two things are read from it, here and nowhere else (the CLI, the console and the
supervisor all call these):

- `final_message(output_format, log)`: the agent's result. Claude Code's `result` (else its last assistant text),
  Codex's last `agent_message`, aider's reply without its banner, token and edit lines, and for plain text the
  last `TEXT_RESULT_CHARS` of the output, never cut inside a line.
- `Transcript`: the log as lines a person reads, fed piece by piece (`session logs --follow` reads as the agent
  writes): assistant text as it is, each tool call with its command or path, each tool result folded to its first
  line and a count of the rest, and the tokens. A line that is not a JSON event (stderr, aider, a script) is kept
  as it is. The event kind is told by its `type`, so a log needs no format to be rendered.

The log is the agent's: nothing here raises on what it holds, and fields of the wrong type count as absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from taskgate.domain.agents.reports import parse_report
from taskgate.domain.entities import Agent, StepRun
from taskgate.domain.errors import InvalidInput

TEXT_RESULT_CHARS = 16_000  # of a plain-text agent's output, the end kept as its result
FOLD_WIDTH = 160  # characters of a folded result's first line, of a tool's argument
_AIDER_BANNER = re.compile(r"^Aider v\d")
# aider's own lines around the model's reply (0.86: banner, warnings, the usage line, the edits it applied)
_AIDER_NOISE = re.compile(
    r"^(Aider v\d|Main model:|Weak model:|Editor model:|Git repo:|Repo-map:|Added .* to the chat|Warning:|"
    r"HTTPSConnectionPool|Tokens: |Cost: |Applied edit to |Commit [0-9a-f]{7,} |Committing |Use /help|"
    r"Did not apply edit|Only \d+ reflections allowed|Can't initialize prompt toolkit)"
)


def final_message(output_format: str, log: str) -> str:
    """The agent's result, read from the end of its log (see the module's docstring); "" when it said nothing."""
    if output_format in ("claude-stream-json", "codex-json"):
        report = parse_report(output_format, log)
        return report.final_message if report is not None else ""
    if any(_AIDER_BANNER.match(line) for line in log.splitlines()[:20]) or output_format == "aider":
        return aider_reply(log)
    return last_lines(log, TEXT_RESULT_CHARS)


def result_of(agent: Agent) -> str:
    """What the agent ended with: its final message as the supervisor stored it in its report (its CLI's last
    message, aider's reply, a plain-text agent's last lines), else the end of its output."""
    final = (agent.report or {}).get("final_message")
    return final if isinstance(final, str) and final else (agent.output_tail or "").strip()


def step_output(
    session_id: str, runs: Sequence[StepRun], agents: Sequence[Agent], step: str | None = None
) -> list[tuple[str, str]]:
    """What `session output` prints, as (what it is, its whole text): the latest run of step `step`; without one,
    the latest agent step that ended with an output, else the latest step with one; a session that ran no workflow
    step gives its latest run's agents' results.

    Raises: InvalidInput naming the steps that have an output when `step` ran never, or when no step has one."""
    ended = [r for r in runs if r.status.value not in ("running", "waiting")]
    having = ", ".join(dict.fromkeys(r.step_id for r in ended if r.output_summary)) or "none"
    if step is not None:
        mine = [r for r in runs if r.step_id == step]
        if not mine:
            raise InvalidInput(f"session {session_id[:8]} has no run of step '{step}'; steps with an output: {having}")
        return [(_run_label(mine[-1]), mine[-1].output_summary)]
    with_output = [r for r in ended if r.output_summary]
    best = [r for r in with_output if r.agent_ids] or with_output
    if best:
        return [(_run_label(best[-1]), best[-1].output_summary)]
    if runs:
        raise InvalidInput(f"no step of session {session_id[:8]} has an output yet")
    if not agents:
        raise InvalidInput(f"session {session_id[:8]} has run no agent yet (`taskgate session execute` launches them)")
    last = max(a.run for a in agents)
    return [(f"agent {a.id[:8]} {a.agent_type} (run {a.run}, {a.status.value})", result_of(a))
            for a in agents if a.run == last]  # fmt: skip


def _run_label(run: StepRun) -> str:
    attempt = f", attempt {run.attempt}" if run.attempt > 1 else ""
    return f"step {run.step_id} of {run.frame} ({run.status.value}{attempt})"


def last_lines(text: str, limit: int) -> str:
    """The end of `text`, at most `limit` characters, starting at the start of a line (whole when it fits; a
    single line longer than `limit` is cut at its start, marked with `…`)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    window = text[-limit:]
    cut = window.find("\n")
    return window[cut + 1 :] if cut >= 0 else "…" + window[1:]


def aider_reply(log: str) -> str:
    """aider's last reply: the text between the banner (or the previous `Tokens:` line) and its last `Tokens:`
    line, without aider's own lines; blank lines it doubles (`--no-pretty`) are made single."""
    lines = log.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("Tokens: ")]
    end = ends[-1] if ends else len(lines)
    start = ends[-2] + 1 if len(ends) > 1 else 0
    kept = [line.rstrip() for line in lines[start:end] if not _AIDER_NOISE.match(line)]
    text = "\n".join(kept).strip()
    return re.sub(r"\n{3,}", "\n\n", text)


def fold(text: str, width: int = FOLD_WIDTH) -> str:
    """`text` as one line: its first non-blank line (cut to `width`), then `… N more lines` when it has more."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    first = lines[0].strip()
    first = first if len(first) <= width else first[: width - 1] + "…"
    return first + (f" … {len(lines) - 1} more line{'s' if len(lines) > 2 else ''}" if len(lines) > 1 else "")


class Transcript:
    """An agent's log rendered as readable lines, fed as it is read (`feed`, then `end` for the rest)."""

    def __init__(self) -> None:
        self._partial = ""
        self._started: set[str] = set()  # Codex items whose start was shown (their end shows only the result)

    def feed(self, text: str) -> list[str]:
        """The lines for what `text` completes (a line not yet ended waits for the next feed)."""
        text, self._partial = self._partial + text, ""
        *complete, self._partial = text.split("\n")
        return [out for line in complete for out in self.render(line)]

    def end(self) -> list[str]:
        """The lines for what is left (a last line without its newline)."""
        rest, self._partial = self._partial, ""
        return self.render(rest) if rest else []

    def render(self, line: str) -> list[str]:
        """One line of the log as readable lines (none for events that say nothing to a person)."""
        event = _event(line)
        if event is None:
            return [line.rstrip("\r")]
        kind = event["type"]
        try:
            if kind in ("system", "assistant", "user", "result"):
                return _claude(event)
            if kind.startswith(("thread.", "turn.", "item.")) or kind == "error":
                return self._codex(event)
        except (TypeError, ValueError, AttributeError, KeyError):
            pass  # a malformed event: shown as it was written
        return [line]

    def _codex(self, event: dict[str, Any]) -> list[str]:
        kind = event["type"]
        if kind == "thread.started":
            return [f"· codex started (thread {_text(event.get('thread_id'))[:8]})"]
        if kind == "turn.completed":
            usage = _dict(event.get("usage"))
            cached = _count(usage.get("cached_input_tokens"))
            note = f", {cached} cached" if cached else ""
            return [f"· tokens: {_count(usage.get('input_tokens'))} in / {_count(usage.get('output_tokens'))} "
                    f"out{note}"]  # fmt: skip
        if kind == "turn.failed":
            return [f"✗ turn failed: {_text(_dict(event.get('error')).get('message'))}"]
        if kind == "error":
            return [f"✗ {_text(event.get('message'))}"]
        if kind not in ("item.started", "item.completed"):
            return []
        item = _dict(event.get("item"))
        key = _text(item.get("id"))
        if kind == "item.started":
            call = _codex_call(item)
            if call:
                self._started.add(key)
            return [call] if call else []
        shown = [] if key in self._started else ([call] if (call := _codex_call(item)) else [])
        self._started.discard(key)
        return shown + _codex_done(item)


def _claude(event: dict[str, Any]) -> list[str]:
    kind = event["type"]
    if kind == "system":
        if event.get("subtype") != "init":
            return []
        servers = [f"{_text(s.get('name'))} {_text(s.get('status'))}" for s in event.get("mcp_servers") or []
                   if isinstance(s, dict)]  # fmt: skip
        mcp = f"; MCP: {', '.join(servers)}" if servers else ""
        version = _text(event.get("claude_code_version"))
        return [f"· claude code {version} started in {_text(event.get('cwd'))} (model {_text(event.get('model'))}"
                f"{mcp})"]  # fmt: skip
    if kind == "result":
        usage = _dict(event.get("usage"))
        cost = event.get("total_cost_usd")
        money = f", ${cost:.4f}" if isinstance(cost, int | float) and not isinstance(cost, bool) else ""
        tokens = f"{_count(usage.get('input_tokens'))} in / {_count(usage.get('output_tokens'))} out tokens"
        turns = _count(event.get("num_turns"))
        failed = event.get("is_error") is True or _text(event.get("subtype")).startswith("error")
        head = f"✗ failed ({_text(event.get('subtype'))}): {fold(_text(event.get('result')))}" if failed else "✓ done"
        return [f"{head} · {turns} turn{'' if turns == 1 else 's'}, {tokens}{money}"]
    blocks = _dict(event.get("message")).get("content")
    if isinstance(blocks, str):
        return [blocks] if kind == "assistant" else []
    out: list[str] = []
    for block in blocks if isinstance(blocks, list) else []:
        block = _dict(block)
        if block.get("type") == "text" and kind == "assistant":
            out.extend(_text(block.get("text")).splitlines() or [""])
        elif block.get("type") == "tool_use":
            out.append(f"→ {_text(block.get('name'))} {_argument(_dict(block.get('input')))}".rstrip())
        elif block.get("type") == "tool_result":
            mark = "✗" if block.get("is_error") is True else "←"
            out.append(f"  {mark} {fold(_content_text(block.get('content')))}")
    return out


def _codex_call(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind == "command_execution":
        return f"$ {_unwrap_shell(_text(item.get('command')))}"
    if kind == "mcp_tool_call":
        return f"→ {_text(item.get('server'))}.{_text(item.get('tool'))} {_argument(_dict(item.get('arguments')))}"
    if kind == "web_search":
        return f"→ web search {_text(item.get('query'))}"
    return ""


def _codex_done(item: dict[str, Any]) -> list[str]:
    kind = item.get("type")
    if kind == "agent_message":
        return _text(item.get("text")).splitlines() or [""]
    if kind == "command_execution":
        code = item.get("exit_code")
        mark = "←" if code in (0, None) else "✗"
        return [f"  {mark} {fold(_text(item.get('aggregated_output')))} (exit {code})"]
    if kind == "mcp_tool_call":
        error = _dict(item.get("error")).get("message") if item.get("error") else None
        if error:
            return [f"  ✗ {fold(_text(error))}"]
        return [f"  ← {fold(_content_text(_dict(item.get('result')).get('content')))}"]
    if kind == "file_change":
        changes = [_dict(c) for c in item.get("changes") or []]
        return [f"✎ {_text(c.get('kind'))} {_text(c.get('path'))}" for c in changes]
    if kind == "error":
        return [f"! {_text(item.get('message'))}"]
    if kind == "todo_list":
        return [f"  [{'x' if _dict(t).get('completed') else ' '}] {_text(_dict(t).get('text'))}"
                for t in item.get("items") or []]  # fmt: skip
    return []


_ARGUMENT_KEYS = ("command", "cmd", "file_path", "path", "notebook_path", "pattern", "url", "query", "name")


def _argument(arguments: dict[str, Any]) -> str:
    """What a tool call acts on: its command or path when it has one, else its arguments as compact JSON."""
    for key in _ARGUMENT_KEYS:
        value = arguments.get(key)
        if isinstance(value, list):
            value = " ".join(str(part) for part in value)
        if isinstance(value, str) and value:
            return fold(value)
    return fold(json.dumps(arguments, ensure_ascii=False)) if arguments else ""


def _unwrap_shell(command: str) -> str:
    """Codex runs `/bin/bash -lc '<command>'`: the command itself is what a person wants to read."""
    match = re.fullmatch(r"(?:/usr)?/bin/(?:ba|z)?sh -lc '(.*)'", command, re.DOTALL)
    return match.group(1).replace("'\\''", "'") if match else command


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(_dict(part).get("text")) for part in content)
    return ""


def _event(line: str) -> dict[str, Any] | None:
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        event = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
