"""The git reads a decision makes, on real repositories: fewer processes, the same facts (issue 20).

`worktree_state` (the approve policies' facts) and `branch_change` (what an approval records) read less than
`workspace_context` and check a session worktree with one `rev-parse` where the full check runs two processes.
Each test below shows one of them agreeing with the slower read it replaces, including the cases that read
differently: a rename (the patch detects it, the numstat does not), a binary file, a branch and base with two
merge bases, and worktrees the one-process check leaves to the full one (detached, mid-rebase, another branch).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from taskgate.application.workspaces.merges import change_id
from taskgate.domain.errors import WorktreeMismatch
from taskgate.infrastructure import git as git_module
from taskgate.infrastructure.git import GitPythonVcs
from tests.conftest import make_git_repo

BRANCH = "feature/t-1/aaaa0001"
IDENTITY = ("-c", "user.name=reads", "-c", "user.email=reads@example.invalid")


def git(cwd: Path | str, *args: str) -> str:
    return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit(cwd: Path, name: str, content: str | bytes, message: str) -> str:
    target = cwd / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    git(cwd, "add", "--", name)
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


@pytest.fixture
async def repo(tmp_path: Path) -> tuple[Path, Path]:
    """(project root, the session worktree of BRANCH), created by taskgate."""
    root = make_git_repo(tmp_path / "repo").resolve()
    worktree = root / ".worktrees" / "s1"
    await GitPythonVcs().create_worktree(str(root), str(worktree), BRANCH, "main")
    return root, worktree


def change_of(found) -> tuple:
    return (found.head_commit, found.diff_stat, found.patch, found.patch_truncated)


async def test_branch_change_agrees_on_a_rename_and_a_binary_file(repo: tuple[Path, Path]) -> None:
    root, worktree = repo
    (worktree / "docs").mkdir()
    git(worktree, "mv", "README.md", "docs/README.md")  # a file of base, renamed on the branch
    git(worktree, "commit", "-q", "-m", "docs: move the readme")
    commit(worktree, "logo.bin", bytes(range(256)), "a binary file")
    vcs = GitPythonVcs()
    full = await vcs.workspace_context(str(root), str(worktree), BRANCH, "main")
    change = await vcs.branch_change(str(root), str(worktree), BRANCH, "main")
    assert change_of(change) == change_of(full) and change_id(change) == change_id(full)
    assert "rename from README.md" in change.patch  # detected in the patch, not in the numstat:
    assert {"README.md", "docs/README.md"} <= {stat.path for stat in change.diff_stat}
    assert any(stat.added == -1 for stat in change.diff_stat)  # the binary file, as numstat reports it


async def test_branch_change_agrees_when_branch_and_base_have_two_merge_bases(repo: tuple[Path, Path]) -> None:
    """A criss-cross: `<base>...<head>` takes the first merge base, as `git merge-base` prints it."""
    root, worktree = repo
    on_main = commit(root, "main.txt", "main\n", "on main")
    on_branch = commit(worktree, "branch.txt", "branch\n", "on the branch")
    git(worktree, "merge", "-q", "--no-edit", on_main)
    commit(worktree, "more.txt", "more\n", "more on the branch")
    git(root, "merge", "-q", "--no-edit", on_branch)
    commit(root, "later.txt", "later\n", "later on main")
    assert len(git(root, "merge-base", "--all", "main", BRANCH).split()) == 2
    vcs = GitPythonVcs()
    full = await vcs.workspace_context(str(root), str(worktree), BRANCH, "main")
    change = await vcs.branch_change(str(root), str(worktree), BRANCH, "main")
    assert change_of(change) == change_of(full) and change_id(change) == change_id(full)


async def test_a_decisions_git_reads_run_three_processes_each(repo: tuple[Path, Path], monkeypatch) -> None:
    """worktree_state: the worktree check (one rev-parse), status, log; branch_change: the check and two diffs.
    `workspace_context` still runs its ten, with the full two-process check behind the one-process one."""
    root, worktree = repo
    commit(worktree, "feature.txt", "feature\n", "feat: the feature")
    run, ran = git_module._run, []
    monkeypatch.setattr(
        git_module, "_run", lambda cwd, args, env=git_module._ENV: ran.append(args[0]) or run(cwd, args, env)
    )
    vcs = GitPythonVcs()
    await vcs.worktree_state(str(root), str(worktree), BRANCH, "main")
    assert sorted(ran) == ["log", "rev-parse", "status"]
    ran.clear()
    await vcs.branch_change(str(root), str(worktree), BRANCH, "main")
    assert sorted(ran) == ["diff", "diff", "rev-parse"]


def full_check(root: Path, worktree: Path, branch: str | None, monkeypatch) -> object:
    """`_session_worktree` with the one-process check switched off: the result (or refusal) of the full one."""
    with monkeypatch.context() as patched:
        patched.setattr(git_module, "_linked_checkout_at_once", lambda *args: None)
        try:
            return git_module._session_worktree(str(root), str(worktree), branch)
        except WorktreeMismatch as exc:
            return str(exc)


@pytest.mark.parametrize("branch", [BRANCH, None], ids=["its-branch", "any-branch"])
async def test_the_one_process_check_accepts_what_the_full_check_accepts(repo, branch, monkeypatch) -> None:
    root, worktree = repo
    quick = git_module._linked_checkout_at_once(str(root), str(worktree), branch)
    assert quick is not None and quick == full_check(root, worktree, branch, monkeypatch)
    assert quick.path == str(worktree) and Path(quick.git_dir).parent == root / ".git" / "worktrees"


@pytest.mark.parametrize("case", ["detached", "rebasing", "other-branch", "emptied", "main-checkout"])
async def test_the_one_process_check_leaves_everything_else_to_the_full_check(repo, case, monkeypatch) -> None:
    """It answers only the usual case; the others get the full check's own answer (or its refusal)."""
    root, worktree = repo
    commit(worktree, "feature.txt", "feature\n", "feat: the feature")
    branch = BRANCH
    if case == "detached":
        git(worktree, "checkout", "-q", "--detach")
    elif case == "rebasing":  # a conflicting rebase stops half-way: HEAD is detached, the rebase names the branch
        commit(root, "feature.txt", "something else\n", "the same file on main")
        subprocess.run(["git", *IDENTITY, "rebase", "main"], cwd=worktree, capture_output=True, check=False)
        assert (Path(git(worktree, "rev-parse", "--absolute-git-dir")) / "rebase-merge").is_dir()
    elif case == "other-branch":
        git(worktree, "checkout", "-q", "-b", "feature/t-2/bbbb0002")
    elif case == "emptied":
        for child in worktree.iterdir():
            child.unlink() if child.is_file() else None
    else:
        worktree, branch = root, "main"
    assert git_module._linked_checkout_at_once(str(root), str(worktree), branch) is None
    expected = full_check(root, worktree, branch, monkeypatch)
    try:
        found: object = git_module._session_worktree(str(root), str(worktree), branch)
    except WorktreeMismatch as exc:
        found = str(exc)
    assert found == expected
    if case == "rebasing":  # accepted: reads read, merge refuses it before changing anything
        assert not isinstance(found, str)


