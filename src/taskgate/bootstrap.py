"""The composition root: the one place that builds taskgate's services from settings. Tests call it with fakes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskgate import __version__
from taskgate.application.agents.outputs import ManifestEffect, OutputService
from taskgate.application.agents.ports import AgentRunner
from taskgate.application.agents.supervisor import AgentService, ExecutionOptions
from taskgate.application.audit.ledger import AuditLedger
from taskgate.application.audit.queries import AuditService
from taskgate.application.forge.deliveries import ForgeDeliveries
from taskgate.application.forge.follower import ForgeFollower
from taskgate.application.forge.publish import ForgePublisher
from taskgate.application.nodes.adoption import SessionAdoption
from taskgate.application.nodes.heartbeats import NodeIdentity, NodeService
from taskgate.application.notifications.notifier import Channel, Notifier, NotifyOptions
from taskgate.application.operators.access import AccessService
from taskgate.application.operators.decisions import DecisionService
from taskgate.application.operators.questions import OperatorQuestions, QuestionOptions
from taskgate.application.operators.review_queue import ReviewQueue
from taskgate.application.operators.roster import OperatorService
from taskgate.application.ports import Clock, IdGenerator, UnitOfWorkFactory
from taskgate.application.recovery import Recovery
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.effects import CompositeEffects, SessionEffects
from taskgate.application.sessions.engine import SessionService
from taskgate.application.sessions.guards import GuardEvaluator
from taskgate.application.sessions.policy_book import PolicyBook, ProjectPolicies
from taskgate.application.sessions.ports import TestRunner
from taskgate.application.sweeper import ESCALATED_EVENT, Sweeper, SweeperOptions
from taskgate.application.trackers.builtin import TrackerService
from taskgate.application.trackers.dispatch import Dispatcher, DispatchOptions
from taskgate.application.trackers.polling import TrackerPoller
from taskgate.application.trackers.ports import TrackerProvider
from taskgate.application.trackers.routing import Trackers, TrackerSpec
from taskgate.application.trackers.sync import TrackerClaim, TrackerSync
from taskgate.application.trackers.writebacks import TrackerWriteBack, WritebackService
from taskgate.application.webhooks.outbox import Subscriber, WebhookDispatcher
from taskgate.application.workflows.engine import WorkflowEngine, WorkflowOptions
from taskgate.application.workflows.library import WorkflowService
from taskgate.application.workspaces.context import ContextScout
from taskgate.application.workspaces.hooks import HookBook, Hooks, WorktreeHooks
from taskgate.application.workspaces.options import GitOptions
from taskgate.application.workspaces.ports import VcsProvider
from taskgate.application.workspaces.worktrees import WorkspaceService
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.dispatching import DispatchCaps
from taskgate.domain.entities import ApiToken, Compensation
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, TaskgateError
from taskgate.domain.outputs import OutputLimits
from taskgate.domain.policies.budget import BudgetCap
from taskgate.domain.policies.facts import Policy
from taskgate.domain.questions import Question
from taskgate.domain.sandbox import Limits
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.definitions import Catalogue
from taskgate.domain.workflows.run import LoopLimits
from taskgate.infrastructure import project_layout
from taskgate.infrastructure.agent_runner import SubprocessAgentRunner
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.project_files import ProjectFileReader
from taskgate.infrastructure.sandbox.sessions import BwrapSandboxes
from taskgate.infrastructure.session_folder import SessionFolderStore
from taskgate.infrastructure.settings import Settings, TrackerSettings, find_config_file, load_settings
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from taskgate.infrastructure.test_runner import SubprocessTestRunner
from taskgate.infrastructure.trackers import BeadsTracker
from taskgate.infrastructure.webhooks import HttpWebhookSender
from taskgate.infrastructure.workflow_files import BUILTIN_CATALOGUE, LayeredCatalogue
from taskgate.infrastructure.worktree_setup import LocalWorktreeSetup

if TYPE_CHECKING:  # the database layer (SQLAlchemy) loads when a database is opened: see `bootstrap`
    from taskgate.infrastructure.db.engine import Database
    from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
    from taskgate.infrastructure.forge.directory import SettingsForges

__all__ = [
    "BUILTIN_CATALOGUE",
    "App",
    "Settings",
    "bootstrap",
    "build_services",
    "database_report",
    "find_config_file",
    "load_settings",
    "project_layout",
]


@dataclass
class App:
    """Everything an entrypoint needs; `close()` releases the database."""

    settings: Settings | None
    sessions: SessionService
    tracker: TrackerService
    audit: AuditService
    access: AccessService
    workspaces: WorkspaceService
    context: ContextScout
    operators: OperatorService
    decisions: DecisionService
    review_queue: ReviewQueue
    database: Database | None = None
    uow: UnitOfWorkFactory | None = None  # for use cases built on demand (BeadsImporter)
    clock: Clock | None = None
    agents: AgentService | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    outputs: OutputService | None = None  # the session folders (save_output, manifest.json)
    workflows: WorkflowEngine | None = None  # the workflow runtime (session stacks)
    recovery: Recovery | None = None  # start-up recovery (`serve` runs it before the first request)
    nodes: NodeService | None = None  # this process's node: its heartbeat, and the list of every node
    adoption: SessionAdoption | None = None  # moving a down node's sessions here (docs/nodes.md)
    writebacks: WritebackService | None = None  # status writes owed to the external tracker (durable outbox)
    ledger: AuditLedger | None = None  # the audit chains' checkpoints, verification and retention (docs/audit.md)
    forge: ForgeFollower | None = None  # the forge loop (docs/forge.md), when a project has a [forge]
    forge_deliveries: ForgeDeliveries | None = None  # its webhook endpoint's use case
    forges: SettingsForges | None = None  # which forge each project has
    questions: OperatorQuestions | None = None  # agents' questions and permission prompts (docs/questions.md)

    async def close(self) -> None:
        """Run the closers (e.g. an agent endpoint), newest first, then release the database."""
        for closer in reversed(self.closers):
            await closer()
        if self.database is not None:
            await self.database.dispose()


def build_services(
    uow: UnitOfWorkFactory,
    *,
    clock: Clock,
    ids: IdGenerator,
    vcs: VcsProvider,
    policies: list[Policy] | PolicyBook,
    configured_tokens: Sequence[ApiToken] = (),
    tests: TestRunner | None = None,
) -> tuple[SessionService, TrackerService, AuditService, AccessService]:
    """Wire the use cases to any set of adapters (real or fake). `policies`: a fixed list for every project,
    or the configured `PolicyBook`; `tests` runs require_tests' command (default: a real subprocess)."""
    guards = GuardEvaluator(policies, uow=uow, vcs=vcs, tests=tests or SubprocessTestRunner(), clock=clock)
    sessions = SessionService(uow, guards, clock, ids)
    access = AccessService(uow, clock, configured_tokens)
    return sessions, TrackerService(uow, clock, vcs), AuditService(uow), access


