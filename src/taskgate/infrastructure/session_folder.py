"""Session folders on the local disk: `<root>/<session id>/` (or where a workflow's `session_folder` template
placed it, always under the root), its files, and its `manifest.json`.

A placed folder is recorded in `<root>/.places/<session id>` (its path relative to the root, written once before
the folder exists); every operation reads it, checks it again with the output-path rules, and walks to the folder
component by component with `O_NOFOLLOW`, as below.

Confinement does not rest on string checks alone (`domain.outputs.output_path` does those). Every file
operation here is relative to a directory file descriptor: the session folder is opened with `O_NOFOLLOW`
under the root, each folder of an output path is opened (or created with `mkdir`) under the previous one, again
with `O_NOFOLLOW`, so a symbolic link anywhere on the way is refused instead of followed, however it got there.
The file itself is written to a fresh temporary name (`O_EXCL | O_NOFOLLOW`) and renamed over the final name:
a rename replaces a directory entry and never writes through it, so a symlink or a hard link planted at the
final name (or swapped in after the check) cannot redirect the write. Just before the rename, the chain
root → session folder → … → the file's folder is checked again, entry by entry, against the descriptors held,
so a folder moved out of the session folder while the write was under way is refused too.

Manifest updates are read-modify-write under two locks: an `asyncio.Lock` (striped by session id) so the
coroutines of one process queue without holding threads, then an `fcntl.flock` on `<root>/.locks/<id>.lock`
(outside the folder, where agents do not write) for other processes. The manifest is replaced atomically
(temporary file, fsync, `os.replace`). All file I/O runs in `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

from taskgate.domain.errors import Forbidden, InvalidInput, StorageError
from taskgate.domain.naming import check_session_id
from taskgate.domain.outputs import (
    MANIFEST_NAME,
    OutputLimits,
    OutputRecord,
    check_quota,
    iso,
    new_manifest,
    normalise_manifest,
    output_parts,
    with_header,
    with_output,
)

__all__ = ["SessionFolderStore"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOCK_STRIPES = 64
_MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_LOCKS_DIR = ".locks"
_PLACES_DIR = ".places"


class SessionFolderStore:
    """The `SessionFolders` port over a directory (`<data_dir>/agent-outputs`)."""

    def __init__(self, root: Path | str, limits: OutputLimits | None = None) -> None:
        self.root = Path(root)
        self.limits = limits or OutputLimits()
        self._locks = [asyncio.Lock() for _ in range(_LOCK_STRIPES)]

    def path(self, session_id: str) -> str:
        return str(self.root.joinpath(*self._parts(check_session_id(session_id))))

    async def place(self, session_id: str, relative: str) -> str:
        """Put the session's folder at `relative` under the root instead of `<session id>`: only before the folder
        exists, once (placing it again at the same path is a no-op). Returns its path. Raises: InvalidInput (a
        path the output rules refuse, one without the session id, a folder that exists already, or another
        place recorded before)."""
        check_session_id(session_id)
        parts = output_parts(relative)
        if not any(session_id in part for part in parts):
            raise InvalidInput(f"session folder {relative!r} must contain the session id (write {{session_id}} in it)")
        async with self._lock(session_id):
            await asyncio.to_thread(self._place, session_id, parts)
        return self.path(session_id)

    async def ensure(self, session_id: str) -> str:
        check_session_id(session_id)
        await asyncio.to_thread(self._ensure, session_id)
        return self.path(session_id)

    async def write_output(
        self, session_id: str, relative: str, data: bytes, *, at: datetime, by: str, task: dict[str, Any]
    ) -> OutputRecord:
        check_session_id(session_id)
        parts = output_parts(relative)
        check_quota(new_manifest(session_id), "/".join(parts), len(data), self.limits)  # fail fast, before locking
        async with self._lock(session_id):
            return await asyncio.to_thread(self._write_output, session_id, parts, data, at, by, task)

    def has_manifest(self, session_id: str) -> bool:
        """A `stat` of `<folder>/manifest.json` (symlinks not followed), on the loop: microseconds, where
        `read_manifest`'s hop to a worker thread costs a quarter of a millisecond on every transition."""
        try:
            os.stat(
                self.root.joinpath(*self._parts(check_session_id(session_id)), MANIFEST_NAME), follow_symlinks=False
            )
        except (OSError, Forbidden):
            return False
        return True

    async def read_manifest(self, session_id: str) -> dict[str, Any] | None:
        check_session_id(session_id)
        return await asyncio.to_thread(self._read_manifest, session_id)

    async def update_manifest(
        self, session_id: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        check_session_id(session_id)
        async with self._lock(session_id):
            return await asyncio.to_thread(self._update_manifest, session_id, mutate)

    # -- the blocking part, run in a worker thread -----------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks[int(hashlib.sha256(session_id.encode()).hexdigest()[:8], 16) % _LOCK_STRIPES]

    def _ensure(self, session_id: str) -> None:
        with self._folder(session_id):
            pass

    def _parts(self, session_id: str) -> list[str]:
        """The folder's path under the root, as components: its recorded place, else `[session id]`."""
        try:
            fd = os.open(self.root / _PLACES_DIR / session_id, _READ_FLAGS)
        except OSError:
            return [session_id]
        try:
            recorded = os.read(fd, 4096).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
        try:
            return output_parts(recorded)  # checked again: a place file edited by hand cannot lead out
        except InvalidInput:
            raise Forbidden(f"the recorded place of session folder {session_id} is not a valid path") from None

    def _place(self, session_id: str, parts: list[str]) -> None:
        wanted = "/".join(parts)
        self.root.mkdir(parents=True, exist_ok=True)
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with self._flock(root_fd, session_id):
                current = self._parts(session_id)
                if current != [session_id]:
                    if current == parts:
                        return
                    raise InvalidInput(f"session {session_id}'s folder is at {'/'.join(current)} already")
                moving = self._exists(root_fd, [session_id])
                if (moving and not _only_hooks_log(root_fd, session_id)) or self._exists(root_fd, parts):
                    raise InvalidInput(f"session {session_id}'s folder exists already; a workflow's session_folder "
                                       "applies before the session's first output")  # fmt: skip
                places_fd = _open_dir(root_fd, _PLACES_DIR, "the places folder")
                try:
                    _replace_file(places_fd, session_id, wanted.encode(), f"place of {session_id}", lambda: None)
                finally:
                    os.close(places_fd)
                if moving:  # the worktree's hooks ran before the workflow placed the folder: their log moves along
                    with _folders(root_fd, parts[:-1], "session folder ") as chain:
                        parent = chain[-1][2] if chain else root_fd
                        os.rename(session_id, parts[-1], src_dir_fd=root_fd, dst_dir_fd=parent)
        finally:
            os.close(root_fd)

    @staticmethod
    def _exists(root_fd: int, parts: list[str]) -> bool:
        path = "/".join(parts)
        try:
            os.stat(path, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def _write_output(
        self, session_id: str, parts: list[str], data: bytes, at: datetime, by: str, task: dict[str, Any]
    ) -> OutputRecord:
        path = "/".join(parts)
        with self._folder(session_id) as (root_fd, folder_fd, links), self._flock(root_fd, session_id):
            current = self._load(folder_fd, session_id, keep_corrupt=True)
            manifest = with_header(current or new_manifest(session_id), task, None)
            check_quota(manifest, path, len(data), self.limits)
            try:
                with _folders(folder_fd, parts[:-1]) as chain:
                    verify = lambda: _check_chain([*links, *chain])  # noqa: E731
                    _replace_file(chain[-1][2] if chain else folder_fd, parts[-1], data, path, verify)
            except OSError as exc:  # e.g. a folder on the way removed meanwhile, or the disk full
                raise StorageError(f"could not save {path!r}: {exc.strerror or exc}; nothing was written") from None
            record = OutputRecord(path, len(data), hashlib.sha256(data).hexdigest(), iso(at) or "", by)
            _save_manifest(folder_fd, with_output(manifest, record, at))
        return record

    def _read_manifest(self, session_id: str) -> dict[str, Any] | None:
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            folder_fd = _walk(root_fd, self._parts(session_id))
            if folder_fd is None:
                return None
            try:
                return self._load(folder_fd, session_id)
            finally:
                os.close(folder_fd)
        finally:
            os.close(root_fd)

    def _update_manifest(self, session_id: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        with self._folder(session_id) as (root_fd, folder_fd, _links), self._flock(root_fd, session_id):
            current = self._load(folder_fd, session_id, keep_corrupt=True) or new_manifest(session_id)
            manifest = mutate(current)
            _save_manifest(folder_fd, manifest)
            return manifest

    @contextmanager
    def _folder(self, session_id: str) -> Iterator[tuple[int, int, list[tuple[int, str, int]]]]:
        """(root fd, session folder fd, the links from the root to it), creating the folders when missing; a
        symlink on the way is refused."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(f"cannot open the session folders' root {self.root}: {exc.strerror}") from None
        try:
            with _folders(root_fd, self._parts(session_id), "session folder ") as links:
                yield root_fd, links[-1][2], links  # the links root → … → folder: a write checks them again
        finally:
            os.close(root_fd)

    @contextmanager
    def _flock(self, root_fd: int, session_id: str) -> Iterator[None]:
        locks_fd = _open_dir(root_fd, _LOCKS_DIR, "the lock folder")
        try:
            try:
                fd = os.open(f"{session_id}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=locks_fd)  # fmt: skip
            except OSError as exc:
                raise StorageError(f"cannot open the lock of session {session_id}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the lock
        finally:
            os.close(locks_fd)

    def _load(self, folder_fd: int, session_id: str, *, keep_corrupt: bool = False) -> dict[str, Any] | None:
        """The folder's manifest; None when it has none. An unreadable one is None too, and with `keep_corrupt`
        it is first renamed to `manifest.json.corrupt` so that the next write does not lose it silently."""
        try:
            fd = os.open(MANIFEST_NAME, _READ_FLAGS, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError:
            return self._corrupt(folder_fd, keep_corrupt)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_MANIFEST_BYTES:
                return self._corrupt(folder_fd, keep_corrupt)
            with os.fdopen(os.dup(fd), "rb") as handle:
                raw = handle.read(_MAX_MANIFEST_BYTES + 1)
        finally:
            os.close(fd)
        try:
            return normalise_manifest(json.loads(raw), session_id)
        except (ValueError, InvalidInput):
            return self._corrupt(folder_fd, keep_corrupt)

    @staticmethod
    def _corrupt(folder_fd: int, keep: bool) -> None:
        if keep:
            with suppress(OSError):
                os.replace(MANIFEST_NAME, f"{MANIFEST_NAME}.corrupt", src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        return None


def _only_hooks_log(root_fd: int, session_id: str) -> bool:
    """Whether the session's default folder holds nothing but the worktree hooks' `hooks.log` (which may move)."""
    fd = _walk(root_fd, [session_id])
    if fd is None:
        return False
    try:
        return set(os.listdir(fd)) <= {"hooks.log"}
    finally:
        os.close(fd)


def _walk(root_fd: int, parts: list[str]) -> int | None:
    """The folder at `parts` under `root_fd`, opened without creating anything or following a symlink; None when
    it is missing (or not a plain folder)."""
    fd = root_fd
    for name in parts:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            child = None
        if fd != root_fd:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _open_dir(parent_fd: int, name: str, shown: str) -> int:
    """Open (creating it if missing) the folder `name` under `parent_fd`, following no symlink.

    Raises: Forbidden for a symlink or a special file; InvalidInput when a regular file is in the way.
    """
    for attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if attempt:
                break
            with suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=parent_fd)
        except OSError as exc:
            raise _refusal(parent_fd, name, shown, exc) from None
    raise StorageError(f"{shown} vanished while it was being created")


def _refusal(parent_fd: int, name: str, shown: str, exc: OSError) -> Exception:
    try:
        mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode) or exc.errno == errno.ELOOP:
        return Forbidden(f"{shown} is a symbolic link; a symlink could escape the session folder, so none is followed")
    if stat.S_ISREG(mode):
        return InvalidInput(f"{shown} is a file, not a folder")
    if mode and not stat.S_ISDIR(mode):
        return Forbidden(f"{shown} is not a regular file or folder")
    return StorageError(f"cannot open {shown}: {exc.strerror}")


@contextmanager
def _folders(folder_fd: int, names: list[str], what: str = "") -> Iterator[list[tuple[int, str, int]]]:
    """Open (creating) each folder of `names` under the previous one; yields (parent fd, name, fd) links.
    Messages name a folder as `what` followed by its path (its repr when `what` is empty)."""
    chain: list[tuple[int, str, int]] = []
    try:
        parent = folder_fd
        for depth, name in enumerate(names):
            path = "/".join(names[: depth + 1])
            fd = _open_dir(parent, name, f"{what}{path}" if what else repr(path))
            chain.append((parent, name, fd))
            parent = fd
        yield chain
    finally:
        for _, _, fd in chain:
            os.close(fd)


def _check_chain(chain: list[tuple[int, str, int]]) -> None:
    """Every (parent, name) entry still names the very folder held open. Raises: Forbidden if one moved."""
    for parent_fd, name, fd in chain:
        try:
            entry = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            entry = None
        held = os.fstat(fd)
        if entry is None or (entry.st_dev, entry.st_ino) != (held.st_dev, held.st_ino):
            raise Forbidden(f"folder {name!r} was moved or replaced during the write; nothing was written")


def _replace_file(
    dir_fd: int, name: str, data: bytes, shown: str, verify: Callable[[], None], *, strict: bool = True
) -> None:
    """Write `data` as `name` under `dir_fd`: a fresh temporary file, fsync, then a rename over the name.
    `strict` refuses a symlink or special file at the name; otherwise it is replaced like a file (never followed)."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode if strict else 0
    except FileNotFoundError:
        mode = 0
    if stat.S_ISLNK(mode):
        raise Forbidden(f"{shown!r} is a symbolic link; a symlink could escape the session folder, so none is followed")
    if mode and not stat.S_ISREG(mode):
        raise Forbidden(f"{shown!r} exists and is not a regular file")
    temporary = f".{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        verify()
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError:
        _unlink(dir_fd, temporary)
        raise Forbidden(f"{shown!r} exists and is a folder") from None
    except BaseException:
        _unlink(dir_fd, temporary)
        raise
    os.fsync(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink(dir_fd: int, name: str) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def _save_manifest(folder_fd: int, manifest: dict[str, Any]) -> None:
    try:
        data = (json.dumps(manifest, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the manifest must be plain JSON data: {exc}") from None
    _replace_file(folder_fd, MANIFEST_NAME, data, MANIFEST_NAME, lambda: None, strict=False)
