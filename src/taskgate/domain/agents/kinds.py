"""Agent types and their command lines (pure).

An agent type is configured as an argv list with placeholders (`{prompt}`, `{task_title}`, …). Each
placeholder is replaced inside its own argv element with the value as it is: there is no shell, so a task
title like `"; rm -rf ~"` stays one harmless argument. Only the known placeholders are allowed; `{{` and `}}`
are literal braces.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from taskgate.domain.agents.setups import SETUPS
from taskgate.domain.agents.stalls import compile_patterns
from taskgate.domain.errors import InvalidInput

PLACEHOLDERS = frozenset({"prompt", "task_title", "task_description", "instructions", "session_id", "worktree",
                          "revision", "task_id", "session_folder", "config_dir", "agent_id", "mcp_url",
                          "catalogue_dir", "git_dir"})  # fmt: skip
# How an agent type reaches taskgate's MCP tools: "env" only TASKGATE_MCP_URL/TASKGATE_TOKEN (scripts), "claude" an
# --mcp-config file written into the session folder at start, "codex" its mcp_servers setting, "none" no MCP client.
MCP_WIRINGS = frozenset({"env", "claude", "codex", "none"})
# What the agent prints: plain "text", or a CLI's JSON events whose final message, turns and usage are kept.
OUTPUT_FORMATS = frozenset({"text", "claude-stream-json", "codex-json", "aider"})
# Only in `resume`: the id of the CLI's own conversation an agent continues (its earlier run reported it)
CONVERSATION_ID = "conversation_id"
MAX_ARGUMENT = 100_000
DEFAULT_STALL_S = 300.0  # minutes, not the hour of `timeout_s`: a CLI retrying a dead endpoint is found in 5


@dataclass(frozen=True, slots=True)
class AgentType:
    """`[agents.NAME]` of the config: what to run, with which extra environment, for how long."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 3600.0
    max_output_bytes: int = 10_000_000
    prompt: str | None = None  # the `{prompt}` template of this type; None: the service's default
    credentials: tuple[str, ...] = ()  # service environment variables passed to the agent when set (allow-list)
    mcp: str = "env"  # one of MCP_WIRINGS
    output_format: str = "text"  # one of OUTPUT_FORMATS
    needs_one_of: tuple[str, ...] = ()  # credentials of which at least one must be set (or a login in `logins`)
    logins: tuple[str, ...] = ()  # files under HOME holding the CLI's own login
    # No progress (a line of output that is no retry notice, a heartbeat, a tool call) for this long: stalled, and
    # stopped (domain/agents/stalls.py); 0 turns it off. `stall_patterns`: regular expressions of output lines that
    # are not progress (a CLI retrying its connection).
    stall_s: float = DEFAULT_STALL_S
    stall_patterns: tuple[str, ...] = ()
    # A failed run whose log ends with a line matching `quota_patterns` (the API's rate limit, usage limit, quota):
    # launched again after `quota_wait_s` (doubled each time), at most `quota_retries` times (domain/agents/quota.py)
    quota_patterns: tuple[str, ...] = ()
    quota_retries: int = 3
    quota_wait_s: float = 30.0
    setup: str = "none"  # one of SETUPS: "codex" gives each agent a private CODEX_HOME with its model provider
    ignored: tuple[str, ...] = ()  # folders the CLI keeps in the worktree, made ignored by git (domain/agents/setups)
    endpoint: tuple[str, ...] = ()  # variables its model endpoint is read from (by the CLI, or by taskgate for it)
    endpoint_keys: tuple[str, ...] = ()  # credentials of which one must be set when an endpoint variable is
    hosts: tuple[str, ...] = ()  # its vendor's API (`host:port`): its sandbox may reach it when no endpoint is set
    # its sandbox's network (docs/agents.md): "none", "open", or `host:port` entries allowed besides taskgate's
    # MCP endpoint and its model endpoint (None: only those two)
    network: str | tuple[str, ...] | None = None
    read: tuple[str, ...] = ()  # folders its sandbox shows read-only besides its toolchain
    # How its CLI continues its own earlier conversation (docs/agents.md, resuming): the argv put right before the
    # argument holding `{prompt}` (at the end when none does), with `{conversation_id}`; () cannot resume
    resume: tuple[str, ...] = ()

    @property
    def can_resume(self) -> bool:
        """Whether its CLI can continue an earlier run's conversation (it has a `resume` argv)."""
        return bool(self.resume)

    @property
    def takes_prompt(self) -> bool:
        """Whether a workflow step's prompt reaches this agent (its command holds `{prompt}`)."""
        return any("{prompt}" in part for part in self.command)

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(part, str) for part in self.command):
            raise InvalidInput(f"agents.{self.name}.command must be a non-empty list of strings")
        for part in self.command:
            check_template(part, f"agents.{self.name}.command")
        if self.prompt is not None:
            check_template(self.prompt, f"agents.{self.name}.prompt")
            if "{prompt}" in self.prompt:
                raise InvalidInput(f"agents.{self.name}.prompt cannot contain {{prompt}} itself")
        for part in self.resume:
            check_template(part, f"agents.{self.name}.resume", known=PLACEHOLDERS | {CONVERSATION_ID})
        if self.resume and not any("{" + CONVERSATION_ID + "}" in part for part in self.resume):
            raise InvalidInput(
                f"agents.{self.name}.resume must hold {{conversation_id}}, the conversation it continues"
            )
        if self.mcp not in MCP_WIRINGS:
            raise InvalidInput(f"agents.{self.name}.mcp: unknown {self.mcp!r}; known: {', '.join(sorted(MCP_WIRINGS))}")
        if self.output_format not in OUTPUT_FORMATS:
            known = ", ".join(sorted(OUTPUT_FORMATS))
            raise InvalidInput(f"agents.{self.name}.output_format: unknown {self.output_format!r}; known: {known}")
        if self.setup not in SETUPS:
            raise InvalidInput(f"agents.{self.name}.setup: unknown {self.setup!r}; known: {', '.join(sorted(SETUPS))}")
        if any(not name or "/" in name or name in (".", "..", ".git") for name in self.ignored):
            raise InvalidInput(f"agents.{self.name}.ignored: each entry must be a folder name in the worktree's top")
        if self.timeout_s <= 0 or self.max_output_bytes <= 0:
            raise InvalidInput(f"agents.{self.name}: timeout_s and max_output_bytes must be positive")
        if self.stall_s < 0:
            raise InvalidInput(f"agents.{self.name}.stall_s must be 0 (off) or positive")
        compile_patterns(self.stall_patterns, f"agents.{self.name}.stall_patterns")
        compile_patterns(self.quota_patterns, f"agents.{self.name}.quota_patterns")
        if self.quota_retries < 0 or self.quota_wait_s < 0:
            raise InvalidInput(f"agents.{self.name}: quota_retries and quota_wait_s must be 0 or positive")


