"""The parts of the user's repository a stage could change behind a run's back.

A run's worktrees are linked worktrees of the user's repository: they share its
config, its hooks, its `info/` files and its refs. A stage's program (an agent CLI, a
script) can therefore set `alias.st` or `core.hooksPath`, drop a hook in, or move the
user's branches, and the user's next `git` command would run what it left. The engine
takes a `RepoState` before a stage and one after, and puts back what changed.

Taking one is cheap enough to do twice a stage: every file is read only when its stat
data (inode, size, mtime) differs from the last time this reader saw it, so a state
costs a handful of `stat` calls, one per loose ref and hook. Refs are read from the
files (`packed-refs` and the loose refs over it) as git lays them out; a `.lock` is
never a ref.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
from dulwich.config import ConfigFile

# What a file entry under hooks/ or info/ is: ("file", mode, bytes) or ("link", 0, target).
Entry = tuple[str, int, bytes]
_MAX_FILES = 2000
# What git itself rewrites in `info/` (`git gc` runs update-server-info, which writes
# `refs` through a temporary `refs_XXXXXX`): not the user's.
_DERIVED_INFO = re.compile(
    r"refs(_\w+)?$"
)  # a hooks/ or info/ tree bigger than this is read no deeper


class RepoState(msgspec.Struct, frozen=True):
    """The shared config files, hooks, `info/` files and refs, as they were at one time."""

    config: bytes | None
    worktree_config: bytes | None
    hooks: dict[str, Entry]
    info: dict[str, Entry]
    refs: dict[str, str]  # full name -> sha, or "ref: <target>" for a symbolic ref


class StateReader:
    """Takes `RepoState`s of one repository, reading only the files that changed."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = Path(git_dir)
        self._top = os.fspath(git_dir)
        self._cache: dict[str, tuple[tuple[int, int, int, int], bytes]] = {}

    def take(self) -> RepoState:
        top = self._top
        return RepoState(
            config=self._read(os.path.join(top, "config")),
            worktree_config=self._read(os.path.join(top, "config.worktree")),
            hooks=self._tree(os.path.join(top, "hooks")),
            info=self._tree(os.path.join(top, "info"), skip=_DERIVED_INFO.match),
            refs=self._refs(),
        )

    def _read(self, path: str, st: os.stat_result | None = None) -> bytes | None:
        try:
            st = st or os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except PermissionError:
            data = b""  # unreadable to us: its stat still tells of a change
        self._cache[path] = (stamp, data)
        return data

    def _tree(
        self, top: str, skip: Callable[[str], object] = lambda name: False
    ) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        pending = [top]
        cut = len(top) + 1
        while pending and len(found) < _MAX_FILES:
            directory = pending.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for entry in entries:
                name = entry.path[cut:]
                if skip(name):
                    continue
                if entry.is_symlink():
                    found[name] = ("link", 0, os.fsencode(os.readlink(entry.path)))
                elif entry.is_dir():
                    found[name + "/"] = ("dir", 0, b"")
                    pending.append(entry.path)
                else:
                    st = entry.stat()
                    data = self._read(entry.path, st)
                    if data is not None:
                        found[name] = ("file", st.st_mode & 0o777, data)
        return found

    def _refs(self) -> dict[str, str]:
        refs: dict[str, str] = {}
        packed = self._read(os.path.join(self._top, "packed-refs"))
        for line in (packed or b"").splitlines():
            if not line or line[:1] in (b"#", b"^"):
                continue
            sha, _, name = line.partition(b" ")
            refs[name.decode("utf-8", "surrogateescape")] = sha.decode()
        pending = [os.path.join(self._top, "refs")]
        cut = len(self._top) + 1
        while pending:
            directory = pending.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    continue
                if entry.name.endswith(".lock"):
                    continue
                try:
                    data = self._read(entry.path, entry.stat())
                except FileNotFoundError:
                    continue
                if data:
                    value = data.strip().decode("utf-8", "replace")
                    if value:  # an empty file is one being written: not a ref yet
                        refs[entry.path[cut:]] = value
        return refs