def build_workspaces(
    sessions: SessionService,
    uow: UnitOfWorkFactory,
    *,
    clock: Clock,
    vcs: VcsProvider,
    git: GitOptions,
    context_ttl_seconds: float = 30.0,
    tracker: TrackerProvider | Trackers | None = None,
    tracker_service: TrackerService | None = None,
) -> tuple[WorkspaceService, ContextScout]:
    """The context scout, and the session worktrees attached to `sessions` as the effects of its transitions
    (followed by status write-back to the tracker when the project's tasks come from an external tracker)."""
    scout = ContextScout(uow, vcs, clock, context_ttl_seconds)
    workspaces = WorkspaceService(uow, vcs, clock, git, scout)
    workspaces.attach(sessions)
    trackers = tracker if isinstance(tracker, Trackers) else Trackers.single(tracker)
    if trackers.configured():  # read live, claim at start, write status back through the outbox
        sync = TrackerSync(uow, clock, trackers)
        effects: list[SessionEffects] = [workspaces, TrackerClaim(uow, sync)]
        scout.use_sync(sync)
        if tracker_service is not None:
            tracker_service.use_sync(sync)
        if trackers.written_back():
            sessions.owe_write_backs(trackers.written_back())
            effects.append(TrackerWriteBack(WritebackService(uow, clock, trackers)))
        sessions.use_effects(CompositeEffects(effects))
    return workspaces, scout