def check_template(template: str, where: str, known: frozenset[str] = PLACEHOLDERS) -> None:
    """Raises: InvalidInput naming an unknown placeholder (not in `known`), a format spec, or malformed braces."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidInput(f"{where}: {template!r} is malformed ({exc}); write literal braces as {{{{ }}}}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in known or spec or conversion:
            raise InvalidInput(
                f"{where}: unknown placeholder {{{name}}} in {template!r}; known: {', '.join(sorted(known))}"
            )


def render_command(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The argv with every placeholder filled, one element per template element (never split, never a shell).

    Raises: InvalidInput when a value holds a NUL byte or is too long for an argument.
    """
    for name, value in values.items():
        if "\x00" in value:
            raise InvalidInput(f"the value of {{{name}}} contains a NUL byte, which no argument can carry")
        if len(value) > MAX_ARGUMENT:
            raise InvalidInput(f"the value of {{{name}}} is longer than {MAX_ARGUMENT} characters")
    complete = {name: values.get(name, "") for name in PLACEHOLDERS | {CONVERSATION_ID}}
    return [part.format_map(complete) for part in command]


def resuming(command: Sequence[str], resume: Sequence[str]) -> list[str]:
    """The command template that continues a conversation: `resume` put right before the first argument holding
    `{prompt}` (Codex's `exec … resume ID PROMPT` takes its options before `resume`, Claude Code's `--resume ID`
    goes anywhere), or at the end when no argument holds it."""
    at = next((i for i, part in enumerate(command) if "{prompt}" in part), len(command))
    return [*command[:at], *resume, *command[at:]]


def why_stopped(trigger: str, actor: str, reason: str | None) -> str:
    """What agents are told when a retry brings back work a transition stopped (plain sessions and workflow
    steps alike), e.g. `The previous attempt was stopped (reject by operator:alice): wrong approach`."""
    return f"The previous attempt was stopped ({trigger} by {actor}): {reason or 'no reason given'}"


def as_continuation(instructions: str) -> str:
    """The prompt of an agent that continues its own conversation (`resume`): it remembers the task and its work, so
    it is told only what happened since (the operator's request, the CI failure, why the session failed)."""
    what = instructions.strip() or "The operator sent the work back without instructions: check it against the task."
    return (
        "You are continuing your earlier work on this task, in this same conversation; your commits are on the "
        "branch. Since your last message:\n"
        f"{what}\n"
        "Change what is asked, commit, and say what you did."
    )


def as_revision(instructions: str) -> str:
    """What agents run again after a request for changes, a rejection or a failure are told: that this is a
    revision of work already on their branch, then why (empty when nothing was asked: a first run)."""
    if not instructions.strip():
        return ""
    return (
        "This is a revision, not a fresh start: the earlier attempt's work is committed on this branch. "
        "Keep what is right and change what is asked.\n"
        f"The operator's instructions:\n{instructions}"
    )