# -- what changed -----------------------------------------------------------------------


def config_changes(before: bytes | None, after: bytes | None) -> list[str]:
    """What changed between two versions of a git config file, by key:
    `alias.st added`, `core.hooksPath changed`, `user.email removed`."""
    if before == after:
        return []
    old, new = _config_values(before), _config_values(after)
    if old is None or new is None:
        return ["the file was rewritten so that git cannot read it"]
    changes: list[str] = []
    for key in dict.fromkeys([*old, *new]):
        if key not in new:
            changes.append(f"{old[key][0]} removed")
        elif key not in old:
            changes.append(f"{new[key][0]} added")
        elif old[key][1] != new[key][1]:
            changes.append(f"{new[key][0]} changed")
    return changes or ["its layout changed (same settings)"]


def _config_values(data: bytes | None) -> dict[str, tuple[str, list[bytes]]] | None:
    """{lowercased key: (key as written, its values)}; None when it does not parse."""
    if data is None:
        return {}
    try:
        config = ConfigFile.from_file(io.BytesIO(data))
    except Exception:  # dulwich raises ValueError and others on malformed files
        return None
    values: dict[str, tuple[str, list[bytes]]] = {}
    for section in config.sections():
        for name, value in config.items(section):
            parts = [part.decode("utf-8", "replace") for part in (*section, name)]
            shown = ".".join(parts)
            # Section and variable names are case-insensitive; a subsection is not.
            folded = ".".join(
                part if 0 < i < len(parts) - 1 else part.lower() for i, part in enumerate(parts)
            )
            values.setdefault(folded, (shown, []))[1].append(value)
    return values


def tree_changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """The paths added, changed or removed between two `hooks/`-like trees."""
    changes: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        what = "added" if old is None else "removed" if new is None else "changed"
        changes.append(f"{name.rstrip('/')} {what}")
    return changes


# -- putting back -----------------------------------------------------------------------


def put_back_file(path: Path, data: bytes | None) -> None:
    """Make `path` hold `data` again (None: not exist), renamed into place whole."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    mode = 0o644
    with contextlib.suppress(OSError):
        mode = path.stat().st_mode & 0o777
    tmp = path.with_name(f".{path.name}.fabro-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def put_back_tree(top: Path, before: dict[str, Entry], after: dict[str, Entry]) -> None:
    """Make the tree at `top` (hooks/, info/) what `before` says again."""
    for name in sorted(set(after) - set(before), reverse=True):
        path = top / name.rstrip("/")
        if after[name][0] == "dir":
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                path.unlink()
    for name in sorted(before):
        kind, mode, data = before[name]
        if after.get(name) == before[name]:
            continue
        path = top / name.rstrip("/")
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or (path.exists() and path.is_dir()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if kind == "link":
            os.symlink(os.fsdecode(data), path)
        else:
            put_back_file(path, data)
            os.chmod(path, mode)


def remote_push_urls(config: bytes | None) -> tuple[list[str], list[str]]:
    """The `url`s of the config's remotes that have no `pushurl`, and the `pushurl`s."""
    urls, pushurls = _push_urls(config or b"")
    return list(urls), list(pushurls)


@functools.lru_cache(maxsize=8)
def _push_urls(config: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`remote_push_urls`, parsed once for each version of the config (every command
    stage's environment asks, and the config seldom changes within a run)."""
    urls: list[str] = []
    pushurls: list[str] = []
    try:
        parsed = ConfigFile.from_file(io.BytesIO(config))
    except Exception:  # an unreadable config: git would refuse to push anyway
        return (), ()
    for section in parsed.sections():
        if len(section) != 2 or section[0].lower() != b"remote":
            continue
        own_push = [v.decode("utf-8", "replace") for v in parsed.get_multivar(section, "pushurl")]
        if own_push:
            pushurls += own_push
        else:
            urls += [v.decode("utf-8", "replace") for v in parsed.get_multivar(section, "url")]
    return tuple(urls), tuple(pushurls)
