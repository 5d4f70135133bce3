"""Pushes of session branches to a real git remote over smart HTTP (`git http-backend` behind Basic auth).

The project repository is a real one with `origin` pointing at a `GitHttpRemote`; every push, fetch and look-up
goes through `GitPushes`, so through git's own credential machinery. What is shown: the lease (a branch someone
else moved is never overwritten, a push a crash cut off is recognised as done), that exactly one ref is pushed, and
where the token goes: into the one git process's environment, out through the credential helper to this remote's
URL only (another port, or another repository on the same server, asked with the very same options, gets nothing).
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
from pathlib import Path

import pytest

from taskgate.domain.errors import ForgeError
from taskgate.infrastructure.forge import pushes as pushes_module
from taskgate.infrastructure.forge.pushes import TOKEN_VAR, GitPushes, PushResult, credential_options
from tests.support.git_http import GitHttpRemote

TOKEN = "ghp_s3cretT0kenForTests"
BRANCH = "taskgate/s1"
IDENTITY = ("-c", "user.name=forge", "-c", "user.email=forge@example.invalid", "-c", "init.defaultBranch=main")
PLAIN_ENV = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": ""}


def git(cwd: Path | str, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(
        ["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True, env=env or PLAIN_ENV, check=False
    )
    if check and done.returncode:
        raise AssertionError(f"git {args} failed: {done.stderr}")
    return done.stdout.strip() if check else done.stderr


def commit(cwd: Path, message: str) -> str:
    (cwd / f"{message}.txt").write_text(message)
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


def auth_header(token: str = TOKEN) -> tuple[str, str]:
    """`-c http.extraHeader=…`: how the tests' "other person" authenticates, leaving no credential behind."""
    basic = base64.b64encode(f"someone:{token}".encode()).decode()
    return ("-c", f"http.extraHeader=Authorization: Basic {basic}")


def remote_sha(bare: Path, ref: str) -> str | None:
    done = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "--quiet", ref], capture_output=True)
    return done.stdout.decode().strip() or None


@pytest.fixture
def forge(tmp_path: Path):
    with GitHttpRemote(tmp_path / "forge", token=TOKEN) as served:
        served.create("acme", "shop")
        yield served


@pytest.fixture
def pushes() -> GitPushes:
    return GitPushes("origin", "GITHUB_TOKEN", {"GITHUB_TOKEN": TOKEN})


@pytest.fixture
async def repo(tmp_path: Path, forge: GitHttpRemote, pushes: GitPushes) -> Path:
    """The project: main pushed to origin once (through GitPushes), BRANCH one commit ahead, not pushed."""
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q")
    commit(root, "base")
    git(root, "remote", "add", "origin", forge.repo_url("acme", "shop"))
    await pushes.push(str(root), "main", None)
    git(root, "switch", "-q", "-c", BRANCH)
    commit(root, "session-work")
    return root


def bare(forge: GitHttpRemote) -> Path:
    return forge.root / "acme" / "shop.git"


def someone_else_pushes(tmp_path: Path, forge: GitHttpRemote, branch: str) -> str:
    """Another clone commits on `branch` and pushes it; returns that commit."""
    other = tmp_path / "someone"
    git(tmp_path, *auth_header(), "clone", "-q", forge.repo_url("acme", "shop"), str(other))
    git(other, "switch", "-q", branch)
    sha = commit(other, "theirs")
    git(other, *auth_header(), "push", "-q", "origin", branch)
    return sha