async def test_the_branch_head_is_read_alike_from_a_loose_and_a_packed_ref(repo: tuple[Path, Path]) -> None:
    root, worktree = repo
    sha = commit(worktree, "feature.txt", "feature\n", "feat: the feature")
    vcs = GitPythonVcs()
    loose = await vcs.worktree_state(str(root), str(worktree), BRANCH, "main")
    git(root, "pack-refs", "--all")  # the loose ref file is gone: packed-refs holds the branch
    assert not (root / ".git" / "refs" / "heads" / BRANCH).exists()
    packed = await vcs.worktree_state(str(root), str(worktree), BRANCH, "main")
    change = await vcs.branch_change(str(root), str(worktree), BRANCH, "main")
    assert loose.head_commit == packed.head_commit == change.head_commit == sha
    assert loose == packed


async def test_an_fsmonitor_command_an_agent_configured_never_runs_in_taskgates_git_reads(repo, tmp_path) -> None:
    """An agent can write the repository's config today (issue 39's sandbox will take that away): a `core.fsmonitor`
    command there would run inside taskgate's own `git status` of the worktree. taskgate's git turns it off."""
    root, worktree = repo
    marker = tmp_path / "ran"
    commit(worktree, "api.py", "def api(): ...\n", "feat: api")
    (worktree / "api.py").write_text("def api(): return 1\n")  # dirty: status must look at the files
    git(worktree, "config", "core.fsmonitor", f"touch {marker}; false")  # the shared config, as an agent could
    vcs = GitPythonVcs()
    state = await vcs.worktree_state(str(root), str(worktree), BRANCH, "main")
    context = await vcs.workspace_context(str(root), str(worktree), BRANCH, "main")
    assert "api.py" in state.dirty and context.dirty
    assert not marker.exists()  # the agent's command never ran
    subprocess.run(["git", "status"], cwd=worktree, capture_output=True)  # the check can fail: plain git runs it
    assert marker.exists()