def build_agents(
    sessions: SessionService,
    uow: UnitOfWorkFactory,
    *,
    access: AccessService,
    clock: Clock,
    ids: IdGenerator,
    types: Mapping[str, AgentType],
    options: ExecutionOptions,
    outputs_root: str,
    runner: AgentRunner | None = None,
    outputs: OutputService | None = None,
) -> AgentService:
    """The agent supervisor, put before the engine's current effects (it stops agents on cancel and fail, and
    relaunches them on request_changes): a cancel stops the agents before its worktree is removed, so an agent
    is never left working in a folder that is being deleted under it (issue 36)."""
    agents = AgentService(uow, sessions, runner or SubprocessAgentRunner(), access, clock, ids, types, options,
                          outputs_root, outputs)  # fmt: skip
    sessions.use_effects(CompositeEffects([agents, sessions.effects]))
    access.on_agent_request(agents.progressed)  # an agent's tool call is progress for its stall watch
    return agents


def build_workflows(
    sessions: SessionService,
    uow: UnitOfWorkFactory,
    *,
    catalogue: Callable[[], Catalogue],
    clock: Clock,
    agents: AgentService | None,
    decisions: DecisionService | None = None,
    options: WorkflowOptions | None = None,
    review_queue: ReviewQueue | None = None,
    outputs: OutputService | None = None,
    workspaces: WorkspaceService | None = None,
) -> WorkflowEngine:
    """The workflow engine, added after the engine's current effects (it drives a session entering
    executing); agents of workflow sessions report to it, and decisions answer its approval steps."""
    engine = WorkflowEngine(uow, sessions, catalogue, clock, options, launcher=agents, files=ProjectFileReader())
    if outputs is not None:
        engine.use_outputs(outputs)
    sessions.use_effects(CompositeEffects([sessions.effects, engine]))
    if agents is not None:
        agents.on_workflow_agents_ended(engine.agents_ended)
    if decisions is not None:
        decisions.use_workflows(engine)
        engine.use_decisions(decisions)  # a workflow's last approval is the verification decision
    if review_queue is not None:
        review_queue.use_workflows(engine)
    if workspaces is not None:
        engine.use_workspaces(workspaces)
    return engine


def workflow_options(settings: Settings) -> WorkflowOptions:
    """The `[workflows]` settings as the engine's options."""
    cfg = settings.workflows
    return WorkflowOptions(cfg.default, LoopLimits(cfg.max_iterations, cfg.loop_window, cfg.loop_repeats))


def agent_types(settings: Settings) -> dict[str, AgentType]:
    """The built-in presets, then the `[agents.NAME]` settings over them: a table naming a `preset` (or named like
    one) starts from it and changes the keys it sets. Raises: InvalidInput naming a bad placeholder or value."""
    types = {name: preset.agent_type() for name, preset in PRESETS.items()}
    for name, table in settings.agents.items():
        base = PRESETS[table.preset or name].agent_type() if (table.preset or name) in PRESETS else None
        changes = table.changes()
        for key in ("command", "credentials", "stall_patterns", "quota_patterns", "ignored", "read", "resume"):
            if key in changes:
                changes[key] = tuple(changes[key])
        if isinstance(changes.get("network"), list):
            changes["network"] = tuple(changes["network"])
        if base is None:
            types[name] = AgentType(name, **changes)
        else:  # `env` adds to the preset's variables (set one to "" to blank it); every other key replaces
            if "env" in changes:
                changes["env"] = {**base.env, **changes["env"]}
            types[name] = dataclasses.replace(base, name=name, **changes)
    return types


def sandboxes(settings: Settings) -> BwrapSandboxes:
    """`[sandbox]` as the agents' Sandboxes (probed at the first agent's start, not here)."""
    cfg = settings.sandbox
    limits = Limits(cfg.pids, cfg.memory_mb * 1024 * 1024 if cfg.memory_mb else None)
    return BwrapSandboxes(cfg.mode, str(settings.data_dir), str(settings.data_dir / "agent-outputs"), read=cfg.read,
                          hide=cfg.hide, write=cfg.write, limits=limits)  # fmt: skip


