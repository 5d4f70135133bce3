"""The schema as SQLAlchemy Core tables. Alembic migrations create it; nothing calls `create_all` outside tests
of the migrations themselves. Timestamps are stored as UTC and come back timezone-aware."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

BigId = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only INTEGER PRIMARY KEY


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on SQLite (which has no time zones) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


TERMINAL_SQL = "state NOT IN ('completed', 'cancelled')"

projects = Table(
    "projects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("key", String(8), nullable=False, unique=True),
    Column("root_path", Text, nullable=False, unique=True),
    Column("config", JSON, nullable=False, default=dict),
    Column("task_seq", Integer, nullable=False, server_default=text("0")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("archived_at", UtcDateTime, nullable=True),
)

plans = Table(
    "plans",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project_id", Integer, ForeignKey("projects.id"), nullable=False, index=True),
    Column("name", String(100), nullable=False),
    Column("status", String(20), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", Integer, ForeignKey("projects.id"), nullable=False),
    Column("plan_id", Integer, ForeignKey("plans.id"), nullable=True, index=True),
    Column("title", Text, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("priority", Integer, nullable=False),
    Column("status", String(20), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    # Which tracker the task came from: "builtin", or "beads" for issues imported or synced from Beads.
    Column("source", String(16), nullable=False, server_default=text("'builtin'")),
    # What the external tracker says of the task (migration 0010): its own id there, its status in its own
    # words, and why it keeps the issue out of its ready set (null: nothing does). See docs/trackers.md.
    Column("external_id", String(64), nullable=True),
    Column("tracker_status", String(32), nullable=True),
    Column("hold", String(200), nullable=True),
    # Task labels (migration 0011): a JSON list of texts, each a task label (domain/workflows/triggers.py), as given.
    Column("labels", JSON, nullable=False, server_default=text("'[]'")),
    Index("ix_tasks_project_status", "project_id", "status"),
    Index("uq_tasks_project_source_external", "project_id", "source", "external_id", unique=True),
)

task_dependencies = Table(
    "task_dependencies",
    metadata,
    Column("task_id", String(64), ForeignKey("tasks.id"), primary_key=True),
    Column("depends_on_id", String(64), ForeignKey("tasks.id"), primary_key=True, index=True),
    Column("type", String(32), nullable=False, default="blocks"),
)

operators = Table(
    "operators",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("email", String(320), nullable=True),
    Column("roles", JSON, nullable=False),
    Column("permissions", JSON, nullable=False),
    Column("max_active_sessions", Integer, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("task_id", String(64), ForeignKey("tasks.id"), nullable=False),
    Column("project_id", Integer, ForeignKey("projects.id"), nullable=False, index=True),
    Column("plan_id", Integer, ForeignKey("plans.id"), nullable=True),
    Column("operator_id", String(100), ForeignKey("operators.id"), nullable=True),
    Column("state", String(20), nullable=False),
    Column("prior_state", String(20), nullable=True),
    Column("state_data", JSON, nullable=False),
    Column("workflow_stack", JSON, nullable=False),
    Column("branch_name", Text, nullable=True),
    Column("worktree_path", Text, nullable=True),
    Column("compensation_plan", String(32), nullable=True),
    Column("version", Integer, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("completed_at", UtcDateTime, nullable=True),
    Column("deadline", UtcDateTime, nullable=True),
    Column("node_id", String(200), nullable=True),  # the node holding its worktree (None: before 0013)
    Index("ix_sessions_plan_state", "plan_id", "state"),
    Index("ix_sessions_project_state_updated", "project_id", "state", "updated_at"),  # the board (0025)
    Index("ix_sessions_task_id", "task_id"),
    # Backstop for "one active session per task": the guard reads under a lock, the index makes it impossible.
    Index(
        "uq_sessions_active_task",
        "task_id",
        unique=True,
        sqlite_where=text(TERMINAL_SQL),
        postgresql_where=text(TERMINAL_SQL),
    ),
)

transition_log = Table(
    "transition_log",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("from_state", String(20), nullable=True),
    Column("to_state", String(20), nullable=False),
    Column("outcome", String(10), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    Column("guard_results", JSON, nullable=False),
    Column("session_version", Integer, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Index("ix_transition_log_session_seq", "session_id", "seq"),
    Index("ix_transition_log_session_at", "session_id", "at"),
    Index("ix_transition_log_actor_at", "actor", "at"),
    Index("ix_transition_log_to_state_at", "to_state", "at"),
    Index("ix_transition_log_at", "at"),
)

decisions = Table(
    "decisions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False, index=True),
    Column("operator_id", String(100), ForeignKey("operators.id"), nullable=False),
    Column("decision", String(20), nullable=False),
    Column("reason", Text, nullable=True),
    Column("instructions", Text, nullable=True),
    Column("override_policies", JSON, nullable=False),
    Column("compensation", String(32), nullable=True),
    Column("session_version", Integer, nullable=False),
    Column("policy_results", JSON, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    # applied (moved the session) | pending (an approval counted, more are needed) | blocked (guards refused)
    Column("outcome", String(20), nullable=False, server_default=text("'applied'")),
    Column("to_state", String(20), nullable=True),
    Index("uq_decisions_verification_operator", "session_id", "session_version", "operator_id", unique=True),
)

agents = Table(
    "agents",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False, index=True),
    Column("agent_type", String(100), nullable=False),
    Column("command", JSON, nullable=False),
    Column("status", String(20), nullable=False),
    Column("exit_code", Integer, nullable=True),
    Column("output_path", Text, nullable=True),
    Column("started_at", UtcDateTime, nullable=True),
    Column("completed_at", UtcDateTime, nullable=True),
    Column("heartbeat_at", UtcDateTime, nullable=True),
    Column("run", Integer, nullable=False, server_default=text("1")),  # 1, then +1 per request_changes relaunch
    Column("pid", Integer, nullable=True),  # the process group leader, to re-attach after a restart
    Column("output_tail", Text, nullable=False, server_default=text("''")),
    Column("error", Text, nullable=True),
    Column("report", JSON(none_as_null=True), nullable=True),  # the agent CLI's account of its run (AgentReport)
    Column("node_id", String(200), nullable=True),  # the node that launched it and supervises it (None: before 0012)
    Column("pgid", Integer, nullable=True),  # its process group (0018)
    Column("process_start", BigInteger, nullable=True),  # the leader's start time, clock ticks since boot (0018)
    Column("ended_by", String(16), nullable=True),  # SIGTERM | SIGKILL: the signal a stop ended it with (0018)
    Column("sandbox", String(1000), nullable=True),  # how it was confined: "bwrap; network …" or "off: why" (0019)
    Column("conversation_id", String(200), nullable=True),  # its CLI's own conversation (0023)
    Column("resumed_from", String(200), nullable=True),  # the earlier conversation it continued (0023)
    Column("resume_failed", Text, nullable=True),  # why continuing it failed: it ran afresh (0023)
    Index("ix_agents_status", "status"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("data_dir", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(50), nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("heartbeat_at", UtcDateTime, nullable=False),
    Column("url", Text, nullable=True),  # where it serves MCP over HTTP, if it does (0013)
    Column("down_at", UtcDateTime, nullable=True),  # when a surviving node found its lease expired (0013)
)

# Named leases (0013): the work one node at a time does for all (the sweeper's turn). `holder` is the process
# (node id and pid); a lease is taken over only once `expires_at` has passed (docs/nodes.md).
leases = Table(
    "leases",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("holder", String(300), nullable=False),
    Column("node_id", String(200), nullable=False),
    Column("acquired_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", String(36), nullable=True, index=True),
    Column("kind", String(64), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("at", UtcDateTime, nullable=False, index=True),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("kind", String(16), nullable=False),
    Column("operator_id", String(100), ForeignKey("operators.id"), nullable=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=True),
    Column("label", String(200), nullable=False, server_default=text("''")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
    Column("agent_id", String(36), nullable=True),  # the agent whose token it is: revoked when that agent ends
    Index("ix_api_tokens_agent", "agent_id"),
    Index("ix_api_tokens_session", "session_id"),
)

session_snapshots = Table(
    "session_snapshots",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False),
    Column("kind", String(20), nullable=False),  # context | checkpoint
    Column("actor", String(200), nullable=False),
    Column("note", Text, nullable=True),
    Column("data", JSON, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Index("ix_session_snapshots_session_id", "session_id", "id"),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("event_id", BigId, ForeignKey("events.id"), nullable=False),
    Column("subscriber", String(100), nullable=False),
    Column("status", String(20), nullable=False),  # pending | delivered | failed (gave up)
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", UtcDateTime, nullable=True),
    UniqueConstraint("event_id", "subscriber", name="uq_webhook_deliveries_event_subscriber"),
    Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
)

test_runs = Table(
    "test_runs",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False),
    Column("session_version", Integer, nullable=False),
    Column("command", JSON, nullable=False),
    Column("exit_code", Integer, nullable=True),
    Column("timed_out", Boolean, nullable=False, server_default=false()),
    Column("duration_ms", Integer, nullable=False),
    Column("output_tail", Text, nullable=False),
    Column("head_commit", String(64), nullable=True),
    Column("at", UtcDateTime, nullable=False),
    Index("ix_test_runs_session_id", "session_id", "id"),
)

step_runs = Table(
    "step_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False),
    Column("depth", Integer, nullable=False),  # the frame's depth on the workflow stack, 1 = the root workflow
    Column("frame", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status", String(32), nullable=False),
    Column("output_summary", Text, nullable=False, server_default=text("''")),
    Column("agent_ids", JSON, nullable=False),
    Column("error", Text, nullable=True),
    Column("started_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime, nullable=True),
    Index("ix_step_runs_session", "session_id", "id"),
)

tracker_writebacks = Table(
    "tracker_writebacks",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("project_id", Integer, ForeignKey("projects.id"), nullable=False),
    Column("task_id", String(64), ForeignKey("tasks.id"), nullable=False),
    Column("session_id", String(36), nullable=True),
    Column("tracker", String(16), nullable=False),
    Column("status", String(20), nullable=False),  # the taskgate task status to write
    Column("reason", Text, nullable=False, server_default=text("''")),
    Column("state", String(16), nullable=False),  # pending | done | failed | dismissed | superseded
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("resolved_by", String(100), nullable=True),  # who retried or dismissed it
    Index("ix_tracker_writebacks_state_next", "state", "next_attempt_at"),
    Index("ix_tracker_writebacks_task", "task_id", "id"),
)

# -- The forge loop (0020, docs/forge.md) ------------------------------------------------------------------------------
# One row per session pushed to a forge: what taskgate pushed, the pull request, the forge's last look (JSON, cleared by
# each push; stored by compare-and-swap on `pushed`), what happened last, and a webhook's poke.
pull_requests = Table(
    "pull_requests",
    metadata,
    Column("session_id", String(36), ForeignKey("sessions.id"), primary_key=True),
    Column("project_id", Integer, ForeignKey("projects.id"), nullable=False),
    Column("branch", String(500), nullable=False),
    Column("base", String(500), nullable=False),
    Column("number", Integer, nullable=True),
    Column("url", Text, nullable=True),
    Column("pushed", String(64), nullable=True),
    Column("pushed_at", UtcDateTime, nullable=True),
    Column("status", String(32), nullable=False),
    Column("observation", JSON, nullable=True),
    Column("observed_at", UtcDateTime, nullable=True),
    Column("note", Text, nullable=False, server_default=text("''")),
    Column("error", Text, nullable=True),
    Column("poke", Boolean, nullable=False, server_default=false()),
    Column("updated_at", UtcDateTime, nullable=False),
    Index("ix_pull_requests_branch", "branch"),
)

# Webhook deliveries from the forge: accepted ones by their delivery id (a replay is refused by the key), refused and
# replayed ones under an id of their own, so both are counted.
forge_deliveries = Table(
    "forge_deliveries",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("event", String(100), nullable=False),
    Column("outcome", String(16), nullable=False),  # accepted | refused | replay
    Column("received_at", UtcDateTime, nullable=False),
)

# -- Tracker polls (0021, docs/trackers.md) --------------------------------------------------------------------------
# One row per project read from an external tracker: the last poll (when, what it cost, whether it failed) and what it
# found and dispatch made of it (JSON: ready, held with why, claimed, each dispatch decision), written by the one
# process that polls (the sweeper's lease) and read by `taskgate tracker status` and the console from any process.
tracker_polls = Table(
    "tracker_polls",
    metadata,
    Column("project_id", Integer, ForeignKey("projects.id"), primary_key=True),
    Column("provider", String(32), nullable=False),
    Column("describe", Text, nullable=False),
    Column("polled_at", UtcDateTime, nullable=False),
    Column("error", Text, nullable=True),
    Column("calls", Integer, nullable=False),
    Column("not_modified", Integer, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("report", JSON, nullable=False),
)

# -- Notifications (0024, docs/notifications.md) ---------------------------------------------------------------------
# The notifier's cursor over the events log (one row, "events"), and one row per (channel, event) notice: pending until
# its channel's batch is sent. A channel is a hash of its Apprise URL (application/notifications/notifier.py), so no
# secret of the URL is stored.
notification_cursor = Table(
    "notification_cursor",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("event_id", BigId, nullable=False),
)

notifications = Table(
    "notifications",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("channel", String(32), nullable=False),
    Column("event_id", BigId, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("notice", JSON, nullable=False),
    Column("queued_at", UtcDateTime, nullable=False),
    Column("status", String(16), nullable=False),  # pending | sent | failed (gave up)
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("sent_at", UtcDateTime, nullable=True),
    UniqueConstraint("channel", "event_id", name="uq_notifications_channel_event"),
    Index("ix_notifications_channel_status", "channel", "status", "event_id"),
)

# -- The audit chains (0014, docs/audit.md) ---------------------------------------------------------------------------
# Each audited record (a row of transition_log, decisions or events) has one link: its place in its chain and its
# link hash (domain/audit/chain.py), written by the linker after the record's commit (since 0016). A chain's head
# row is the last link's seq and hash; `signed_seq` is how far the newest checkpoint covers it.
audit_links = Table(
    "audit_links",
    metadata,
    # Since 0017 links are stored in the order the linker writes them: `link_no` is given out by the linker (one
    # at a time holds the marks), so the table and its one index grow at their right edge, a few pages a batch
    # whatever the history. Keyed by (chain_id, chain_seq) before, each chain a batch grew was a page of its own in
    # a b-tree that deepened with the history (benchmarks/audit_link_batches.py). A chain's links are in seq order
    # within link order; `prev_no` is the chain's link before (a window's first record needs its hash).
    Column("link_no", BigId, primary_key=True, autoincrement=False),
    Column("chain_id", String(120), nullable=False),
    Column("chain_seq", BigInteger, nullable=False),
    Column("record_table", String(20), nullable=False),
    Column("record_id", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("prev_no", BigInteger, nullable=True),  # None at a chain's first link
    # A record's link, and a session's links through its records' session_id indexes (audit_store.py).
    Index("uq_audit_links_record", "record_table", "record_id", unique=True),
)

audit_chains = Table(
    "audit_chains",
    metadata,
    Column("chain_id", String(120), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("signed_seq", BigInteger, nullable=False, server_default=text("0")),
    Column("link_no", BigInteger, nullable=True),  # the head's link (0017); None for the checkpoint chain
    # A rowid table on SQLite since 0017 (WITHOUT ROWID before): rows sit in the order chains were created, the
    # chain id in an index of its own that moving a head leaves alone, so a linker pass rewrites the heads of the
    # sessions at work, which sit together near the end, instead of a page per chain (benchmarks/
    # audit_link_batches.py: 80 pages a pass against 258 on 1,000,000 links).
)

# How far each audited table's records are linked (0016): every record of `record_table` with a primary key up to
# `linked_upto` has its link; those above it wait for the linker (application/audit/linking.py, docs/audit.md).
audit_marks = Table(
    "audit_marks",
    metadata,
    Column("record_table", String(20), primary_key=True),
    Column("linked_upto", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)

audit_checkpoints = Table(
    "audit_checkpoints",
    metadata,
    Column("number", Integer, primary_key=True, autoincrement=False),
    Column("at", UtcDateTime, nullable=False),
    Column("reason", String(20), nullable=False),
    Column("body", Text, nullable=False),  # the canonical JSON that is hashed and signed (domain/audit/checkpoints.py)
    Column("signature", Text, nullable=True),  # base64 Ed25519 over `body`
    Column("key_id", String(64), nullable=False),
)


# -- Agents' questions to the operator (0022, docs/questions.md) -----------------------------------------------------
# One row per question or permission prompt an agent asked (domain/questions.py). It is written open, and ended once
# by a compare-and-swap on status = 'open' (answered, timed_out or cancelled), so racing answers leave one.
operator_questions = Table(
    "operator_questions",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("session_id", String(36), ForeignKey("sessions.id"), nullable=False),
    Column("agent_id", String(64), nullable=True),
    Column("kind", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("choices", JSON, nullable=False),
    Column("tool_name", String(200), nullable=True),
    Column("tool_input", Text, nullable=True),
    Column("asked_by", String(200), nullable=False),
    Column("asked_at", UtcDateTime, nullable=False),
    Column("deadline", UtcDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("answer", Text, nullable=True),
    Column("message", Text, nullable=True),
    Column("answered_by", String(200), nullable=True),
    Column("answered_at", UtcDateTime, nullable=True),
    Index("ix_operator_questions_open", "status", "session_id"),
    Index("ix_operator_questions_session", "session_id", "asked_at"),
)

ALL_TABLES = [
    projects,
    plans,
    tasks,
    task_dependencies,
    operators,
    sessions,
    transition_log,
    decisions,
    agents,
    events,
    api_tokens,
    session_snapshots,
    webhook_deliveries,
    test_runs,
    step_runs,
    tracker_writebacks,
    nodes,
    leases,
    pull_requests,
    forge_deliveries,
    audit_links,
    audit_chains,
    audit_marks,
    audit_checkpoints,
    notification_cursor,
    notifications,
    tracker_polls,
    operator_questions,
]
