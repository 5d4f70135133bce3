"""The sandbox's plan as data (domain/sandbox.py), its bwrap command line, and the codex command inside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from taskgate.domain.agents.setups import inside_sandbox
from taskgate.domain.errors import InvalidInput
from taskgate.domain.sandbox import Mount, SessionPaths, network_of, plan, refusals_in_log
from taskgate.infrastructure.sandbox import bwrap

PATHS = SessionPaths(
    project_root="/src/shop", objects_dir="/src/shop/.git/objects", worktree="/src/shop/.worktrees/s1",
    git_dir="/data/sandbox/s1/git", dot_git="/data/sandbox/s1/dot-git", session_folder="/data/agent-outputs/s1",
    private_root="/data/sandbox/s1", data_dir="/data", operator_home="/home/alice", hooks_dir="/src/shop/.git/hooks",
)  # fmt: skip


def index(mounts: tuple[Mount, ...], how: str, path: str) -> int:
    return next(i for i, m in enumerate(mounts) if m.how == how and m.path == path)


def test_the_order_is_the_policy_hidden_then_shown_then_writable_then_the_read_only_carve_outs():
    p = plan(PATHS, "a1", toolchain=["/home/alice/.pyenv/versions/3.11", "/usr/bin"], network="none")
    m = p.mounts
    assert index(m, "hide", "/src/shop") < index(m, "ro", "/src/shop/.git/objects") < index(m, "rw", PATHS.worktree)
    assert index(m, "hide", "/home") < index(m, "ro", "/home/alice/.pyenv/versions/3.11")  # /home covers ~alice
    assert index(m, "rw", PATHS.git_dir) < index(m, "ro", f"{PATHS.git_dir}/config")
    assert index(m, "rw", PATHS.worktree) < index(m, "ro", f"{PATHS.worktree}/.git")
    assert m[index(m, "ro", f"{PATHS.worktree}/.git")].source == PATHS.dot_git
    # /usr/bin is visible already (read-only root): it is not bound again
    assert not [x for x in m if x.path == "/usr/bin"]
    assert {x.path for x in m if x.how == "tmpfs"} == {"/tmp", "/var/tmp"}
    assert {x.path for x in m if x.how == "null"} >= {"/etc/shadow"}
    assert p.home == "/data/sandbox/s1/home" and p.tmp == "/data/sandbox/s1/a1/tmp"


def test_credentials_under_a_shown_prefix_are_hidden_again():
    p = plan(PATHS, "a1", toolchain=["/home/alice/.config/tool/bin"], read=["/home/alice/.config"])
    m = p.mounts
    assert index(m, "ro", "/home/alice/.config") < index(m, "hide", "/home/alice/.config/gh")
    assert not [x for x in m if x.path == "/home/alice/.ssh" and x.how != "hide"]


def test_the_network_is_the_mcp_endpoint_the_model_endpoint_and_the_entries_in_that_order():
    assert network_of(None, ["http://127.0.0.1:9000/v1"], "http://127.0.0.1:8765/mcp") == (
        "127.0.0.1:8765", "127.0.0.1:9000")  # fmt: skip
    assert network_of(("pypi.org:443",), ["api.openai.com:443"], "") == ("api.openai.com:443", "pypi.org:443")
    assert network_of(None, ["https://api.anthropic.com"], "") == ("api.anthropic.com:443",)
    assert network_of("open", [], "http://x:1") == "open" and network_of("none", [], "") == "none"
    assert plan(PATHS, "a", network=("127.0.0.1:8765", "x.org:443")).forward_ports == (8765,)


@pytest.mark.parametrize("bad", ["pypi.org", "pypi.org:0", "pypi.org:99999", ":443", "pypi.org:https"])
def test_a_bad_network_entry_is_refused_naming_it(bad):
    with pytest.raises(InvalidInput, match=re.escape(repr(bad))):
        network_of((bad,), [], "")
    with pytest.raises(InvalidInput, match="unknown 'closed'"):
        network_of("closed", [], "")


def test_refused_writes_are_read_from_the_log_once_per_line():
    log = "ok\ncp: cannot create 'x': Read-only file system\ncp: cannot create 'x': Read-only file system\nfine\n"
    assert refusals_in_log(log) == [
        {"what": "write", "target": "cp: cannot create 'x': Read-only file system", "source": "log"}]  # fmt: skip
    assert refusals_in_log("all good\n") == []
    ended = "[taskgate sandbox] the agent hit its pids limit: fork refused 97 times: ending it\n"
    assert refusals_in_log(ended) == [
        {"what": "limit", "target": "pids limit: fork refused 97 times: ending it", "source": "cgroup"}]  # fmt: skip
    git = "fatal: not a git repository: '/src/shop/.git'\n"
    assert refusals_in_log(git)[0]["what"] == "git"


def test_codex_runs_with_its_own_sandbox_off_inside_ours():
    command = ["codex", "exec", "--json", "--sandbox", "workspace-write", "--add-dir", "/g", "--add-dir", "/g/w", "hi"]
    assert inside_sandbox("codex", command) == ["codex", "exec", "--json", "--sandbox", "danger-full-access", "hi"]
    assert inside_sandbox("none", command) == command


def test_bwrap_argv_resolves_links_skips_absent_paths_and_makes_hidden_folders_read_only(tmp_path: Path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    p = plan(PATHS, "a1", network="none")
    mounts = (Mount("hide", str(tmp_path / "link")), Mount("rw", str(tmp_path / "absent")), *p.mounts[:0])
    args = bwrap.argv(type(p)(mounts, "/", "/h", "/t", "none"), ["true"])
    assert args[args.index("--tmpfs", 7) + 1] == str(real)  # the link's target, not the link
    assert str(tmp_path / "absent") not in args
    assert args[args.index("--remount-ro") + 1] == str(real)
    assert "--unshare-net" in args and args[-2:] == ["--", "true"]
    open_plan = type(p)((), "/", "/h", "/t", "open")
    assert "--unshare-net" not in bwrap.argv(open_plan, ["true"])


async def test_a_required_sandbox_the_host_cannot_give_refuses_the_start_naming_why():
    from datetime import UTC, datetime

    from taskgate.domain.agents.kinds import AgentType
    from taskgate.domain.entities import Session
    from taskgate.domain.states import SessionState
    from taskgate.infrastructure.sandbox.sessions import BwrapSandboxes

    missing = bwrap.Support(False, "", "bubblewrap is not installed: apt-get install bubblewrap")
    now = datetime.now(UTC)
    session = Session("s1", "T-1", 1, None, None, SessionState.EXECUTING, 1, now, now, branch_name="b",
                      worktree_path="/nowhere")  # fmt: skip
    kind = AgentType("x", ("true",))
    required = BwrapSandboxes("bwrap", "/data", "/data/out", support=missing)
    assert required.state() == ("unavailable", missing.detail)
    with pytest.raises(InvalidInput, match='required \\(\\[sandbox\\] mode = "bwrap"\\) but unavailable: bubblewrap'):
        await required.prepare(session, "a1", kind, ["true"], {}, "")
    automatic = BwrapSandboxes("auto", "/data", "/data/out", support=missing)
    assert automatic.state() == ("off", missing.detail)
    assert await automatic.prepare(session, "a1", kind, ["true"], {}, "") is None
