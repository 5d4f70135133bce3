"""Pushes of session branches to the project's forge remote, and the fetches and look-ups around them.

Safety of a push. Exactly one ref is pushed, `<commit>:refs/heads/<branch>`, always under a lease
(`--force-with-lease=refs/heads/<branch>:<expected>`, an empty value meaning "the branch must not exist yet"): the
remote branch moves only if it still is where taskgate last left it, so another person's commits on it are never
overwritten. Never `--force` without a lease, never `--all`, `--mirror` or tags (`--no-follow-tags` beats a
`push.followTags` in the user's config, `remote.<name>.mirror=false` a mirror remote). The source is the commit
`refs/heads/<branch>` names when the push starts, not the ref itself, so the result names exactly what was sent
even if the branch moves meanwhile.

The user's hooks are off for these git processes (`core.hooksPath=/dev/null`, as for every git call taskgate
makes, see infrastructure/git.py): the push is taskgate's own bookkeeping of a session branch, not the user
publishing work; a pre-push hook may run a test suite for minutes, prompt, or have been written into the repository
by an agent, and any hook would see the push's environment (the token). `--no-verify` alone would skip only
pre-push; the reference-transaction hook runs on the remote-tracking refs a push and a fetch update.

The token. It is read from `environ[token_env]` at each call and handed to git by a credential helper that only
that one remote's URLs select: `-c credential.helper=` first (an empty value drops every helper inherited from the
system, global and repository config, so no keychain learns the token and no other helper answers instead), then
`-c credential.<remote URL>.helper=<HELPER>`. HELPER is a shell snippet that prints the value of
`TASKGATE_FORGE_TOKEN`, a variable set in that one git process's environment (the helper, git's child, inherits
it): the token is in no argv (the snippet names the variable, the shell expands it in its own memory and `echo` is a
builtin), no config file, no remote URL. Git picks `credential.<url>.*` by its URL-matching rules (git-config(1),
`http.<url>.*`): scheme, host and port must be equal and the configured path must be a prefix of the request's on a
`/` boundary, so `http://host:1/acme/shop.git` matches that repository only, not `http://host:1/acme/other.git` nor
another port (tests/integration/forge/test_pushes.py pushes to both with these options and shows neither gets it).
With `GIT_TERMINAL_PROMPT=0` and `GIT_ASKPASS=` (empty: git then skips `core.askPass` and `SSH_ASKPASS` too) a
remote that wants credentials the helper does not give fails at once instead of prompting. `GIT_TRACE*` and
`GIT_CURL_VERBOSE` are dropped from git's environment (traces could print the request headers). The helper applies
to http(s) remotes; an ssh remote is reached with the user's ssh set-up, the token unused.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from taskgate.application.forge.ports import PushResult
from taskgate.domain.errors import ForgeError

GIT_TIMEOUT_S = 60.0
TOKEN_VAR = "TASKGATE_FORGE_TOKEN"
FORGE_USER = "x-access-token"  # GitHub's user name for token authentication over HTTPS (any name works there)
# `!` makes git run it with the shell, appending the operation (get, store, erase); only `get` answers
HELPER = f'!f() {{ test "$1" = get || return 0; echo username={FORGE_USER}; echo "password=${TOKEN_VAR}"; }}; f'
# every git call here, local or not: no hooks, no askpass program from the config
_SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.askPass=", "-c", "core.fsmonitor=false")
# inherited variables that could redirect git to another repository, inject config or trace requests
_DROPPED_PREFIXES = ("GIT_TRACE", "GIT_CONFIG_", "GIT_CURL_VERBOSE", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
_DROPPED = {"GIT_CONFIG_PARAMETERS", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY", "GIT_NAMESPACE", "GIT_ASKPASS"}


@dataclass(frozen=True, slots=True)
class _Done:
    status: int
    out: str
    err: str


class GitPushes:
    """Pushes and fetches against the project's forge remote, with the forge token given to git through a
    credential helper scoped to that one remote URL: the token is never in argv, in a config file, in the
    remote URL, or in any environment but that git process's."""

    def __init__(self, remote: str, token_env: str, environ: Mapping[str, str] | None = None) -> None:
        """`remote` is the git remote's name ("origin"); the token is read from `environ[token_env]` (the process
        environment by default) at each call, so a rotated token is used from the next push on."""
        if not remote or remote.startswith("-") or "/" in remote or any(c.isspace() for c in remote):
            raise ForgeError(f"'{remote}' is not a git remote name taskgate can push to (like 'origin')")
        self._remote, self._token_env = remote, token_env
        self._environ = os.environ if environ is None else environ

    async def remote_url(self, repo_root: str) -> str:
        """The remote's (fetch) URL, as git will use it. Raises: ForgeError naming the remote when it is missing."""
        return (await self._urls(repo_root, push=False))[0]

    async def push(self, repo_root: str, branch: str, expected: str | None) -> PushResult:
        """Push the commit `branch` names to the remote's branch of that name, only if the remote branch is at
        `expected` (None: only if it does not exist). Raises: ForgeError when the token is missing, the branch is
        not local, the remote branch is elsewhere (someone else pushed) or git fails; nothing was pushed then."""
        token = self._token()
        ref = await _branch_ref(repo_root, branch)
        head = await _local_head(repo_root, ref, branch)
        urls = await self._scope(repo_root)
        lease = f"--force-with-lease={ref}:{expected or ''}"
        done = await self._network(repo_root, urls, token, *_push_args(self._remote, lease, f"{head}:{ref}"))
        flag, summary = _porcelain(done.out, ref)
        if done.status == 0 and flag in (" ", "+", "*", "="):
            return PushResult(head, created=flag == "*", already=flag == "=")
        if flag == "!" and "stale info" in summary:
            return await self._lease_failed(repo_root, branch, head, expected)
        raise ForgeError(f"pushing branch '{branch}' to remote '{self._remote}' failed: {_said(done, token)}")

    async def remote_head(self, repo_root: str, branch: str) -> str | None:
        """The commit the remote's `branch` points at, None when it has no such branch. Raises: ForgeError."""
        token = self._token()
        ref = await _branch_ref(repo_root, branch)
        return await self._ls_remote(repo_root, await self._scope(repo_root), token, ref)

    async def fetch(self, repo_root: str, branch: str) -> str:
        """Fetch the remote's `branch` into `refs/remotes/<remote>/<branch>` and return its commit. Raises:
        ForgeError when the remote has no such branch or git fails."""
        token = self._token()
        ref = await _branch_ref(repo_root, branch)
        tracking = f"refs/remotes/{self._remote}/{branch}"
        done = await self._network(
            repo_root, await self._scope(repo_root), token, *_fetch_args(self._remote, f"+{ref}:{tracking}")
        )
        if done.status != 0:
            raise ForgeError(f"fetching branch '{branch}' from remote '{self._remote}' failed: {_said(done, token)}")
        return await _local_head(repo_root, tracking, tracking)

    async def delete(self, repo_root: str, branch: str, expected: str) -> bool:
        """Delete the remote's `branch` only if it still points at `expected` (a lease). True when deleted; False
        when it moved or is gone already (nothing was changed). Raises: ForgeError when git fails otherwise."""
        token = self._token()
        ref = await _branch_ref(repo_root, branch)
        lease = f"--force-with-lease={ref}:{expected}"
        done = await self._network(
            repo_root, await self._scope(repo_root), token, *_push_args(self._remote, lease, f":{ref}")
        )
        flag, summary = _porcelain(done.out, ref)
        if done.status == 0 and flag == "-":
            return True
        if (flag == "!" and "stale info" in summary) or "remote ref does not exist" in done.err:
            return False
        raise ForgeError(f"deleting branch '{branch}' on remote '{self._remote}' failed: {_said(done, token)}")

    async def _lease_failed(self, repo_root: str, branch: str, head: str, expected: str | None) -> PushResult:
        """The remote branch was not at `expected`: done already if it holds our head, else someone else's."""
        found = await self.remote_head(repo_root, branch)
        if found == head:
            return PushResult(head, created=False, already=True)
        raise ForgeError(
            f"branch '{branch}' on remote '{self._remote}' is at {found or '(no such branch)'}, not at "
            f"{expected or '(no such branch)'} where taskgate left it: someone else pushed to it; taskgate never "
            f"forces over other people's commits. Nothing was pushed; fetch the branch and merge or rebase onto it"
        )

    async def _ls_remote(self, repo_root: str, urls: Sequence[str], token: str, ref: str) -> str | None:
        done = await self._network(repo_root, urls, token, "ls-remote", "--refs", self._remote, ref)
        if done.status != 0:
            raise ForgeError(f"listing '{ref}' on remote '{self._remote}' failed: {_said(done, token)}")
        # ls-remote matches patterns at the tail (`refs/heads/x` would also match `refs/heads/a/refs/heads/x`)
        heads = [line.split("\t") for line in done.out.splitlines() if "\t" in line]
        return next((sha for sha, name in heads if name == ref), None)

    async def _scope(self, repo_root: str) -> list[str]:
        """The remote's URLs the credential helper is given for: its fetch URL and its push URL (one only)."""
        fetch_urls, push_urls = await asyncio.gather(
            self._urls(repo_root, push=False), self._urls(repo_root, push=True)
        )
        if len(push_urls) > 1:
            raise ForgeError(
                f"remote '{self._remote}' has {len(push_urls)} push URLs ({', '.join(push_urls)}); taskgate pushes "
                f"a session branch to exactly one: give the forge its own remote"
            )
        return list(dict.fromkeys([*fetch_urls, *push_urls]))

    async def _urls(self, repo_root: str, push: bool) -> list[str]:
        args = ["remote", "get-url", "--all", *(["--push"] if push else []), self._remote]
        done = await _run(repo_root, _git_argv((), *args), _git_env(None))
        urls = done.out.split()
        if done.status != 0 or not urls:
            raise ForgeError(
                f"the repository at {repo_root} has no git remote '{self._remote}' "
                f"({done.err.strip() or 'no URL'}): add it (`git remote add {self._remote} <url>`) or configure "
                f"the forge's remote name"
            )
        return urls

    async def _network(self, repo_root: str, urls: Sequence[str], token: str, *args: str) -> _Done:
        return await _run(repo_root, _git_argv(urls, *args), _git_env(token))

    def _token(self) -> str:
        """The forge token, checked before any git process runs. Raises: ForgeError naming the variable."""
        token = self._environ.get(self._token_env, "").strip()
        if not token:
            raise ForgeError(
                f"{self._token_env} is not set: taskgate reads the forge token from it to push to and fetch from "
                f"remote '{self._remote}'; set it to a token that may write to the repository"
            )
        if any(c in token for c in "\r\n\0"):  # would end the credential line early and inject another field
            raise ForgeError(f"{self._token_env} holds a line break or NUL: it is not a token")
        return token


