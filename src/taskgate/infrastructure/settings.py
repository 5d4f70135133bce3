"""Settings from `.taskgate/taskgate.toml` (or `config/taskgate.toml`) and `TASKGATE_*` environment variables
(nested with `__`).

The file is found by `find_config_file`: `TASKGATE_CONFIG`, else `.taskgate/taskgate.toml` in the current folder or
the nearest folder above it (so commands work anywhere in a repository set up by `taskgate init`, and in its
session worktrees), else `config/taskgate.toml` in the current folder. Environment wins over the file, the file
over defaults. pydantic-settings ignores a missing TOML file
silently, so the file is resolved here to an absolute path and `Settings.config_file` says which one (if any)
was loaded; an explicit `TASKGATE_CONFIG` that does not exist is an error.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from taskgate.domain.entities import TaskStatus
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure import settings_cache
from taskgate.infrastructure.config_lookup import PROJECT_DATA_DIR, config_base, find_config_file

# The agents' presets and the budgets' rules load when a config names them: `serve` over stdio reads these settings
# before it answers its first tool list (entrypoints/mcp/front.py), and each would add ~5 ms there.
if TYPE_CHECKING:
    from taskgate.domain.budgets import Budgets


def _presets() -> dict[str, Any]:
    from taskgate.domain.agents.presets import PRESETS

    return PRESETS


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class OperatorSettings(BaseModel):
    default: str = Field(default_factory=lambda: os.environ.get("USER") or "operator")


class PolicySettings(BaseModel):
    """One `[policies.<name>]` table (see docs/policies.md). Unset keys keep the built-in default."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    severity: Literal["error", "warning", "info"] | None = None
    priority: int | None = Field(default=None, ge=0, le=1000)
    triggers: list[str] | None = None

    def options(self) -> dict[str, Any]:
        """Only the keys the config set, for the policy book to layer over the defaults."""
        return self.model_dump(exclude_unset=True)


class WipLimitSettings(PolicySettings):
    limit: int = Field(default=3, ge=1, le=1000)


class RequireTestsSettings(PolicySettings):
    reuse: bool = True
    message_lines: int = Field(default=20, ge=0, le=1000)


class ReviewApprovalSettings(PolicySettings):
    min_approvals: int = Field(default=1, ge=1, le=100)


class PatternSettings(PolicySettings):
    pattern: str | None = None


class CommitMessageFormatSettings(PatternSettings):
    allow_merge_commits: bool = True


class PoliciesSettings(BaseModel):
    """`[policies.*]`: every built-in policy by name; an unknown name is an error that names it."""

    model_config = ConfigDict(extra="forbid")

    wip_limit: WipLimitSettings = WipLimitSettings()
    plan_open: PolicySettings = PolicySettings()
    task_unblocked: PolicySettings = PolicySettings()
    operator_capacity: PolicySettings = PolicySettings()
    require_tests: RequireTestsSettings = RequireTestsSettings()
    review_approval: ReviewApprovalSettings = ReviewApprovalSettings()
    clean_worktree: PolicySettings = PolicySettings()
    branch_naming: PatternSettings = PatternSettings()
    commit_message_format: CommitMessageFormatSettings = CommitMessageFormatSettings()
    tracker_in_sync: PolicySettings = PolicySettings()

    def tables(self) -> dict[str, dict[str, Any]]:
        """The configured tables, name → set keys (tables that set nothing are left out)."""
        found = {name: getattr(self, name).options() for name in type(self).model_fields}
        return {name: options for name, options in found.items() if options}


class HooksSettings(BaseModel):
    """`[hooks]`: shell commands run in each session worktree at points of its life (docs/worktrees.md, hooks).
    Checked again by `Hooks` in the application."""

    model_config = ConfigDict(extra="forbid")

    after_create: StrictStr = ""
    before_agent: StrictStr = ""
    after_agent: StrictStr = ""
    before_remove: StrictStr = ""
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)


NotifyKind = Literal["decision", "question", "agent", "ci", "budget"]  # domain/notifications.py KINDS


# Set while loading a configuration that started before (settings_cache.py: same file content, environment and
# folder), whose channels were checked then: importing Apprise to check them again cost every command ~0.2 s.
_CHANNELS_CHECKED: ContextVar[bool] = ContextVar("channels_checked", default=False)


