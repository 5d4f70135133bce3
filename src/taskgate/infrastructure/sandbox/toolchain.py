"""What an agent's command needs to see to run: the install prefixes of its program, its interpreter, and the
folders on its PATH, found on the host before the launch.

Why: the sandbox hides the operator's home, where toolchains often live (pyenv, nvm, an npm prefix, a venv).
Hidden, a CLI fails to start (`execvp … No such file or directory`) or, worse, `python3` silently resolves to
another interpreter. So each folder the command's program resolves through (symbolic links and `#!` lines
followed, a venv's base interpreter included) is shown again read-only, as is each PATH folder's prefix, never
the home itself (`~/bin` shows `~/bin`, not `~`), and credential folders stay hidden (domain/sandbox.py).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping

_MAX_HOPS = 8


def prefixes(command: Iterable[str], env: Mapping[str, str], home: str) -> list[str]:
    """Folders to show read-only so `command` runs inside as it does outside (with `env`'s PATH), taskgate's own
    interpreter and package included (the in-sandbox init runs on it)."""
    path = env.get("PATH", os.defpath)
    found: set[str] = set()
    for part in command:
        program = part if os.sep in part else shutil.which(part, path=path)
        if program and os.path.isfile(program):
            _follow(program, path, found, home, 0)
    for program in (sys.executable, os.path.realpath(sys.executable)):
        _follow(program, path, found, home, 0)
    found.update(_prefix(p, home) for p in (sys.prefix, sys.base_prefix, _package_root()))
    found.update(_prefix(folder, home) for folder in path.split(os.pathsep) if folder)
    return sorted(p for p in found if p and p not in ("/", home))


def _follow(program: str, path: str, found: set[str], home: str, hops: int) -> None:
    """Every folder `program` resolves through: each link's own folder, the target's, and its `#!` interpreter's."""
    if hops > _MAX_HOPS:
        return
    current = os.path.abspath(program)
    for _ in range(_MAX_HOPS):
        found.add(_prefix(os.path.dirname(current), home))
        if not os.path.islink(current):
            break
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    real = os.path.realpath(program)
    found.add(_prefix(os.path.dirname(real), home))
    _venv_base(real, found, home)
    interpreter = _shebang(real, path)
    if interpreter:
        _follow(interpreter, path, found, home, hops + 1)


def _shebang(program: str, path: str) -> str | None:
    """The interpreter of a `#!` script (`/usr/bin/env node` → node on PATH), or None."""
    try:
        with open(program, "rb") as handle:
            line = handle.readline(256)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(names[0], path=path) if names else None
    return words[0]


def _venv_base(program: str, found: set[str], home: str) -> None:
    """A venv's interpreter is a link into its base installation, named by `pyvenv.cfg`'s `home`."""
    config = os.path.join(os.path.dirname(os.path.dirname(program)), "pyvenv.cfg")
    try:
        with open(config) as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    found.add(_prefix(value.strip(), home))
    except OSError:
        return


def _prefix(folder: str, home: str) -> str:
    """The install prefix of a program folder: `…/bin` and `…/shims` → their parent; a Node package's folder →
    its `node_modules` (a CLI loads its dependencies and platform binaries from sibling packages: Codex's
    `@openai/codex-linux-x64`); never the home or `/`."""
    folder = os.path.abspath(folder)
    parts = folder.split(os.sep)
    if "node_modules" in parts:
        return os.sep.join(parts[: parts.index("node_modules") + 1])
    if os.path.basename(folder) in ("bin", "shims", "sbin"):
        parent = os.path.dirname(folder)
        if parent not in ("/", "/usr", home) and not parent.startswith("/usr/"):
            return parent
    return folder


def _package_root() -> str:
    """The folder holding the `taskgate` package (a source checkout's `src/`, or site-packages)."""
    import taskgate

    return os.path.dirname(os.path.dirname(os.path.abspath(taskgate.__file__)))
