"""Built-in agent types (presets): what runs with no configuration beyond credentials.

A preset is an agent type with a few facts for people: what to install, which credentials it needs, what it
writes under HOME. `[agents.NAME]` in taskgate.toml may name a preset (`preset = "claude"`) and override any of
its keys; a table named like a preset overrides that preset. The commands are plain data so they are easy to
read and to check against the real CLIs (tests/e2e/test_real_agent_clis.py runs them).

Least privilege inside a worktree: the agent's working directory is the session's worktree, its environment is
built (docs/agents.md), and only the variables named in `credentials` pass from the service's environment.

Each preset works as shipped with only the variables a user sets (`tests/e2e/test_real_agents_in_sessions.py` drives
each through init → merge against the real CLI): `endpoint` names the variables its model endpoint is read from and
`endpoint_keys` the credentials such an endpoint needs (`doctor` checks both, `domain/agents/setups.py`); what a
CLI would otherwise need in its own config (Codex's model provider) taskgate writes for it (`setup`), and what it
would leave in the worktree goes to the session folder or is ignored (`ignored`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from taskgate.domain.agents.kinds import DEFAULT_STALL_S, AgentType

_QUIET_CLAUDE = {
    "ENABLE_TOOL_SEARCH": "false",  # taskgate's MCP tools in the tool list itself, not deferred behind ToolSearch
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    # an MCP call may wait for the operator's answer ([questions] timeout_s is at most a week): never cut it short
    "MCP_TOOL_TIMEOUT": "604800000",
}


@dataclass(frozen=True, slots=True)
class Preset:
    """A built-in agent type and what a person needs to know to use it."""

    name: str
    summary: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    credentials: tuple[str, ...] = ()  # passed through from the service's environment when set
    needs_one_of: tuple[str, ...] = ()  # at least one must be set (or a login kept under HOME, `logins`)
    logins: tuple[str, ...] = ()  # files under HOME that hold a CLI's own login (a set-up without an API key)
    install: str = ""
    mcp: str = "env"
    output_format: str = "text"
    timeout_s: float = 3600.0
    stall_s: float = DEFAULT_STALL_S
    stall_patterns: tuple[str, ...] = ()  # output lines that are no progress: the CLI retrying its connection
    quota_patterns: tuple[str, ...] = ()  # lines at a failed run's end that say the API's quota ran out (quota.py)
    setup: str = "none"  # what taskgate writes for the CLI before it starts (domain/agents/setups.py)
    ignored: tuple[str, ...] = ()  # folders the CLI keeps in the worktree, made ignored by git
    endpoint: tuple[str, ...] = ()  # variables the model endpoint is read from (by the CLI, or by taskgate for it)
    endpoint_keys: tuple[str, ...] = ()  # credentials of which one must be set when an endpoint variable is
    hosts: tuple[str, ...] = ()  # its vendor's API, reached from its sandbox when no endpoint variable is set
    resume: tuple[str, ...] = ()  # how it continues its earlier conversation (kinds.AgentType.resume); (): cannot

    def agent_type(self) -> AgentType:
        """The preset as an agent type."""
        return AgentType(self.name, self.command, dict(self.env), self.timeout_s, credentials=self.credentials,
                         mcp=self.mcp, output_format=self.output_format, needs_one_of=self.needs_one_of,
                         logins=self.logins, stall_s=self.stall_s, stall_patterns=self.stall_patterns,
                         quota_patterns=self.quota_patterns, setup=self.setup, ignored=self.ignored,
                         endpoint=self.endpoint, endpoint_keys=self.endpoint_keys, hosts=self.hosts,
                         resume=self.resume)  # fmt: skip


# What each CLI prints while it retries a model endpoint it cannot reach (seen with Claude Code 2.1.330, Codex
# 0.169/0.171 and aider 0.86 pointed at a closed port): these lines are no progress (domain/agents/stalls.py).
_CLAUDE_RETRIES = (r'"subtype"\s*:\s*"api_retry"',)
_CODEX_RETRIES = (
    r"Reconnecting\.\.\.",
    r"waiting for network",
    r"failed to connect to Responses WebSocket",
    r"Falling back from WebSockets",
    r"stream disconnected before completion",
)
_AIDER_RETRIES = (
    r"^litellm\.\w+Error",
    r"^error\.$",
    r"servers are down or overloaded",
    r"^Retrying in [\d.]+ seconds",
)

# What each CLI says when the model API refuses for a rate limit, a usage limit or a quota (domain/agents/quota.py).
_QUOTA_WORDS = r"(\b429\b|[Rr]ate[ _-]?limit|[Uu]sage limit|[Qq]uota)"
_CLAUDE_QUOTA = (  # keys in any order: its `result` line ends with "type" (seen with Claude Code 2.1.330)
    r'"error_status"\s*:\s*429',  # an api_retry event
    r'"error"\s*:\s*"rate_limit"',
    r'"api_error_status"\s*:\s*429',  # the result of a run that gave up
    r'"api_error_type"\s*:\s*"rate_limit_error"',
    r'"result"\s*:\s*"[^"]*([Uu]sage limit|[Rr]ate limit|[Qq]uota)',
)
_CODEX_QUOTA = (r'"type"\s*:\s*"(error|turn\.failed)".*' + _QUOTA_WORDS,)
_AIDER_QUOTA = (r"litellm\.RateLimitError", r"RateLimitError")

# fmt: off
_SCRIPTS = "{catalogue_dir}/agents"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "claude",
            "Claude Code, headless (-p), edits and git in the worktree, taskgate's MCP tools",
            ("claude", "-p", "{prompt}", "--output-format", "stream-json", "--verbose",
             "--permission-mode", "acceptEdits",
             "--allowedTools", "Bash(git:*),Read,Edit,Write,Glob,Grep,mcp__taskgate",
             "--mcp-config", "{session_folder}/{agent_id}.mcp.json", "--strict-mcp-config",
             # a tool use not allowed above is asked of the operator (docs/questions.md), not denied silently
             "--permission-prompt-tool", "mcp__taskgate__permission_prompt"),
            env=_QUIET_CLAUDE,
            credentials=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL",
                         "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "AWS_REGION", "AWS_PROFILE",
                         "CLOUD_ML_REGION", "ANTHROPIC_VERTEX_PROJECT_ID"),
            needs_one_of=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK",
                          "CLAUDE_CODE_USE_VERTEX"),
            logins=(".claude/.credentials.json",),
            endpoint=("ANTHROPIC_BASE_URL",),
            endpoint_keys=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
            hosts=("api.anthropic.com:443",),
            install="npm install -g @anthropic-ai/claude-code",
            mcp="claude",
            output_format="claude-stream-json",
            stall_patterns=_CLAUDE_RETRIES,
            # its conversation is kept under $HOME/.claude/projects/<worktree>/ and keeps its id when resumed
            resume=("--resume", "{conversation_id}"),
            quota_patterns=_CLAUDE_QUOTA,
        ),
        Preset(
            "codex",
            "Codex CLI, non-interactive (exec --json), workspace-write sandbox, its model provider written by "
            "taskgate into a private CODEX_HOME, taskgate's MCP tools",
            ("codex", "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
             "--add-dir", "{git_dir}", "--add-dir", "{git_dir}/worktrees/{session_id}",  # git's files, writable
             "-c", 'mcp_servers.taskgate.url="{mcp_url}"',
             "-c", 'mcp_servers.taskgate.bearer_token_env_var="TASKGATE_TOKEN"',
             "-c", "mcp_servers.taskgate.required=true",
             "-c", 'mcp_servers.taskgate.default_tools_approval_mode="approve"',
             "-c", "mcp_servers.taskgate.tool_timeout_sec=604800.0",  # ask_operator waits for the answer (60 s default)
             "{prompt}"),
            credentials=("OPENAI_API_KEY", "OPENAI_BASE_URL"),  # CODEX_HOME: taskgate's private one, per agent
            needs_one_of=("OPENAI_API_KEY",),
            logins=(".codex/auth.json",),
            setup="codex",
            endpoint=("OPENAI_BASE_URL",),
            endpoint_keys=("OPENAI_API_KEY",),
            hosts=("api.openai.com:443", "chatgpt.com:443"),
            install="npm install -g @openai/codex",
            mcp="codex",
            output_format="codex-json",
            stall_patterns=_CODEX_RETRIES,
            # `codex exec [options] resume ID PROMPT`: the thread is kept in the CODEX_HOME of the agent that began it
            resume=("resume", "{conversation_id}"),
            quota_patterns=_CODEX_QUOTA,
        ),
        Preset(
            "aider",
            "aider, one message, commits its edits, its history in the session folder; no MCP client (it cannot "
            "call taskgate's tools)",
            ("aider", "--message", "{prompt}", "--yes-always", "--no-pretty", "--no-stream", "--no-check-update",
             "--no-analytics", "--auto-commits", "--no-show-release-notes", "--no-gitignore",
             "--no-show-model-warnings",
             # its history files go to the session folder, not into the work (the worktree stays clean)
             "--chat-history-file", "{session_folder}/{agent_id}.aider.chat.history.md",
             "--input-history-file", "{session_folder}/{agent_id}.aider.input.history"),
            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # no fetch of litellm's price list from GitHub at start
            credentials=("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "AIDER_MODEL"),
            needs_one_of=("OPENAI_API_KEY", "ANTHROPIC_API_KEY"),
            install="python3 -m pip install aider-chat",
            mcp="none",
            stall_patterns=_AIDER_RETRIES,
            quota_patterns=_AIDER_QUOTA,
            output_format="aider",
            ignored=(".aider.tags.cache.v4",),  # its repository map's cache, kept in the worktree's top
            endpoint=("OPENAI_API_BASE", "OPENAI_BASE_URL"),  # litellm reads either for OpenAI-compatible models
            endpoint_keys=("OPENAI_API_KEY",),
            hosts=("api.openai.com:443", "api.anthropic.com:443"),
        ),
        Preset(
            "coder",
            "scripted coder (no model): commits work/<title>.md; point it at a real CLI with preset = \"claude\"",
            ("python3", f"{_SCRIPTS}/scripted_coder.py", "{task_title}", "--instructions", "{instructions}",
             "--prompt", "{prompt}"),
            timeout_s=600,
        ),
        Preset(
            "tester",
            "scripted tester (no model): runs `git diff --check` and saves a report; set your test command",
            ("python3", f"{_SCRIPTS}/scripted_tester.py", "--prompt", "{prompt}", "--", "git", "diff", "--check"),
            timeout_s=600,
        ),
        Preset(
            "reviewer",
            "scripted reviewer (no model): saves the branch's commits and diff stat as a review note",
            ("python3", f"{_SCRIPTS}/scripted_reviewer.py", "--prompt", "{prompt}"),
            timeout_s=600,
        ),
    )
}
# fmt: on