def _apprise_channels(value: list[SecretStr], where: str) -> list[SecretStr]:
    """Each channel an Apprise URL Apprise can send to, checked at load time (Apprise loads only when some are set).
    The error names the entry by its index and shows it masked, never in full."""
    if not value or _CHANNELS_CHECKED.get():
        return value
    from taskgate.infrastructure.apprise_notify import check_channel

    for index, url in enumerate(value):
        try:
            check_channel(url.get_secret_value())
        except ValueError as exc:
            raise ValueError(f"{where}[{index}]: {exc}") from None
    return value


class NotifySettings(BaseModel):
    """`[notify]`: tell the operator where they are (docs/notifications.md). `channels` are Apprise URLs (secrets
    inside: kept as secrets, shown masked); `on`, which kinds of notice; `batch_s`, how long a channel gathers
    notices into one message; `console_url`, the base of the links (unset: http://mcp.host:mcp.port);
    `ci_failures`, from which CI failure of a session on each one is told; `include_details`, whether messages
    carry questions' text and agents' errors (off: ids, states and links only)."""

    model_config = ConfigDict(extra="forbid")

    channels: list[SecretStr] = Field(default_factory=list)
    on: list[NotifyKind] = Field(default_factory=lambda: ["decision", "question", "agent", "ci", "budget"])
    batch_s: float = Field(default=10.0, ge=0, le=3600)
    interval_s: float = Field(default=2.0, gt=0, le=3600)
    console_url: str | None = Field(default=None, pattern=r"^https?://")
    ci_failures: int = Field(default=2, ge=1, le=1000)
    include_details: bool = False
    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_s: float = Field(default=5.0, ge=0, le=86_400)
    backoff_max_s: float = Field(default=600.0, ge=0, le=7 * 86_400)
    timeout_s: float = Field(default=30.0, gt=0, le=600)

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: list[SecretStr]) -> list[SecretStr]:
        return _apprise_channels(value, "notify.channels")


class ProjectNotifySettings(BaseModel):
    """`[projects.<name>.notify]`: the project's own channels, told of its sessions' notices (`on`, unset: the
    top-level `on`); `inherit = false` keeps the top-level channels from hearing about this project."""

    model_config = ConfigDict(extra="forbid")

    channels: list[SecretStr] = Field(default_factory=list)
    on: list[NotifyKind] | None = None
    inherit: bool = True

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: list[SecretStr]) -> list[SecretStr]:
        return _apprise_channels(value, "notify.channels")


class ProjectSettings(BaseModel):
    """`[projects.<project name>]`: how the project runs its tests, its own `[...policies.<name>]` tables, and its own
    `[...hooks]` (instead of the top-level `[hooks]`)."""

    model_config = ConfigDict(extra="forbid")

    test_command: list[str] = Field(default_factory=list)
    test_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    policies: PoliciesSettings = PoliciesSettings()
    hooks: HooksSettings | None = None
    forge: ForgeSettings | None = None  # unset: the top-level [forge]
    tracker: TrackerSettings | None = None  # unset: the top-level [tracker]
    notify: ProjectNotifySettings | None = None  # unset: the top-level [notify] channels only
    budgets: dict[str, Any] | None = None  # over the top-level [budgets] key by key (domain/budgets.py checks it)