def node_service(settings: Settings, uow: UnitOfWorkFactory, clock: Clock) -> NodeService:
    """This process's node (docs/nodes.md): its id from `[node]` or the host and data dir."""
    identity = NodeIdentity(settings.resolved_node_id, socket.gethostname(), str(settings.data_dir.resolve()),
                            os.getpid(), __version__)  # fmt: skip
    return NodeService(uow, clock, identity, settings.node.heartbeat_s, settings.node.lease_s)


def execution_options(settings: Settings) -> ExecutionOptions:
    cfg = settings.execution
    config_dir = str(settings.config_file.parent) if settings.config_file else str(Path.cwd() / "config")
    return ExecutionOptions(
        tuple(cfg.default_agents), cfg.max_agents_per_session, cfg.max_agents_total, cfg.on_agent_failure,
        cfg.heartbeat_interval_s, f"http://{settings.mcp.host}:{settings.mcp.port}/mcp", config_dir=config_dir,
        catalogue_dir=str(BUILTIN_CATALOGUE), node_id=settings.resolved_node_id, stop_grace_s=cfg.stop_grace_s,
    )  # fmt: skip


def config_dir(settings: Settings) -> Path:
    """The folder of the loaded config file (`.taskgate/` after `taskgate init`), else ./config: the project's own
    workflows, checklists and agents live there, over the built-in catalogue."""
    return settings.config_file.parent if settings.config_file else Path.cwd() / "config"


def workflow_catalogue(settings: Settings) -> WorkflowService:
    """The built-in workflows and checklists under the project's own (config dir); `agent`/`agents[]` names are
    checked against the agent types (presets and `[agents.NAME]`), and a step's prompt must reach its agent
    (`{prompt}` in the command). No database is opened. Raises: InvalidInput for a bad agent type."""
    takes_prompt = {name: kind.takes_prompt for name, kind in agent_types(settings).items()}
    return WorkflowService(LayeredCatalogue(config_dir(settings)), takes_prompt)


def tracker_provider(settings: Settings) -> TrackerProvider | None:
    """The external tracker configured in `[tracker]` (built now), or None for the built-in one. Raises:
    TrackerError (a token variable that is not set)."""
    spec = tracker_spec(settings.tracker, settings)
    return spec.build() if spec is not None else None


def trackers(settings: Settings) -> Trackers:
    """Each project's tracker: `[tracker]`, or `[projects.<name>.tracker]` for that project; built when first used."""
    projects = {name: tracker_spec(p.tracker, settings) for name, p in settings.projects.items() if p.tracker}
    return Trackers(tracker_spec(settings.tracker, settings), projects)


def tracker_spec(cfg: TrackerSettings, settings: Settings) -> TrackerSpec | None:
    """One `[tracker]` table as a spec whose provider is built on first use; None for the built-in tracker."""
    if cfg.kind == "beads":
        bd = cfg.beads
        return TrackerSpec(
            "beads", bd.write_back, lambda: BeadsTracker(bd.command, bd.timeout_s, bd.write_back, bd.status_map)
        )
    if cfg.kind in ("github", "linear"):
        from taskgate.infrastructure.trackers.http import http_tracker  # githubkit and httpx load only when used

        write_back = cfg.github.write_back if cfg.kind == "github" else cfg.linear.write_back
        return TrackerSpec(cfg.kind, write_back, lambda: http_tracker(cfg, settings.forge))
    return None


def policy_book(settings: Settings, git: GitOptions | None = None) -> PolicyBook:
    """The `[policies.*]` and `[projects.*]` settings as the policy book; branch_naming defaults to the shape of
    the configured branch pattern. Raises: InvalidInput naming an unknown policy or setting, or a bad value."""
    projects = {
        name: ProjectPolicies(tuple(p.test_command), p.test_timeout_s, p.policies.tables())
        for name, p in settings.projects.items()
    }
    git = git or git_options(settings)
    budgets = settings.budget_book()
    extra = [BudgetCap(budgets, presets_of(settings))] if budgets.set else []
    return PolicyBook(settings.policies.tables(), projects, branch_pattern=git.branch_regex().pattern, extra=extra)


