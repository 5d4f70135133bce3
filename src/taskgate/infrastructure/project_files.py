"""Reading files of a project's tree for workflows (`load:` files, `{config_source}:key` configs), confined to it.

The path is resolved with every symbolic link followed (`os.path.realpath`) and must stay under the root's own
real path; the file is then opened with `O_NOFOLLOW` and checked to be the same regular file (device and inode)
that was resolved, so a link swapped in between the check and the open is refused too.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from taskgate.domain.errors import Forbidden, InvalidInput
from taskgate.domain.workflows.templating import VariableError

MAX_FILE_BYTES = 256 * 1024


class ProjectFileReader:
    """The `ProjectFiles` port over the local disk."""

    def __init__(self, max_bytes: int = MAX_FILE_BYTES) -> None:
        self.max_bytes = max_bytes

    def read_text(self, root: str, path: str) -> str:
        real_root = os.path.realpath(root)
        given = path if os.path.isabs(path) else os.path.join(root, path)
        real = os.path.realpath(given)
        if os.path.commonpath([real_root, real]) != real_root:
            raise Forbidden(f"{path} is outside the project ({root}); workflows read only the project's files")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise InvalidInput(f"{path}: no such file in the project") from None
        except OSError as exc:
            raise InvalidInput(f"{path}: cannot be read ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"{path} is not a regular file")
            if (info.st_dev, info.st_ino) != _identity(real):
                raise Forbidden(f"{path} changed while it was read; read again")
            data = os.read(fd, self.max_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > self.max_bytes:
            raise InvalidInput(f"{path} is larger than {self.max_bytes} bytes; workflows load smaller files")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{path} is not UTF-8 text") from None

    def config_value(self, root: str, path: str, key: str) -> str:
        text = self.read_text(root, path)
        try:
            data: Any = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise VariableError(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}") from None
        node = data
        for n, part in enumerate(key.split(".")):
            if not isinstance(node, dict) or part not in node:
                at = ".".join(key.split(".")[:n]) or "the top level"
                keys = ", ".join(sorted(str(k) for k in node)) if isinstance(node, dict) else "none"
                raise VariableError(f"{path} has no key '{part}' at {at} (keys: {keys})")
            node = node[part]
        if isinstance(node, bool):
            return "true" if node else "false"
        if isinstance(node, str | int | float):
            return str(node)
        raise VariableError(f"{path}: key '{key}' holds a {type(node).__name__}, not a text")


def _identity(path: str) -> tuple[int, int]:
    info = Path(path).stat()
    return info.st_dev, info.st_ino