class ConfiguredToken(BaseModel):
    """A bearer token provisioned in config: only its SHA-256 (`taskgate token create --config-entry` prints one)."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    operator: str | None = None
    session: str | None = None
    label: str = ""

    @model_validator(mode="after")
    def _one_owner(self) -> ConfiguredToken:
        if (self.operator is None) == (self.session is None):
            raise ValueError("a configured token names exactly one of operator or session")
        return self


class McpSettings(BaseModel):
    tool_names: Literal["underscore", "colon"] = "underscore"
    tokens: list[ConfiguredToken] = []
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)


class SqliteSettings(BaseModel):
    busy_timeout_ms: int = Field(default=30_000, ge=0)
    synchronous: str = "FULL"

    @field_validator("synchronous")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError("must be OFF, NORMAL, FULL or EXTRA")
        return value.upper()


class BeadsTrackerSettings(BaseModel):
    """How to run Beads' `bd` (see docs/trackers.md). `status_map` maps a taskgate task status to the Beads
    status written back; `completed` closes the issue, a status left out writes nothing."""

    command: list[str] = Field(default_factory=lambda: ["bd"], min_length=1)
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    write_back: bool = True
    status_map: dict[str, str] = Field(
        default_factory=lambda: {"open": "open", "in_progress": "in_progress", "completed": "closed"}
    )

    @field_validator("status_map")
    @classmethod
    def _task_statuses(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - {s.value for s in TaskStatus})
        if unknown:
            valid = ", ".join(s.value for s in TaskStatus)
            raise ValueError(f"unknown task status {', '.join(unknown)}; valid: {valid}")
        return value


_ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class GitHubTrackerSettings(BaseModel):
    """`[tracker.github]`: GitHub Issues of one repository as the tracker (docs/trackers.md#github-issues). An open
    issue with `label` (every open issue when empty), not blocked, without open sub-issues, and assigned to nobody
    or to `assignee` is ready; `status_labels` say where a session stands; `completed` closes the issue."""

    model_config = ConfigDict(extra="forbid")

    repository: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")  # unset: [forge]'s
    api_url: str = Field(default="https://api.github.com", pattern=r"^https?://")
    token_env: str = Field(default="GITHUB_TOKEN", pattern=_ENV_VAR_PATTERN)  # the variable's name, never the token
    label: str = "taskgate"
    assignee: str | None = Field(default=None, min_length=1)  # the login taskgate claims as; unset: the token's user
    priority_labels: dict[str, int] = Field(
        default_factory=lambda: {"P0": 0, "P1": 1, "P2": 2, "P3": 3, "P4": 4}, description="label → priority 0–4"
    )
    status_labels: dict[str, str] = Field(
        default_factory=lambda: {
            "in_progress": "taskgate:in-progress",
            "pending_review": "taskgate:in-review",
            "approved": "taskgate:approved",
            "merged": "taskgate:approved",
        }
    )
    write_back: bool = True
    timeout_s: float = Field(default=30.0, gt=0, le=600)

    @field_validator("priority_labels")
    @classmethod
    def _priorities(cls, value: dict[str, int]) -> dict[str, int]:
        bad = sorted(k for k, v in value.items() if not 0 <= v <= 4)
        if bad:
            raise ValueError(f"priority of label {bad[0]!r} must be 0–4")
        return value

    @field_validator("status_labels")
    @classmethod
    def _statuses(cls, value: dict[str, str]) -> dict[str, str]:
        return _task_status_keys(value)


class LinearTrackerSettings(BaseModel):
    """`[tracker.linear]`: one Linear team as the tracker (docs/trackers.md#linear). An issue of `team` in one of
    `states` (with `label` when set), not blocked by an open `blocks` relation, without open sub-issues, and assigned
    to nobody or to `assignee` is ready; `status_map` names the workflow state each task status moves it to."""

    model_config = ConfigDict(extra="forbid")

    api_url: str = Field(default="https://api.linear.app/graphql", pattern=r"^https?://")
    token_env: str = Field(default="LINEAR_API_KEY", pattern=_ENV_VAR_PATTERN)
    team: str = Field(default="", description="the team's key, e.g. ENG")
    states: list[str] = Field(default_factory=lambda: ["Todo"], min_length=1)
    label: str | None = None
    assignee: str | None = Field(default=None, min_length=1)  # a user's id or e-mail; unset: the API key's user
    status_map: dict[str, str] = Field(
        default_factory=lambda: {
            "in_progress": "In Progress",
            "pending_review": "In Review",
            "completed": "Done",
            "open": "Todo",
        }
    )
    write_back: bool = True
    timeout_s: float = Field(default=30.0, gt=0, le=600)

    @field_validator("status_map")
    @classmethod
    def _statuses(cls, value: dict[str, str]) -> dict[str, str]:
        return _task_status_keys(value)


def _task_status_keys(value: dict[str, str]) -> dict[str, str]:
    unknown = sorted(set(value) - {s.value for s in TaskStatus})
    if unknown:
        raise ValueError(f"unknown task status {', '.join(unknown)}; valid: {', '.join(s.value for s in TaskStatus)}")
    return value


class TrackerSettings(BaseModel):
    """`[tracker]` (or `[projects.<name>.tracker]`): where tasks come from (the built-in tracker by default, Beads,
    GitHub Issues or Linear), and what happens when the tracker takes back an issue whose session runs."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["builtin", "beads", "github", "linear"] = "builtin"
    # an issue closed, reassigned or relabelled away while its session runs: ask the operator, or stop the session
    on_issue_gone: Literal["ask", "stop"] = "ask"
    beads: BeadsTrackerSettings = BeadsTrackerSettings()
    github: GitHubTrackerSettings = GitHubTrackerSettings()
    linear: LinearTrackerSettings = LinearTrackerSettings()

    @model_validator(mode="after")
    def _linear_team(self) -> TrackerSettings:
        if self.kind == "linear" and not self.linear.team:
            raise ValueError('[tracker] kind = "linear" needs [tracker.linear] team (the team\'s key, e.g. ENG)')
        return self


class GitSettings(BaseModel):
    """Session worktrees and merges (see docs/worktrees.md). Checked again by `GitOptions` in the application."""

    base_branch: str = "main"
    branch_pattern: str = "feature/{task_id}/{short_id}"
    worktrees_dir: str = ".worktrees"
    merge_strategy: Literal["rebase", "merge"] = "rebase"
    merge_mode: Literal["ff-only", "no-ff"] = "ff-only"
    orphans: Literal["prune", "report"] = "prune"
    max_patch_bytes: int = Field(default=200_000, ge=1_000, le=50_000_000)


class ForgeSettings(BaseModel):
    """`[forge]` (or `[projects.<name>.forge]`): where a session's branch is pushed and opened as a pull request,
    and how its checks and reviews come back (docs/forge.md). `kind = "none"` keeps today's local merge."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["none", "github"] = "none"
    remote: str = Field(default="origin", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    api_url: str = Field(default="https://api.github.com", pattern=r"^https?://")
    # owner/name; unset: read from the remote's URL (github.com/acme/shop.git → acme/shop)
    repository: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    # the environment variable holding the token: never copied into an agent's environment, a file or a log
    token_env: str = Field(default="GITHUB_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # the environment variable holding the webhook secret; unset: webhooks are refused, polling only
    webhook_secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    merge_method: Literal["merge", "squash", "rebase"] = "merge"
    auto_merge: bool = True  # merge through the forge once the approved head is green (else `session merge`)
    max_ci_rounds: int = Field(default=3, ge=0, le=100)
    max_review_rounds: int = Field(default=3, ge=0, le=100)
    max_rebase_rounds: int = Field(default=2, ge=0, le=100)
    min_checks: int = Field(default=1, ge=0, le=1000)  # a head with fewer reported checks is still pending
    log_tail_lines: int = Field(default=80, ge=1, le=10_000)
    poll_s: float = Field(default=30.0, gt=0, le=86_400)  # how often an open pull request is looked at
    draft: bool = False  # push and open a draft pull request when the work first reaches verifying (CI runs early)
    delete_branch: bool = True  # delete the pushed branch once merged (only if it is still at taskgate's head)
    console_url: str | None = Field(default=None, pattern=r"^https?://")  # links in pull requests; unset: the id


class ContextSettings(BaseModel):
    ttl_seconds: float = Field(default=30.0, ge=0, le=86_400)


class NodeSettings(BaseModel):
    """`[node]`: this service process's node (docs/nodes.md). `id` names it in the database; unset, it is the host
    name and a hash of the data dir's absolute path, stable across restarts of the same machine and data dir."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    heartbeat_s: float = Field(default=10.0, gt=0, le=3600)
    # How long a heartbeat holds the node's lease: once its last beat is older, a surviving node marks it down.
    # Unset: three heartbeats.
    lease_s: float | None = Field(default=None, gt=0, le=86_400)

    @model_validator(mode="after")
    def _lease_outlasts_beat(self) -> NodeSettings:
        if self.lease_s is not None and self.lease_s <= self.heartbeat_s:
            raise ValueError("lease_s must be longer than heartbeat_s, or every node would be found down between beats")
        return self


class SweeperSettings(BaseModel):
    """The sweeper's intervals (see docs/sweeper.md); `taskgate serve` sweeps every `interval_s` when enabled."""

    enabled: bool = True
    interval_s: float = Field(default=30.0, gt=0, le=86_400)
    session_deadline_hours: float = Field(default=24.0, gt=0)
    verification_escalation_hours: float = Field(default=72.0, gt=0)
    verification_timeout_days: float = Field(default=7.0, gt=0)
    heartbeat_timeout_minutes: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _escalation_before_timeout(self) -> SweeperSettings:
        if self.verification_escalation_hours >= self.verification_timeout_days * 24:
            raise ValueError("verification_escalation_hours must be shorter than verification_timeout_days")
        return self


class AuditSettings(BaseModel):
    """`[audit]`: the audit log's signing key and checkpoints (docs/audit.md)."""

    model_config = ConfigDict(extra="forbid")

    # The Ed25519 private key that signs checkpoints (its public half beside it, `.pub`). Unset:
    # `<data_dir>/audit-key/signing-key.pem`. Keep it off the database's machine to make the signatures mean more.
    key_file: Path | None = None
    # How often the sweeper's turn signs a checkpoint over the chains that grew (0: only on demand).
    checkpoint_interval_s: float = Field(default=300.0, ge=0, le=7 * 86_400)
    # How often `taskgate serve` links the audited records committed since its last pass (0: only before a
    # checkpoint, verify, export or prune). Until linked, a record is not yet covered by its chain.
    link_interval_s: float = Field(default=1.0, ge=0, le=3600)


class OutputsSettings(BaseModel):
    """`[outputs]`: limits of the session folders (`<data_dir>/agent-outputs/<session id>/`, see docs/agents.md)."""

    model_config = ConfigDict(extra="forbid")

    max_output_bytes: int = Field(default=10 * 1024 * 1024, ge=1, le=1024**3)
    max_outputs: int = Field(default=1000, ge=1, le=100_000)
    max_session_bytes: int = Field(default=256 * 1024 * 1024, ge=1, le=1024**4)


class WebhookSettings(BaseModel):
    """A webhook subscriber (`[[webhooks]]`, see docs/events.md). Its secret comes from the environment variable
    named by `secret_env` (preferred: keeps it out of the file), or from `secret`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    url: str = Field(pattern=r"^https?://")
    secret: SecretStr | None = None
    secret_env: str | None = None
    events: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    timeout_s: float = Field(default=5.0, gt=0, le=300)
    max_attempts: int = Field(default=8, ge=1, le=1000)
    backoff_base_s: float = Field(default=1.0, ge=0, le=86_400)
    backoff_max_s: float = Field(default=300.0, ge=0, le=7 * 86_400)
    # Where a new subscriber (no delivery rows yet) starts: "none", the events after it is first seen; "all",
    # the whole events log. Read only while it is new: changing it later does not move a started subscriber.
    backfill: Literal["none", "all"] = "none"

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookSettings:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError("a webhook names exactly one of secret_env or secret")
        return self

    def resolved_secret(self) -> str:
        """The signing secret. Raises: InvalidInput when the `secret_env` variable is unset or empty."""
        if self.secret is not None:
            return self.secret.get_secret_value()
        value = os.environ.get(self.secret_env or "")
        if not value:
            raise InvalidInput(f"webhook {self.name}: environment variable {self.secret_env} (secret_env) is not set")
        return value


class EscalationSettings(BaseModel):
    """`[escalation]`: who is told when the sweeper escalates a verification (see docs/sweeper.md). `webhooks`
    names `[[webhooks]]` subscribers that receive `session.escalated` whatever their own `events` filter says."""

    model_config = ConfigDict(extra="forbid")

    webhooks: list[str] = Field(default_factory=list)


class QuestionSettings(BaseModel):
    """`[questions]`: agents' questions and permission prompts to the operator (docs/questions.md). A question
    unanswered for `timeout_s` times out: the agent is told (a permission prompt is denied) and decides for itself
    (`on_timeout = "continue"`), or the session is also failed for manual review, its work kept (`"fail"`)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=1800.0, gt=0, le=7 * 86400)
    on_timeout: Literal["continue", "fail"] = "continue"
    poll_s: float = Field(default=0.5, gt=0, le=60)


class AgentSettings(BaseModel):
    """`[agents.NAME]`: one agent type (see docs/agents.md). Placeholders are filled per argv element. A table may
    name a built-in `preset` (or be named like one) and set only the keys it changes."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = None
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86_400)
    max_output_bytes: int | None = Field(default=None, gt=0)
    # The `{prompt}` this agent type gets (placeholders as in `command`, except `{prompt}` itself).
    prompt: str | None = None
    credentials: list[str] | None = None  # service environment variables passed to the agent (allow-list)
    mcp: Literal["env", "claude", "codex", "none"] | None = None
    output_format: Literal["text", "claude-stream-json", "codex-json", "aider"] | None = None
    # No progress for this long: stalled (an event, an escalation, a stop; docs/agents.md). 0: never.
    stall_s: float | None = Field(default=None, ge=0, le=7 * 86_400)
    stall_patterns: list[str] | None = None  # regular expressions of output lines that are not progress
    # a failed run ending with such a line (a 429, a usage limit) is launched again after a back-off (docs/budgets.md)
    quota_patterns: list[str] | None = None
    quota_retries: int | None = Field(default=None, ge=0, le=100)
    quota_wait_s: float | None = Field(default=None, ge=0, le=86_400)
    # folders the CLI keeps in the worktree's top that git must ignore (a `.gitignore` of `*` is put in each)
    ignored: list[str] | None = None
    # its sandbox (docs/agents.md): "none", "open", or `host:port` entries allowed besides taskgate's MCP endpoint
    # and its model endpoint; folders shown read-only besides its toolchain
    network: Literal["none", "open"] | list[str] | None = None
    read: list[str] | None = None
    # how its CLI continues its earlier conversation: argv put before the `{prompt}` argument, with
    # `{conversation_id}`; [] never resumes (docs/agents.md, resuming)
    resume: list[str] | None = None

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in _presets():
            raise ValueError(f"unknown preset {value!r}; known: {', '.join(sorted(_presets()))}")
        return value

    @field_validator("credentials")
    @classmethod
    def _variable_names(cls, value: list[str] | None) -> list[str] | None:
        bad = [name for name in value or () if not _ENV_NAME.match(name)]
        if bad:
            raise ValueError(f"not an environment variable name: {', '.join(map(repr, bad))}")
        return value

    def changes(self) -> dict[str, Any]:
        """The keys this table sets (what it changes of its preset)."""
        return self.model_dump(exclude_unset=True, exclude={"preset"})


class ExecutionSettings(BaseModel):
    """`[execution]`: which agents a session runs, how many at once, and what a failed agent means."""

    model_config = ConfigDict(extra="forbid")

    default_agents: list[str] = Field(default_factory=list)
    max_agents_per_session: int = Field(default=8, ge=1, le=64)
    max_agents_total: int = Field(default=16, ge=1, le=1024)
    on_agent_failure: Literal["fail", "verify"] = "fail"
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=3600)
    # A stop sends SIGTERM to the agent's process group, then SIGKILL to what is left after this long.
    stop_grace_s: float = Field(default=2.0, gt=0, le=600)


class SandboxSettings(BaseModel):
    """`[sandbox]`: each agent process in bubblewrap (docs/agents.md, "What an agent can and cannot do"). `auto`:
    confined where the host supports it, else unconfined with the reason in doctor, agents list and the audit log;
    `bwrap`: confined or not started; `off`: unconfined, said everywhere the same way."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "bwrap", "off"] = "auto"
    read: list[str] = Field(default_factory=list)  # folders every agent sees read-only besides its toolchain
    hide: list[str] = Field(default_factory=list)  # folders hidden besides the home, /tmp, the project and data
    write: list[str] = Field(default_factory=list)  # folders every agent may write besides its own (a shared cache)
    pids: int | None = Field(default=1024, ge=16, le=1_000_000)  # processes per agent (a fork bomb ends there)
    memory_mb: int | None = Field(default=8192, ge=64, le=16 * 1024 * 1024)  # memory per agent (then OOM-killed)

    @field_validator("read", "hide", "write")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        bad = [p for p in value if not os.path.isabs(os.path.expanduser(p))]
        if bad:
            raise ValueError(f"must be absolute paths (or ~/…): {', '.join(map(repr, bad))}")
        return [os.path.expanduser(p) for p in value]


class WorkflowSettings(BaseModel):
    """`[workflows]`: the workflow a new session runs unless one is chosen, and the loop guard."""

    model_config = ConfigDict(extra="forbid")

    default: str | None = Field(default=None, description="workflow id; unset: sessions run execution.default_agents")
    max_iterations: int = Field(default=100, ge=1, le=100_000)
    loop_window: int = Field(default=5, ge=2, le=100)
    loop_repeats: int = Field(default=3, ge=2, le=100)


class DispatchSettings(BaseModel):
    """`[dispatch]`: whether taskgate starts sessions by itself on ready tasks that a workflow's `task_ready` or
    `label:<name>` trigger takes (docs/workflows.md#triggers-and-dispatch), as which operator, for which projects."""

    model_config = ConfigDict(extra="forbid")

    auto_start: bool = False
    operator: str | None = Field(default=None, description="operator id; unset: operator.default")
    projects: list[str] = Field(default_factory=list, description="project names; empty: every project")
    # the shadow mode: each sweep says what it would start and why, and nothing is written (no session, no claim)
    dry_run: bool = False
    # run the work: after the start, the workflow's agents are launched (planning → executing) by `serve`; false:
    # the session waits in planning for `session execute`. `taskgate sweep` (one pass, then exit) never executes.
    execute: bool = True
    max_running: int = Field(default=0, ge=0, le=10_000)  # per project, sessions in planning or executing; 0: no cap
    max_running_per_label: dict[str, int] = Field(default_factory=dict)  # task label → cap
    max_running_per_agent: dict[str, int] = Field(default_factory=dict)  # agent preset → cap
    max_awaiting_decision: int = Field(default=0, ge=0, le=10_000)  # stop while this many wait in verifying; 0: never
    max_retries: int = Field(default=3, ge=0, le=100)  # retries of a task whose dispatched session failed
    retry_base_s: float = Field(default=60.0, gt=0, le=86_400)  # the first retry's wait, doubled each time

    @field_validator("max_running_per_label", "max_running_per_agent")
    @classmethod
    def _caps(cls, value: dict[str, int]) -> dict[str, int]:
        bad = sorted(k for k, v in value.items() if v < 1)
        if bad:
            raise ValueError(f"the cap of {bad[0]!r} must be at least 1 (leave it out for no cap)")
        return value


class Settings(BaseSettings):
    """All of taskgate's configuration. Build it with `load_settings()`."""

    model_config = SettingsConfigDict(env_prefix="TASKGATE_", env_nested_delimiter="__", extra="forbid")

    data_dir: Path = Path("data")
    database_url: str | None = None
    operator: OperatorSettings = OperatorSettings()
    policies: PoliciesSettings = PoliciesSettings()
    projects: dict[str, ProjectSettings] = {}
    sqlite: SqliteSettings = SqliteSettings()
    mcp: McpSettings = McpSettings()
    git: GitSettings = GitSettings()
    forge: ForgeSettings = ForgeSettings()
    hooks: HooksSettings = HooksSettings()
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    execution: ExecutionSettings = ExecutionSettings()
    sandbox: SandboxSettings = SandboxSettings()
    workflows: WorkflowSettings = WorkflowSettings()
    dispatch: DispatchSettings = DispatchSettings()
    context: ContextSettings = ContextSettings()
    tracker: TrackerSettings = TrackerSettings()
    webhooks: list[WebhookSettings] = []
    notify: NotifySettings = NotifySettings()
    sweeper: SweeperSettings = SweeperSettings()
    escalation: EscalationSettings = EscalationSettings()
    questions: QuestionSettings = QuestionSettings()
    node: NodeSettings = NodeSettings()
    outputs: OutputsSettings = OutputsSettings()
    audit: AuditSettings = AuditSettings()
    budgets: dict[str, Any] = Field(default_factory=dict)  # spend caps: domain/budgets.py parses and checks them
    config_file: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _budgets_valid(self) -> Settings:
        if not self.budgets and not any(p.budgets for p in self.projects.values()):
            return self  # nothing to check: the built-in defaults are valid
        from taskgate.domain.budgets import parse_budgets

        try:
            parse_budgets(self.budgets, {name: p.budgets for name, p in self.projects.items()})
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return self

    def budget_book(self) -> Budgets:
        """`[budgets]` with each project's own table over it (checked when the settings were loaded)."""
        from taskgate.domain.budgets import parse_budgets

        return parse_budgets(self.budgets, {name: p.budgets for name, p in self.projects.items()})

    @model_validator(mode="after")
    def _agents_have_commands(self) -> Settings:
        for name, agent in self.agents.items():
            if agent.command is None and agent.preset is None and name not in _presets():
                raise ValueError(
                    f'agents.{name}: give a command, or name a preset (preset = "claude"); '
                    f"presets: {', '.join(sorted(_presets()))}"
                )
        return self

    @model_validator(mode="after")
    def _forge_token_kept_from_agents(self) -> Settings:
        """The forge's and the tracker's tokens never reach an agent: no agent type may pass their variables on."""
        forges = [self.forge, *(p.forge for p in self.projects.values() if p.forge is not None)]
        secrets = {f.token_env for f in forges if f.kind != "none"}
        secrets |= {f.webhook_secret_env for f in forges if f.kind != "none" and f.webhook_secret_env}
        trackers = [self.tracker, *(p.tracker for p in self.projects.values() if p.tracker is not None)]
        tokens = {t.github.token_env for t in trackers if t.kind == "github"}
        tokens |= {t.linear.token_env for t in trackers if t.kind == "linear"}
        for name, agent in self.agents.items():
            passed = set(agent.credentials or ()) | set(agent.env or {})
            if found := sorted(passed & (secrets | tokens)):
                keeper = "[forge]" if set(found) & secrets else "[tracker]"
                raise ValueError(
                    f"agents.{name} passes {', '.join(found)} on to its agents, but {keeper} keeps it for taskgate: "
                    f"agents never get the forge's or the tracker's token (docs/forge.md, docs/trackers.md); "
                    f"remove it from agents.{name}"
                )
        return self

    @model_validator(mode="after")
    def _escalation_webhooks_exist(self) -> Settings:
        known = [hook.name for hook in self.webhooks]
        unknown = [name for name in self.escalation.webhooks if name not in known]
        if unknown:
            raise ValueError(
                f"escalation.webhooks names no [[webhooks]] entry: {', '.join(unknown)} "
                f"(configured: {', '.join(known) or 'none'})"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)

    @property
    def resolved_node_id(self) -> str:
        """`[node] id`, else `<host>-<8 hex of sha256(the data dir's absolute path)>`: one id per machine and data
        dir, the same after a restart."""
        if self.node.id:
            return self.node.id
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:8]
        return f"{socket.gethostname()[:180]}-{digest}"

    @property
    def resolved_audit_key(self) -> Path:
        """`[audit] key_file`, else `<data_dir>/audit-key/signing-key.pem`."""
        return self.audit.key_file or self.data_dir / "audit-key" / "signing-key.pem"

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file under the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'taskgate.db').resolve()}"


