"""The top-level commands and groups of `taskgate`, as data: name, one-line help, and the modules that define them.

It is read on every start, so it imports nothing but the standard library. The Typer app takes each top-level
command's and group's one-line help from here (`common.command`, `common.group`); `main()` uses it to print the
top-level help without loading Typer (`help_page.py`) and to load only the module(s) that define the command on
the command line. `tests/unit/test_cli_startup.py` checks that the Typer app registers exactly these, in this
order, with this help, each from the modules named here.
"""

from __future__ import annotations

PROGRAM_HELP = "taskgate: run AI coding agents in guarded, audited sessions."
"""The program's description, under the usage line of `taskgate --help`."""

HELP_OPTIONS = ("-h", "--help")
"""The options that print a command's help (every command and group inherits them)."""


class RootOption:
    """An option of `taskgate` itself (before the command), taking one value. (Plain classes here, not
    dataclasses: `dataclasses` alone takes longer to import than this whole page needs.)"""

    __slots__ = ("flag", "help", "metavar")

    def __init__(self, flag: str, metavar: str, help: str) -> None:
        self.flag, self.metavar, self.help = flag, metavar, help


ROOT_OPTIONS = (RootOption("--config", "<path>", "Config file (else $TASKGATE_CONFIG, else ./config/taskgate.toml)."),)


class Command:
    """A top-level command or group: its name, its one-line help in `taskgate --help`, and the modules (under
    `taskgate.entrypoints.cli`) whose import registers it and, for a group, every one of its sub-commands."""

    __slots__ = ("modules", "name", "summary")

    def __init__(self, name: str, summary: str, modules: tuple[str, ...]) -> None:
        self.name, self.summary, self.modules = name, summary, modules


COMMANDS = (
    Command("fsm", "The session state machine, generated from the transition table.", ("audit",)),
    Command("doctor", "Check this set-up: git, config, database, project, agent CLIs and credentials.", ("doctor",)),
    Command("version", "Print taskgate's version.", ("projects",)),
    Command("demo", "Run the guided demo on a scratch git repository and a fresh SQLite database.", ("service",)),
    Command("serve", "Run the MCP server: over stdio as the local operator, or over HTTP with tokens.", ("service",)),
    Command("console", "Serve the operator console (and MCP beside it); print a one-time sign-in link.", ("service",)),
    Command("context", "The project's git and tracker context (what context_discover returns).", ("service",)),
    Command("nodes", "The service processes sharing this database, and whether each is up.", ("service",)),
    Command("sweep", "Run the sweeper once: timeouts, escalations, abandoned sessions, dispatch.", ("service",)),
    Command("init", "Set a git repository up for taskgate in one step (.taskgate/, project, operator).", ("setup",)),
    Command("info", "Say where everything is: config file, data directory, database, session folders.", ("setup",)),
    Command("operator", "Operators, their roles and permissions (admins only).", ("access",)),
    Command("policies", "Policies that guard transitions: list them, dry-run them.", ("access",)),
    Command("worktrees", "Session worktrees on disk: list them, reconcile them with the sessions.", ("service",)),
    Command("token", "Bearer tokens for the MCP HTTP transport.", ("access",)),
    Command("project", "Registered projects.", ("projects",)),
    Command("plan", "Plans (phases) of a project.", ("projects",)),
    Command("task", "Tasks of the built-in tracker.", ("projects",)),
    Command("session", "Sessions: one guarded state machine per task.", ("sessions", "logs", "stopping", "questions")),
    Command("audit", "The audit log: query it, verify its proofs, export, checkpoint, prune.",
            ("audit", "audit_proofs", "audit_upkeep")),
    Command("agents", "Agent types: built-in presets and [agents.NAME] entries.", ("agents",)),
    Command("usage", "Tokens and cost agents reported, summed by task, agent type and preset.", ("usage",)),
    Command("webhooks", "Webhook deliveries of the events log (see docs/events.md).", ("service",)),
    Command("notify", "Notifications to the operator's channels: status, test (see docs/notifications.md).",
            ("notify",)),
    Command("tracker", "Write-backs to the external tracker (Beads): see, retry, dismiss.", ("tracker",)),
    Command("workflow", "Workflows: list, validate, graph, create; run them on sessions, edit stacks.", ("workflows",)),
    Command("checklist", "Checklists: list, show; push them onto sessions, tick items.", ("workflows",)),
)  # fmt: skip

ALL_MODULES = tuple(dict.fromkeys(module for command in COMMANDS for module in command.modules))
"""Every module that defines commands (the full Typer app lists them in `COMMANDS`' order whatever the import
order: `common.ListedGroup`)."""


def summary(name: str) -> str:
    """The one-line help of the top-level command or group `name`. Raises: KeyError for a name not listed."""
    for command in COMMANDS:
        if command.name == name:
            return command.summary
    raise KeyError(name)


def command_in(argv: list[str]) -> tuple[str | None, list[str]]:
    """The first word of `argv` after the root options (`--config PATH`), and what follows it; `(None, [])` when
        there is none. An option that is not a root option is returned as the word (`--help`, or a typo), and so is a
    root option without its value."""
    flags = {option.flag for option in ROOT_OPTIONS}
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in flags and index + 1 < len(argv):
            index += 2  # the flag and its value
        elif word.partition("=")[1] and word.partition("=")[0] in flags:  # --config=PATH
            index += 1
        else:
            return word, argv[index + 1 :]
    return None, []


def root_option(argv: list[str], flag: str) -> str | None:
    """The value given to the root option `flag` before the command (`--config PATH` or `--config=PATH`; the last
    one wins), or None."""
    value, index = None, 0
    while index < len(argv):
        word = argv[index]
        if word == flag and index + 1 < len(argv):
            value, index = argv[index + 1], index + 2
        elif word.startswith(flag + "="):
            value, index = word.partition("=")[2], index + 1
        elif word in {option.flag for option in ROOT_OPTIONS} and index + 1 < len(argv):
            index += 2
        else:
            return value
    return value


def modules_for(name: str | None) -> tuple[str, ...]:
    """The modules to load for the top-level word `name`: its own, or all of them for anything else (no command,
    an unknown name: the full Typer app then says what is wrong, with the whole list)."""
    for command in COMMANDS:
        if command.name == name:
            return command.modules
    return ALL_MODULES