def presets_of(settings: Settings) -> dict[str, str]:
    """Each configured agent type's preset: the one its `[agents.NAME]` table names, the preset of that name, else
    `custom` (a command of its own). Agent types not configured count as themselves."""
    found = {}
    for name, table in settings.agents.items():
        if table.preset:
            found[name] = table.preset
        else:
            found[name] = name if name in PRESETS and table.command is None else "custom"
    return found


def hook_book(settings: Settings) -> HookBook:
    """The `[hooks]` table, and each `[projects.<name>.hooks]` in its place for that project. Raises: InvalidInput."""
    projects = {name: Hooks(**p.hooks.model_dump()) for name, p in settings.projects.items() if p.hooks is not None}
    return HookBook(Hooks(**settings.hooks.model_dump()), projects)


def git_options(settings: Settings) -> GitOptions:
    """The `[git]` settings as the application's options. Raises: InvalidInput for a bad pattern or folder."""
    options = settings.git.model_dump()
    if options["worktrees_dir"].startswith("~"):  # an absolute folder of the user's, outside the project
        options["worktrees_dir"] = str(Path(options["worktrees_dir"]).expanduser())
    return GitOptions(**options)


def configured_tokens(settings: Settings) -> list[ApiToken]:
    """The `[[mcp.tokens]]` of the config as tokens (hashes only)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [
        ApiToken(
            id=f"cfg-{t.sha256[:8]}",
            token_hash=t.sha256,
            kind="operator" if t.operator else "agent",
            created_at=epoch,
            operator_id=t.operator,
            session_id=t.session,
            label=t.label or "from config",
        )
        for t in settings.mcp.tokens
    ]


async def bootstrap(
    settings: Settings, *, clock: Clock | None = None, ids: IdGenerator | None = None, migrate: bool = True
) -> App:
    """Open the configured database, run the migrations, and build the services.

    Raises: InvalidInput for an unsupported URL; StorageError when the database cannot be reached or migrated.
    """
    # Imported here, not at the top: commands that open no database (`workflow validate`, `agents list`) build
    # their part of taskgate from this module without loading SQLAlchemy (docs/decisions.md, fast CLI start-up).
    from taskgate.infrastructure.db import migrations
    from taskgate.infrastructure.db.engine import Database
    from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork

    policies = policy_book(settings)  # a configuration error fails the start before the database is touched
    hooks = hook_book(settings)
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = Database(url, busy_timeout_ms=settings.sqlite.busy_timeout_ms, synchronous=settings.sqlite.synchronous)
    try:
        if migrate:
            await migrations.upgrade(database)
    except Exception:
        await database.dispose()
        raise

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    clock, vcs = clock or SystemClock(), GitPythonVcs()
    services = build_services(
        uow,
        clock=clock,
        ids=ids or UuidGenerator(),
        vcs=vcs,
        policies=policies,
        configured_tokens=configured_tokens(settings),
    )
    services[0].on_node(settings.resolved_node_id)  # it holds the sessions it creates (docs/nodes.md)
    project_trackers = trackers(settings)
    extras = build_workspaces(
        services[0],
        uow,
        clock=clock,
        vcs=vcs,
        git=git_options(settings),
        context_ttl_seconds=settings.context.ttl_seconds,
        tracker=project_trackers,
        tracker_service=services[1],
    )
    folders = session_folders(settings)
    extras[0].use_hooks(WorktreeHooks(uow, clock, LocalWorktreeSetup(), hooks, folders, services[0]))
    people = OperatorService(uow, clock), DecisionService(uow, services[0], clock)
    queue = ReviewQueue(uow, services[0], extras[0])
    outputs = OutputService(uow, folders, clock)
    outputs.on_node(settings.resolved_node_id)
    agents = build_agents(
        services[0], uow, access=services[3], clock=clock, ids=ids or UuidGenerator(), types=agent_types(settings),
        options=execution_options(settings), outputs_root=str(settings.data_dir / "agent-outputs"), outputs=outputs,
    )  # fmt: skip
    app = App(settings, *services, *extras, *people, queue, database=database, uow=uow, clock=clock)
    app.agents, app.outputs = agents, outputs
    if extras[0].hooks is not None:
        agents.use_hooks(extras[0].hooks)
    agents.use_sandboxes(sandboxes(settings))
    agents.use_budgets(settings.budget_book(), presets_of(settings))
    services[0].use_effects(CompositeEffects([services[0].effects, ManifestEffect(outputs)]))
    app.writebacks = WritebackService(uow, clock, project_trackers)
    app.workflows = build_workflows(
        services[0], uow, catalogue=workflow_catalogue(settings).catalogue, clock=clock, agents=agents,
        decisions=people[1], options=workflow_options(settings), review_queue=queue, outputs=outputs,
        workspaces=extras[0],
    )  # fmt: skip
    app.nodes = node_service(settings, uow, clock)
    app.adoption = SessionAdoption(uow, services[0], extras[0], app.nodes, clock, agents.process_alive)
    app.recovery = Recovery(services[0], extras[0], services[3], agents, app.workflows)
    app.ledger = audit_ledger(settings, uow, clock)
    app.questions = operator_questions(settings, uow, clock, services[0])
    build_forge(settings, app)
    return app


def operator_questions(settings: Settings, uow: Any, clock: Clock, sessions: SessionService) -> OperatorQuestions:
    """Agents' questions to the operator under `[questions]`; a time-out with `on_timeout = "fail"` fails the
    session for manual review (its agents stopped, its worktree and branch kept: cancel would delete the branch)."""
    q = settings.questions
    questions = OperatorQuestions(uow, clock, QuestionOptions(q.timeout_s, q.on_timeout, q.poll_s))

    async def fail(question: Question) -> None:
        reason = (f"question {question.id} unanswered for {q.timeout_s:.0f} s ([questions] on_timeout = fail): "
                  "stopped, its work kept for review")  # fmt: skip
        cmd = FireTrigger(question.session_id, Trigger.FAIL.value, "policy:questions", reason,
                          changes={"compensation_plan": Compensation.MANUAL_REVIEW.value})  # fmt: skip
        with contextlib.suppress(InvalidTransition, ConcurrentModification):  # it moved on meanwhile: nothing to stop
            await sessions.fire(cmd)

    questions.when_timeout_fails(fail)
    return questions


def build_forge(settings: Settings, app: App) -> None:
    """The forge loop when any project has a `[forge]` (docs/forge.md): pushes and pull requests as effects after
    the others, the merge asked of the forge first, the follower and its webhook deliveries. Nothing otherwise:
    a project without a forge merges locally, as before."""
    from taskgate.infrastructure.forge.directory import SettingsForges  # githubkit loads only with a forge

    forges = SettingsForges(settings)
    if not forges.configured():
        return
    assert app.uow is not None and app.clock is not None
    publisher = ForgePublisher(app.uow, app.sessions, forges, app.clock)
    app.sessions.use_effects(CompositeEffects([app.sessions.effects, publisher]))
    app.workspaces.use_remote_merge(publisher.merge_through)
    app.forges = forges
    app.forge = ForgeFollower(app.uow, app.sessions, publisher, forges, app.clock, app.nodes)
    app.forge_deliveries = ForgeDeliveries(app.uow, forges, app.forge, app.clock)


def audit_ledger(settings: Settings, uow: Any, clock: Clock) -> AuditLedger:
    """The ledger over this database, with the configured key files (read only when first needed)."""
    from taskgate.infrastructure.audit.keyring import FileKeyRing  # `cryptography` loads only once a key is used

    return AuditLedger(uow, clock, FileKeyRing(settings.resolved_audit_key))


def redact(url: str) -> str:
    """The database URL with its password hidden, for messages and `taskgate info`."""
    from taskgate.infrastructure.db.engine import redact as redacted

    return redacted(url)


def session_folders(settings: Settings) -> SessionFolderStore:
    """The session folders under `<data_dir>/agent-outputs`, with the `[outputs]` limits."""
    return SessionFolderStore(settings.data_dir / "agent-outputs", OutputLimits(**settings.outputs.model_dump()))


async def database_report(app: App) -> dict[str, object]:
    """What `taskgate info` shows about the database: redacted URL, dialect, schema revision against head."""
    from taskgate.infrastructure.db import migrations

    assert app.database is not None and app.settings is not None
    return {
        "database_url": redact(app.database.url),
        "dialect": app.database.dialect,
        "schema_revision": await migrations.current_revision(app.database),
        "head_revision": migrations.head_revision(),
    }


def sweeper_options(settings: Settings) -> SweeperOptions:
    """The `[sweeper]` settings as the application's options."""
    cfg = settings.sweeper
    return SweeperOptions(
        session_deadline=timedelta(hours=cfg.session_deadline_hours),
        verification_escalation=timedelta(hours=cfg.verification_escalation_hours),
        verification_timeout=timedelta(days=cfg.verification_timeout_days),
        heartbeat_timeout=timedelta(minutes=cfg.heartbeat_timeout_minutes),
        interval_s=cfg.interval_s,
    )