async def test_push_creates_then_fast_forwards_then_sees_it_done(repo: Path, forge: GitHttpRemote, pushes) -> None:
    first = git(repo, "rev-parse", "HEAD")
    created = await pushes.push(str(repo), BRANCH, None)
    assert created == PushResult(first, created=True, already=False)
    assert remote_sha(bare(forge), f"refs/heads/{BRANCH}") == first

    second = commit(repo, "more")
    moved = await pushes.push(str(repo), BRANCH, first)
    assert moved == PushResult(second, created=False, already=False)
    assert remote_sha(bare(forge), f"refs/heads/{BRANCH}") == second

    # the same push again, as after a crash that cut it off once it had landed: the lease fails, the head is there
    assert await pushes.push(str(repo), BRANCH, first) == PushResult(second, created=False, already=True)
    assert await pushes.push(str(repo), BRANCH, second) == PushResult(second, created=False, already=True)
    assert await pushes.remote_head(str(repo), BRANCH) == second


async def test_a_branch_someone_else_moved_is_never_overwritten(tmp_path: Path, repo: Path, forge, pushes) -> None:
    ours = (await pushes.push(str(repo), BRANCH, None)).sha
    theirs = someone_else_pushes(tmp_path, forge, BRANCH)
    commit(repo, "ours-again")

    with pytest.raises(ForgeError) as refused:
        await pushes.push(str(repo), BRANCH, ours)
    message = str(refused.value)
    assert ours in message and theirs in message and BRANCH in message
    assert "someone else pushed to it; taskgate never forces over other people's commits" in message
    assert remote_sha(bare(forge), f"refs/heads/{BRANCH}") == theirs


async def test_a_new_branch_that_exists_already_is_not_overwritten(tmp_path: Path, repo: Path, forge, pushes) -> None:
    main = git(repo, "rev-parse", "main")
    theirs = someone_else_pushes(tmp_path, forge, "main")  # the remote's main moved: ours would drop their commit
    with pytest.raises(ForgeError, match=f"is at {theirs}, not at \\(no such branch\\)"):
        await pushes.push(str(repo), "main", None)
    assert remote_sha(bare(forge), "refs/heads/main") == theirs != main


async def test_only_the_branch_is_pushed(repo: Path, forge: GitHttpRemote, pushes) -> None:
    git(repo, "tag", "-a", "-m", "release", "v1")  # annotated, on the pushed commit: followTags would send it
    git(repo, "tag", "light")
    git(repo, "branch", "private-work")
    git(repo, "config", "push.followTags", "true")
    git(repo, "config", "remote.origin.mirror", "true")  # `git push origin` alone would send every ref

    await pushes.push(str(repo), BRANCH, None)

    refs = git(bare(forge), "for-each-ref", "--format=%(refname)").splitlines()
    assert sorted(refs) == ["refs/heads/main", f"refs/heads/{BRANCH}"]