def load_settings(cwd: Path | None = None, **overrides: Any) -> Settings:
    """Settings from (in order of precedence) `overrides`, the environment, the config file, defaults.

    Relative paths in the config file are resolved against the folder holding `.taskgate/` or `config/`. Under
    `.taskgate/taskgate.toml` the data directory defaults to `.taskgate/data` (ignored by git), else to `data`.
    Raises: InvalidInput for a missing explicit config file or invalid values (message names the field).
    """
    path = find_config_file(cwd)
    base = config_base(path, cwd)
    checked = _CHANNELS_CHECKED.set(not overrides and settings_cache.recall(cwd) is not None)
    try:
        settings = _settings_class(path)(**overrides)
    except ValueError as exc:
        raise InvalidInput(f"invalid configuration ({path or 'defaults'}): {_first_error(exc)}") from None
    finally:
        _CHANNELS_CHECKED.reset(checked)
    if path is not None and path.parent.name == ".taskgate" and "data_dir" not in settings.model_fields_set:
        settings = settings.model_copy(update={"data_dir": PROJECT_DATA_DIR})
    data_dir = settings.data_dir if settings.data_dir.is_absolute() else (base / settings.data_dir)
    return settings.model_copy(update={"data_dir": data_dir.resolve(), "config_file": path})


def _settings_class(path: Path | None) -> type[Settings]:
    if path is None:
        return Settings

    class FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=path))

    return FileSettings


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"]).removeprefix("Value error, ")
    return str(exc)