def build_sweeper(settings: Settings, app: App, *, serving: bool = True) -> Sweeper:
    """The sweeper over the app's database, session engine and clock (run it with `Sweeper.run`); it dispatches
    too when `[dispatch] auto_start` is on."""
    assert app.uow is not None and app.clock is not None, "the app was not built by bootstrap()"
    ledger, interval = app.ledger, settings.audit.checkpoint_interval_s
    checkpoints = (lambda: ledger.checkpoint_if_due(interval)) if ledger is not None else None
    return Sweeper(app.uow, app.sessions, app.clock, sweeper_options(settings), writebacks=app.writebacks,
                   tracker=app.tracker, dispatcher=build_dispatcher(settings, app, serving=serving),
                   poller=build_poller(settings, app),
                   nodes=app.nodes, checkpoints=checkpoints,
                   expire_questions=app.questions.expire_due if app.questions is not None else None)  # fmt: skip


def build_poller(settings: Settings, app: App) -> TrackerPoller | None:
    """The tracker poller (application/trackers/polling.py) when any project reads an external tracker."""
    assert app.uow is not None and app.clock is not None
    sync = app.tracker.sync
    if sync is None:
        return None
    by_project = {name: p.tracker.on_issue_gone for name, p in settings.projects.items() if p.tracker}
    return TrackerPoller(app.uow, app.clock, app.sessions, sync, settings.tracker.on_issue_gone, by_project)