def credential_options(urls: Sequence[str]) -> list[str]:
    """The `-c` options that give the credential helper to `urls` only and to nothing else."""
    options = ["-c", "credential.helper="]
    for url in urls:
        options += ["-c", f"credential.{_without_userinfo(url)}.helper={HELPER}"]
    return options


def _git_argv(urls: Sequence[str], *args: str) -> list[str]:
    """The argv of one git process: safe config, the credential helper for `urls` (none when empty), `args`."""
    return ["git", *_SAFE_CONFIG, *(credential_options(urls) if urls else ()), *args]


def _push_args(remote: str, lease: str, refspec: str) -> list[str]:
    return [
        "-c", f"remote.{remote}.mirror=false",
        "push", "--porcelain", "--no-follow-tags", "--no-signed", "--recurse-submodules=no", "--no-atomic",
        lease, remote, refspec,
    ]  # fmt: skip


def _fetch_args(remote: str, refspec: str) -> list[str]:
    return [
        "fetch", "--no-tags", "--no-write-fetch-head", "--recurse-submodules=no", "--no-auto-maintenance",
        remote, refspec,
    ]  # fmt: skip


def _git_env(token: str | None) -> dict[str, str]:
    """Git's environment: ours without tracing and redirection, no prompts, and the token only when given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DROPPED and not k.startswith(_DROPPED_PREFIXES) and k != TOKEN_VAR
    }
    env.update(GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", LC_ALL="C")
    if token is not None:
        env[TOKEN_VAR] = token
    return env


def _without_userinfo(url: str) -> str:
    """`url` without `user:password@`: a user in a `credential.<url>` key would have to match the request's."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


