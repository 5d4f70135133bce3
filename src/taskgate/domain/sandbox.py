"""What an agent's sandbox lets it see, write and reach: the plan, as data (issue 39; docs/agents.md).

The plan is an ordered list of mounts over a read-only view of the host (`/` bound read-only): first what is
hidden (an empty tmpfs over the operator's home, `/tmp`, the project, taskgate's data folder; `/dev/null` over
credential files), then what is shown again read-only (the toolchain the agent's command runs on, the project's
object store its private git dir borrows from), then what it may write (its worktree, its session folder, its
private git dir, home and temp), and last the read-only carve-outs inside those (the worktree's `.git` file, the
private git dir's config, hooks and alternates). Later mounts cover earlier ones, so the order is the policy.

Why a private git dir: a linked worktree commits into the project's shared `.git` (its object store and the
directory of its sibling branches), which a filesystem cannot open for one branch only (docs/design/sandbox.md
§2.1). The agent's git sees a git dir of its own that borrows the project's objects read-only (`alternates`);
taskgate brings its branch home after each run by a compare-and-swap. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from taskgate.domain.errors import InvalidInput

MODES = ("auto", "bwrap", "off")
NETWORK_CHOICES = ("none", "open")
# Files every host has that an agent never needs (root keeps uid 0 in the sandbox: owner-read needs no capability)
SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/ssh/ssh_host_rsa_key",
                "/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ed25519_key")  # fmt: skip
# Under the operator's home: hidden again when a shown toolchain prefix (`~/.local`, `~/.config/…`) holds them
CREDENTIALS = (".ssh", ".aws", ".gnupg", ".netrc", ".git-credentials", ".config/gh", ".config/gcloud", ".docker",
               ".kube", ".azure", ".npmrc", ".pypirc", ".local/share/keyrings", ".password-store")  # fmt: skip
SCRATCH = ("/tmp", "/var/tmp")  # hidden, and writable scratch space (a private tmpfs each): tools expect them
DEFAULT_HIDDEN = ("/root", "/home", "/run/user", "/var/lib/postgresql", "/var/lib/mysql")


@dataclass(frozen=True)
class Mount:
    """One bind of the plan. `how`: "ro" / "rw" (show `source` at `path`), "hide" (an empty read-only folder over
    `path`: a write there fails as it would outside), "tmpfs" (an empty writable scratch folder: `/tmp`), "null"
    (`/dev/null` over the file `path`)."""

    how: str
    path: str
    source: str = ""

    @property
    def origin(self) -> str:
        return self.source or self.path


@dataclass(frozen=True)
class Limits:
    """Per agent: processes (a fork bomb) and memory; None: no limit of that kind. Wall time is the agent type's
    `timeout_s`."""

    pids: int | None = 1024
    memory_bytes: int | None = 8 * 1024**3


@dataclass(frozen=True)
class SandboxPlan:
    """Everything the runner needs to confine one agent: the mounts in order, the folder it starts in, its private
    home and temp, its network (`none`, `open`, or the `host:port` entries it may reach, with the loopback ports
    that keep their URL inside), and its limits."""

    mounts: tuple[Mount, ...]
    chdir: str
    home: str
    tmp: str
    network: str | tuple[str, ...]
    forward_ports: tuple[int, ...] = ()
    limits: Limits = field(default_factory=Limits)
    run_dir: str = ""  # the agent's runtime folder on the host (short: a Unix socket's path has 108 bytes at most)
    refusals: str = ""  # where the host side records refused connections: never shown to the agent
    # connects to any other address are caught and recorded (root only: nftables in the sandbox's netns)
    catch_all: bool = False
    agent_id: str = ""  # names its cgroup: one per agent, never shared

    @property
    def network_label(self) -> str:
        return self.network if isinstance(self.network, str) else "allow-list: " + ", ".join(self.network)


@dataclass(frozen=True)
class SessionPaths:
    """The host paths a plan is made of, resolved by the caller (absolute, symlinks followed)."""

    project_root: str
    objects_dir: str  # the project's `.git/objects`: read-only, the private git dir's alternates
    worktree: str
    git_dir: str  # the session's private git dir (config, hooks and objects/info read-only inside)
    dot_git: str  # the file shown as `<worktree>/.git`: `gitdir: <git_dir>`
    session_folder: str
    private_root: str  # <data_dir>/sandbox/<session>/: home, tmp, run folders of its agents
    data_dir: str
    operator_home: str
    worktrees_root: str = ""  # when outside the project (git.worktrees_dir absolute): hidden as a whole
    hooks_dir: str = ""  # the project's git hooks, read-only, so its pre-commit still runs on the agent's commits


def plan(
    paths: SessionPaths,
    agent_id: str,
    *,
    toolchain: Iterable[str] = (),
    read: Iterable[str] = (),
    hide: Iterable[str] = (),
    write: Iterable[str] = (),
    network: str | tuple[str, ...] = "none",
    limits: Limits | None = None,
    run_dir: str = "",
) -> SandboxPlan:
    """The sandbox of agent `agent_id` of the session at `paths`: `toolchain` (its command's interpreters and
    install prefixes) and `read` (configured) shown read-only, `hide` (configured) hidden besides the defaults,
    `write` (configured: a shared cache, a build folder) writable;
    `run_dir`: its runtime folder (the network gate's socket), shown read-only."""
    private = f"{paths.private_root}/{agent_id}"
    home, tmp, run = f"{paths.private_root}/home", f"{private}/tmp", run_dir or f"{private}/run"
    hidden = [*DEFAULT_HIDDEN, paths.operator_home, paths.project_root, paths.data_dir, *hide]
    if paths.worktrees_root:
        hidden.append(paths.worktrees_root)
    # scratch first, then the hidden (read-only) folders, also those inside scratch (a project under /tmp)
    mounts = [Mount("tmpfs", path) for path in SCRATCH]
    mounts += [Mount("hide", path) for path in _outermost(p for p in hidden if p not in SCRATCH)]
    mounts += [Mount("null", path) for path in SECRET_FILES]
    # only what a hidden folder covers needs showing again (the rest of the root is visible, read-only, already)
    covered = [p for p in hidden if p not in SCRATCH] + list(SCRATCH)
    wanted = [*toolchain, *read]
    shown = [p for p in _outermost(wanted) if any(p == h or _inside(p, h) for h in covered)]
    mounts += [Mount("ro", path) for path in shown]
    # what a shown folder holds of the hidden (the home under a script's folder, a data dir under `~/.local`, keys
    # under `~/.config`) is hidden again, then what is wanted inside those is shown once more (never a credential)
    credentials = [f"{paths.operator_home}/{name}" for name in CREDENTIALS]
    again = _outermost(h for h in [*hidden, *credentials] if h not in SCRATCH and any(_inside(h, s) for s in shown))
    mounts += [Mount("hide", path) for path in again]
    inner = [p for p in _outermost(p for p in wanted if any(_inside(p, h) for h in again))
             if not any(p == c or _inside(p, c) or _inside(c, p) for c in credentials)]  # fmt: skip
    mounts += [Mount("ro", path) for path in inner]
    mounts += [Mount("ro", path) for path in (paths.objects_dir, paths.hooks_dir) if path]
    mounts += [Mount("rw", path) for path in (*_outermost(write), paths.worktree, paths.session_folder, paths.git_dir,
                                              home, tmp)]  # fmt: skip
    mounts += [Mount("ro", run), Mount("ro", f"{paths.worktree}/.git", paths.dot_git)]
    mounts += [Mount("ro", f"{paths.git_dir}/{part}") for part in ("config", "hooks", "objects/info")]
    return SandboxPlan(
        mounts=tuple(mounts), chdir=paths.worktree, home=home, tmp=tmp, network=network,
        forward_ports=tuple(_loopback_ports(network)), limits=limits or Limits(), run_dir=run,
        refusals=f"{private}/refusals.jsonl", agent_id=agent_id,
    )  # fmt: skip


def network_of(choice: str | Sequence[str] | None, endpoints: Iterable[str], mcp_url: str) -> str | tuple[str, ...]:
    """An agent type's network: `none` / `open` as chosen, else the allow-list: taskgate's MCP endpoint, the model
    endpoints (URLs or `host:port`), and the configured entries. Raises: InvalidInput naming a bad entry."""
    if isinstance(choice, str):
        if choice not in NETWORK_CHOICES:
            raise InvalidInput(f"sandbox network: unknown {choice!r}; use none, open or a list of host:port")
        return choice
    entries = [_host_port(mcp_url)] if mcp_url else []
    entries += [_host_port(value) for value in endpoints]
    entries += [_checked(entry) for entry in choice or ()]
    return tuple(dict.fromkeys(entries))


def _host_port(value: str) -> str:
    """`host:port` of a URL (its scheme's default port) or of a `host:port` entry."""
    if "://" not in value:
        return _checked(value)
    parts = urlsplit(value)
    if not parts.hostname:
        raise InvalidInput(f"sandbox network: {value!r} names no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _checked(entry: str) -> str:
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not (port == "*" or (port.isdigit() and 0 < int(port) < 65536)):
        raise InvalidInput(f"sandbox network: {entry!r} is not host:port (port 1-65535 or *)")
    return entry


def _loopback_ports(network: str | tuple[str, ...]) -> list[int]:
    """The allowed loopback ports: reached inside at the same `127.0.0.1:PORT` (the model server, taskgate's MCP
    endpoint), so no URL changes for the agent."""
    if isinstance(network, str):
        return []
    ports = []
    for entry in network:
        host, _, port = entry.rpartition(":")
        if host in ("127.0.0.1", "localhost") and port.isdigit():
            ports.append(int(port))
    return sorted(set(ports))


def _inside(path: str, folder: str) -> bool:
    return path != folder and path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths, without those inside another of them (one mount covers its subfolders), in a stable order."""
    unique = sorted({p.rstrip("/") or "/" for p in paths if p})
    kept: list[str] = []
    for path in unique:
        if not any(path == k or _inside(path, k) for k in kept):
            kept.append(path)
    return kept


# What a refused write looks like in a program's error output (the kernel refuses silently; the program says so),
# git finding the project's hidden git dir gone, and the wrapper's own line when a limit ended the agent
_REFUSED_WRITE = ("Read-only file system", "Device or resource busy")
_REFUSED_GIT = ("not a git repository: ", "does not appear to be a git repository")
_LIMIT_HIT = "[taskgate sandbox] the agent hit its "
MAX_REFUSALS = 50  # per agent on the audit log; more are counted in one last event


def refusals_in_log(text: str) -> list[dict[str, str]]:
    """What the sandbox refused, as far as the agent's log tells (best effort: a quiet agent leaves nothing to find;
    enforcement never depends on it): one record per distinct line naming a refused write, a git call that found
    the project's git dir hidden, or the limit that ended the agent."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        target = line.strip()[:300]
        if line.startswith(_LIMIT_HIT):
            found.setdefault(target, {"what": "limit", "target": line[len(_LIMIT_HIT) :].strip(), "source": "cgroup"})
        elif any(mark in line for mark in _REFUSED_WRITE):
            found.setdefault(target, {"what": "write", "target": target, "source": "log"})
        elif any(mark in line for mark in _REFUSED_GIT):
            found.setdefault(target, {"what": "git", "target": target, "source": "log"})
    return list(found.values())