def dispatch_options(settings: Settings, *, serving: bool = True) -> DispatchOptions | None:
    """The `[dispatch]` settings as the application's options; None when `auto_start` is off. `serving`: the
    process stays to supervise the agents dispatch launches (`serve`, not `taskgate sweep`)."""
    cfg = settings.dispatch
    if not cfg.auto_start:
        return None
    caps = DispatchCaps(cfg.max_running, dict(cfg.max_running_per_label), dict(cfg.max_running_per_agent),
                        cfg.max_awaiting_decision, cfg.max_retries, cfg.retry_base_s)  # fmt: skip
    operator = cfg.operator or settings.operator.default
    return DispatchOptions(operator, tuple(cfg.projects), caps, cfg.dry_run, execute=cfg.execute and serving)


def dispatch_report(settings: Settings) -> tuple[str, list[str]]:
    """Whether dispatch is on, as one line (`serve` says it at start, `doctor` checks it), and what stands in its
    way: no trigger that starts sessions, contested triggers, the sweeper off. Reads the catalogue, not the
    database."""
    options = dispatch_options(settings)
    if options is None:
        return "off: nothing starts sessions by itself ([dispatch] auto_start = true turns it on)", []
    try:
        routes = workflow_catalogue(settings).trigger_routes()
    except TaskgateError as exc:
        return f"on, but the catalogue cannot be read: {exc}", [str(exc)]
    taken = ", ".join(f"{trigger} → {workflow}" for trigger, workflow in routes.workflows.items())
    where = ", ".join(options.projects) or "every project"
    line = f"on: ready tasks of {where} start sessions as operator {options.operator_id}; {taken or 'no triggers'}"
    problems = []
    if not routes.workflows:
        problems.append("no workflow has a task_ready or label: trigger, so nothing is started")
    for trigger, names in routes.contested.items():
        problems.append(f"trigger {trigger} is declared by {', '.join(names)}: its tasks are left alone")
    if not settings.sweeper.enabled:
        problems.append("[sweeper] enabled = false: serve never dispatches (taskgate sweep does)")
    return line, problems