async def test_the_token_stays_in_the_git_process_and_with_this_remote(
    tmp_path: Path, repo: Path, forge: GitHttpRemote, pushes: GitPushes, monkeypatch
) -> None:
    launched: list[tuple[tuple[str, ...], dict[str, str]]] = []
    real_exec = asyncio.create_subprocess_exec

    async def recording_exec(*argv: str, **kwargs):
        launched.append((argv, kwargs["env"]))
        return await real_exec(*argv, **kwargs)

    monkeypatch.setattr(pushes_module.asyncio, "create_subprocess_exec", recording_exec)
    monkeypatch.setenv("GIT_TRACE_CURL", "1")  # would print the request headers to stderr
    await pushes.push(str(repo), BRANCH, None)
    await pushes.fetch(str(repo), "main")

    # argv: never the token; the helper names the variable, set in the environment of network commands only
    assert launched and all(TOKEN not in arg for argv, _ in launched for arg in argv)
    network = [(argv, env) for argv, env in launched if {"push", "fetch", "ls-remote"} & set(argv)]
    assert network and all(env[TOKEN_VAR] == TOKEN and "GIT_TRACE_CURL" not in env for _, env in network)
    assert all(TOKEN_VAR not in env for argv, env in launched if (argv, env) not in network)
    assert TOKEN_VAR not in os.environ and "GITHUB_TOKEN" not in os.environ
    (push_argv,) = [argv for argv, _ in launched if "push" in argv]
    head = git(repo, "rev-parse", BRANCH)
    assert push_argv[-3:] == (f"--force-with-lease=refs/heads/{BRANCH}:", "origin", f"{head}:refs/heads/{BRANCH}")
    assert not {"--force", "-f", "--all", "--mirror", "--tags", "--follow-tags"} & set(push_argv)
    assert "core.hooksPath=/dev/null" in push_argv
    url = forge.repo_url("acme", "shop")
    assert credential_options([url]) == [
        "-c",
        "credential.helper=",
        "-c",
        f"credential.{url}.helper={pushes_module.HELPER}",
    ]
    assert f"${TOKEN_VAR}" in pushes_module.HELPER

    # nothing on disk or in the remote URL holds it; the server got exactly it, every time it got a password
    assert await pushes.remote_url(str(repo)) == url
    assert not [p for p in (repo / ".git").rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert forge.seen_passwords and set(forge.seen_passwords) == {TOKEN}

    # the scoping: the very options GitPushes gives git for origin, and the token in the environment, used to push
    # to a second server (another port) and to another repository on the same server: neither is sent a password
    with GitHttpRemote(tmp_path / "elsewhere", token=TOKEN) as elsewhere:
        elsewhere.create("acme", "shop")
        forge.create("acme", "other")
        git(repo, "remote", "add", "elsewhere", elsewhere.repo_url("acme", "shop"))
        git(repo, "remote", "add", "sibling", forge.repo_url("acme", "other"))
        scoped = [*credential_options([url]), "push", "-q"]
        env = {**PLAIN_ENV, TOKEN_VAR: TOKEN}
        for remote in ("elsewhere", "sibling"):
            said = git(repo, *scoped, remote, BRANCH, env=env, check=False)
            assert "could not read Username" in said and "terminal prompts disabled" in said
        assert elsewhere.seen_passwords == [] and {r[2:] for r in elsewhere.requests} == {(401, None)}
        sibling = [r for r in forge.requests if r[1].startswith("/acme/other.git/")]
        assert sibling and {r[2:] for r in sibling} == {(401, None)}
        assert remote_sha(forge.root / "acme" / "other.git", f"refs/heads/{BRANCH}") is None

        # the control: scoped to the second server's URL, the same push there succeeds
        git(repo, *credential_options([elsewhere.repo_url("acme", "shop")]), "push", "-q", "elsewhere", BRANCH, env=env)
        assert elsewhere.seen_passwords and set(elsewhere.seen_passwords) == {TOKEN}


@pytest.mark.parametrize("environ", [{}, {"GITHUB_TOKEN": ""}, {"GITHUB_TOKEN": "  "}])
async def test_a_missing_token_runs_no_git(repo: Path, forge: GitHttpRemote, environ, monkeypatch) -> None:
    before = list(forge.requests)

    async def no_git(*argv: str, **kwargs):
        raise AssertionError(f"git ran: {argv}")

    monkeypatch.setattr(pushes_module.asyncio, "create_subprocess_exec", no_git)
    without = GitPushes("origin", "GITHUB_TOKEN", environ)
    for call in (
        without.push(str(repo), BRANCH, None),
        without.fetch(str(repo), "main"),
        without.remote_head(str(repo), BRANCH),
        without.delete(str(repo), BRANCH, "0" * 40),
    ):
        with pytest.raises(ForgeError, match=r"^GITHUB_TOKEN is not set: "):
            await call
    assert forge.requests == before


async def test_a_wrong_token_fails_with_gits_reason(repo: Path, forge: GitHttpRemote) -> None:
    wrong = GitPushes("origin", "GITHUB_TOKEN", {"GITHUB_TOKEN": "ghp_wrong"})
    with pytest.raises(ForgeError, match=f"pushing branch '{BRANCH}' to remote 'origin' failed: .*Authentication"):
        await wrong.push(str(repo), BRANCH, None)
    assert "ghp_wrong" in forge.seen_passwords and remote_sha(bare(forge), f"refs/heads/{BRANCH}") is None


async def test_a_missing_remote_or_branch_is_named(repo: Path, pushes: GitPushes) -> None:
    with pytest.raises(ForgeError, match="no git remote 'upstream'"):
        await GitPushes("upstream", "GITHUB_TOKEN", {"GITHUB_TOKEN": TOKEN}).remote_url(str(repo))
    with pytest.raises(ForgeError, match="'taskgate/nope' does not exist"):
        await pushes.push(str(repo), "taskgate/nope", None)
    with pytest.raises(ForgeError, match="not a valid branch name"):
        await pushes.push(str(repo), "--all", None)
    with pytest.raises(ForgeError, match="fetching branch 'taskgate/nope' from remote 'origin' failed"):
        await pushes.fetch(str(repo), "taskgate/nope")


async def test_delete_under_a_lease_and_fetch(tmp_path: Path, repo: Path, forge: GitHttpRemote, pushes) -> None:
    ours = (await pushes.push(str(repo), BRANCH, None)).sha
    assert await pushes.delete(str(repo), BRANCH, "1" * 40) is False  # stale lease: kept
    assert remote_sha(bare(forge), f"refs/heads/{BRANCH}") == ours
    assert await pushes.delete(str(repo), BRANCH, ours) is True
    assert remote_sha(bare(forge), f"refs/heads/{BRANCH}") is None
    assert await pushes.remote_head(str(repo), BRANCH) is None
    assert await pushes.delete(str(repo), BRANCH, ours) is False  # gone already

    theirs = someone_else_pushes(tmp_path, forge, "main")
    assert await pushes.fetch(str(repo), "main") == theirs
    assert git(repo, "rev-parse", "refs/remotes/origin/main") == theirs
    assert git(repo, "tag", "--list") == ""


async def test_the_remote_wants_the_token_to_read_and_write(tmp_path: Path, forge: GitHttpRemote) -> None:
    url = forge.repo_url("acme", "shop")
    said = git(tmp_path, "clone", "-q", url, str(tmp_path / "anonymous"), check=False)
    assert "could not read Username" in said
    assert forge.requests[-1][2:] == (401, None)
    wrong = url.replace("http://", "http://someone:ghp_wrong@")
    said = git(tmp_path, "clone", "-q", wrong, str(tmp_path / "wrong"), check=False)
    assert "Authentication failed" in said
    assert forge.requests[-1][2:] == (401, "someone") and forge.seen_passwords == ["ghp_wrong"]

    clone = tmp_path / "member"
    git(tmp_path, *auth_header(), "clone", "-q", url, str(clone))
    (clone / "big.bin").write_bytes(os.urandom(2_500_000))  # past http.postBuffer (1 MiB): git sends it chunked
    git(clone, "add", "big.bin")
    git(clone, "commit", "-q", "-m", "big")
    git(clone, *auth_header(), "push", "-q", "origin", "main")
    assert remote_sha(bare(forge), "refs/heads/main") == git(clone, "rev-parse", "HEAD")
    git(tmp_path, *auth_header(), "clone", "-q", url, str(tmp_path / "again"))
    assert (tmp_path / "again" / "big.bin").stat().st_size == 2_500_000


async def test_a_remote_that_never_answers_is_given_up_on(repo: Path, pushes: GitPushes, monkeypatch) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts connections (the backlog) and never answers
    with listener:
        port = listener.getsockname()[1]
        git(repo, "remote", "set-url", "origin", f"http://127.0.0.1:{port}/acme/shop.git")
        monkeypatch.setattr(pushes_module, "GIT_TIMEOUT_S", 1.0)
        with pytest.raises(ForgeError, match=r"git push in .* took longer than 1 s and was stopped"):
            await pushes.push(str(repo), BRANCH, None)
    # the whole process group went: git and the git-remote-http it started
    left = subprocess.run(["pgrep", "-f", f"127.0.0.1:{port}"], capture_output=True, text=True).stdout.split()
    assert left == []