async def _branch_ref(repo_root: str, branch: str) -> str:
    """`refs/heads/<branch>` once git agrees it is a valid branch name. Raises: ForgeError."""
    ref = f"refs/heads/{branch}"
    if branch.startswith("-") or (await _run(repo_root, _git_argv((), "check-ref-format", ref), _git_env(None))).status:
        raise ForgeError(f"'{branch}' is not a valid branch name")
    return ref


async def _local_head(repo_root: str, ref: str, name: str) -> str:
    """The commit `ref` names in the repository. Raises: ForgeError when there is none."""
    done = await _run(
        repo_root,
        _git_argv((), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"),
        _git_env(None),
    )
    if done.status != 0 or not done.out.strip():
        raise ForgeError(f"'{name}' does not exist in the repository at {repo_root}: there is nothing to push or read")
    return done.out.strip()


def _porcelain(out: str, ref: str) -> tuple[str, str]:
    """(flag, summary) of `ref`'s line in `git push --porcelain` output: `flag<TAB>src:dst<TAB>summary`."""
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and len(fields[0]) == 1 and fields[1].endswith(f":{ref}"):
            return fields[0], fields[2]
    return "", ""


def _said(done: _Done, token: str) -> str:
    """Git's own reason, short and on one line, with the token redacted should it ever appear."""
    lines = [line.strip() for line in (done.err.strip() or done.out.strip()).splitlines() if line.strip()]
    text = "; ".join(lines)[-800:] or f"exit {done.status}"  # one line: errors are shown as one
    return text.replace(token, "***")


async def _run(cwd: str, argv: list[str], env: dict[str, str]) -> _Done:
    """Run `argv` in `cwd` without a shell, for at most GIT_TIMEOUT_S. Raises: ForgeError when git cannot start or
    runs too long (then it is killed with its children: `git push` runs `git-remote-http`, which runs more)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise ForgeError(f"cannot run git in {cwd}: {exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), GIT_TIMEOUT_S)
    except TimeoutError:
        raise ForgeError(
            f"git {_verb(argv)} in {cwd} took longer than {GIT_TIMEOUT_S:.0f} s and was stopped; is the remote up?"
        ) from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: not reaped yet, so the group id is still ours
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    return _Done(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def _verb(argv: list[str]) -> str:
    """The git command's name in `argv` (the first argument after the `-c` options)."""
    i = 1
    while i < len(argv) and argv[i] == "-c":
        i += 2
    return argv[i] if i < len(argv) else "?"