def build_dispatcher(settings: Settings, app: App, *, serving: bool = True) -> Dispatcher | None:
    """The dispatcher (application/trackers/dispatch.py) when `[dispatch] auto_start` is on, else None."""
    options = dispatch_options(settings, serving=serving)
    if options is None:
        return None
    assert app.uow is not None and app.clock is not None and app.workflows is not None
    routes = workflow_catalogue(settings).trigger_routes
    return Dispatcher(app.uow, app.sessions, app.tracker, app.workflows, routes, app.clock, options)


def notify_channels(settings: Settings) -> list[Channel]:
    """The channels of `[notify]` and each `[projects.<name>.notify]` (docs/notifications.md)."""
    from taskgate.infrastructure.apprise_notify import masked

    cfg = settings.notify
    projects = {name: p.notify for name, p in settings.projects.items() if p.notify is not None}
    opted_out = frozenset(name for name, own in projects.items() if not own.inherit)
    found = [Channel(url.get_secret_value(), "", frozenset(cfg.on), None, opted_out) for url in cfg.channels]
    for name, own in projects.items():
        kinds = frozenset(own.on if own.on is not None else cfg.on)
        found += [Channel(url.get_secret_value(), "", kinds, name) for url in own.channels]
    return [dataclasses.replace(c, shown=masked(c.url)) for c in found]


def build_notifier(settings: Settings, app: App) -> Notifier | None:
    """The notifier of `[notify]` over the app's database, under the `notify` lease when the app has nodes; None
    when no channel is configured."""
    from taskgate.infrastructure.apprise_notify import AppriseSender

    channels = notify_channels(settings)
    if not channels:
        return None
    assert app.uow is not None and app.clock is not None
    cfg = settings.notify
    options = NotifyOptions(
        console_url=cfg.console_url or f"http://{settings.mcp.host}:{settings.mcp.port}",
        batch_s=cfg.batch_s,
        interval_s=cfg.interval_s,
        ci_failures=cfg.ci_failures,
        include_details=cfg.include_details,
        max_attempts=cfg.max_attempts,
        backoff_base_s=cfg.backoff_base_s,
        backoff_max_s=cfg.backoff_max_s,
    )
    return Notifier(app.uow, app.clock, AppriseSender(cfg.timeout_s), channels, options, leases=app.nodes)


def build_outbox(settings: Settings, uow: UnitOfWorkFactory, clock: Clock) -> WebhookDispatcher | None:
    """The webhook dispatcher of the `[[webhooks]]` config over `uow`, or None when no webhook is configured.

    The subscribers named in `[escalation] webhooks` also receive `session.escalated`, whatever their `events`.

    Raises: InvalidInput when a `secret_env` variable is unset or two webhooks share a name.
    """
    if not settings.webhooks:
        return None
    told = set(settings.escalation.webhooks)
    subscribers = [
        Subscriber(
            name=hook.name,
            url=hook.url,
            secret=hook.resolved_secret(),
            events=(*hook.events, ESCALATED_EVENT) if hook.name in told else tuple(hook.events),
            timeout_s=hook.timeout_s,
            max_attempts=hook.max_attempts,
            backoff_base_s=hook.backoff_base_s,
            backoff_max_s=hook.backoff_max_s,
            backfill=hook.backfill,
        )
        for hook in settings.webhooks
    ]
    return WebhookDispatcher(uow, clock, HttpWebhookSender(), subscribers)
