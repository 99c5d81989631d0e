"""The parts of the user's repository a stage could change behind a run's back.

A run's worktrees are linked worktrees of the user's repository: they share its
config, its hooks, its `info/` files and its refs. A stage's program (an agent CLI, a
script) can therefore set `alias.st` or `core.hooksPath`, drop a hook in, or move the
user's branches, and the user's next `git` command would run what it left. The engine
takes a `RepoState` before a stage and one after, and puts back what changed.

Taking one is cheap enough to do twice a stage: on Linux a watch on the directories
(`fabro_git.store.dirwatch`) says what changed since the last look, and only that is
read again, so a look at an unchanged repository costs one read of the watch however
many refs it holds; elsewhere every file is looked at (a `stat` per loose ref and hook)
and read only when its stat data (inode, size, mtime) changed. Refs are read from the
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
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
from dulwich.config import ConfigFile

from fabro_git.store.dirwatch import DirWatch

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
    # The submodules' git dirs (`modules/<name>/`, nested too): their config files and
    # hooks, which the user's `git status` reads and runs as it recurses into them.
    modules: dict[str, Entry] = msgspec.field(default_factory=dict)


class StateReader:
    """Takes `RepoState`s of one repository, reading only the files that changed.

    On Linux a `DirWatch` on the git dir, `hooks/`, `info/` and every directory under
    `refs/` says what changed since the last look, and only that is read again: a look
    at an unchanged repository costs one read of the watch, however many refs it has.
    Elsewhere (or when the watch lost track) every file is looked at, and read again only
    when its stat data changed."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = Path(git_dir)
        self._top = os.fspath(git_dir)
        self._cache: dict[str, tuple[tuple[int, int, int, int, int], bytes]] = {}
        self._watch = DirWatch.open()
        self._last: RepoState | None = None
        # The refs as `packed-refs` and the loose ref files have them, by full name.
        self._packed: dict[str, str] = {}
        self._loose: dict[str, str] = {}
        # What a watch cannot vouch for, read at every look: symbolic links (their
        # target may change where nothing is watched).
        self._linked: set[str] = set()

    def take(self) -> RepoState:
        if self._watch is None:
            return self._scan()
        changes = self._watch.changes()
        if changes is None or self._last is None:
            return self._scan()
        if not changes and not self._linked:
            return self._last
        return self._apply(changes, self._last)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def _scan(self) -> RepoState:
        """Everything looked at (and watched first, where there is a watch)."""
        top = self._top
        self._linked = set()
        self._watch_dir(top)
        state = RepoState(
            config=self._file(os.path.join(top, "config")),
            worktree_config=self._file(os.path.join(top, "config.worktree")),
            hooks=self._tree(os.path.join(top, "hooks")),
            info=self._tree(os.path.join(top, "info"), skip=_DERIVED_INFO.match),
            refs=self._refs(),
            modules=self._modules(),
        )
        self._last = state
        return state

    def _apply(self, changes: set[tuple[str, str]], last: RepoState) -> RepoState:
        """`last` with what `changes` names read again."""
        areas, ref_files = self._sort(changes)
        if "everything" in areas:
            return self._scan()
        top = self._top
        refs = last.refs
        if "refs" in areas:
            refs = self._refs()
        elif ref_files or self._linked or "packed-refs" in areas:
            if "packed-refs" in areas:
                self._packed = self._packed_refs()
            for path in ref_files | self._linked:
                self._loose_ref(path, len(top) + 1)
            refs = {**self._packed, **self._loose}
        config, worktree_config = (os.path.join(top, n) for n in ("config", "config.worktree"))
        state = RepoState(
            config=self._file(config) if config in areas | self._linked else last.config,
            worktree_config=self._file(worktree_config)
            if worktree_config in areas | self._linked
            else last.worktree_config,
            hooks=self._tree(os.path.join(top, "hooks")) if "hooks" in areas else last.hooks,
            info=self._tree(os.path.join(top, "info"), skip=_DERIVED_INFO.match)
            if "info" in areas
            else last.info,
            refs=refs,
            modules=self._modules() if "modules" in areas else last.modules,
        )
        self._last = state
        return state

    def _sort(self, changes: set[tuple[str, str]]) -> tuple[set[str], set[str]]:
        """What `changes` touch: the areas to read again ("hooks", "info", "refs" whole,
        "packed-refs", a config file's path, or "everything"), and the loose ref files."""
        top = self._top
        areas: set[str] = set()
        ref_files: set[str] = set()
        for directory, name in changes:
            if directory == top:
                if name in ("config", "config.worktree"):
                    areas.add(os.path.join(top, name))
                elif name == "packed-refs":
                    areas.add(name)
                elif name in ("", "hooks", "info", "refs", "modules"):
                    areas.add("everything")  # a whole area came or went
                # Else a file of the git dir no state holds (the index, HEAD, ...).
            elif _under(directory, os.path.join(top, "hooks")):
                areas.add("hooks")
            elif _under(directory, os.path.join(top, "modules")):
                areas.add("modules")
            elif _under(directory, os.path.join(top, "info")):
                areas.add("info")
            elif _under(directory, self._refs_top):
                path = os.path.join(directory, name)
                if not name or (os.path.isdir(path) and not os.path.islink(path)):
                    areas.add("refs")  # a directory came or went: read them all
                elif not name.endswith(".lock"):
                    ref_files.add(path)
        return areas, ref_files

    def _watch_dir(self, directory: str) -> None:
        if self._watch is not None:
            self._watch.watch(directory)

    def _file(self, path: str) -> bytes | None:
        """A file of the git dir itself (config, `packed-refs`), read if it changed."""
        if os.path.islink(path):
            self._linked.add(path)
        return self._read(path)

    def _read(self, path: str, st: os.stat_result | None = None) -> bytes | None:
        try:
            st = st or os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        # The change time too: a stage can put the modification time back after writing
        # the same number of bytes in place (`touch -r`), never the change time.
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            # Without a file object: the first look reads every loose ref, thousands in
            # a repository with many tags.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except PermissionError:
            data = b""  # unreadable to us: its stat still tells of a change
        else:
            try:
                data = _read_all(fd, st.st_size)
            except IsADirectoryError:
                return None
            finally:
                os.close(fd)
        self._cache[path] = (stamp, data)
        return data

    def _tree(
        self, top: str, skip: Callable[[str], object] = lambda name: False
    ) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        pending = [top]
        cut = len(top) + 1
        for entries in self._listings(pending, lambda: len(found) < _MAX_FILES):
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

    def _listings(
        self, pending: list[str], more: Callable[[], bool] = lambda: True
    ) -> Iterator[list[os.DirEntry[str]]]:
        """The entries of each directory taken from `pending`, which is watched; the
        caller puts on `pending` the directories to go on into. Until `pending` is empty
        or `more()` is false; a directory that cannot be listed is passed over."""
        while pending and more():
            directory = pending.pop()
            self._watch_dir(directory)
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            yield entries

    def _modules(self) -> dict[str, Entry]:
        """The config files and hooks of every submodule git dir under `modules/` (a
        directory holding HEAD; one without it is a level of a name with slashes), by
        their path below `modules/`."""
        top = os.path.join(self._top, "modules")
        cut = len(top) + 1
        found: dict[str, Entry] = {}
        pending = [top]
        for entries in self._listings(pending, lambda: len(found) < _MAX_FILES):
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if not os.path.exists(os.path.join(entry.path, "HEAD")):
                    pending.append(entry.path)
                    continue
                name = entry.path[cut:]
                self._watch_dir(entry.path)
                for config in ("config", "config.worktree"):
                    path = os.path.join(entry.path, config)
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    data = self._read(path, st)
                    if data is not None:
                        found[f"{name}/{config}"] = ("file", st.st_mode & 0o777, data)
                for hook, value in self._tree(os.path.join(entry.path, "hooks")).items():
                    found[f"{name}/hooks/{hook}"] = value
                pending.append(os.path.join(entry.path, "modules"))
        return found

    def _refs(self) -> dict[str, str]:
        self._packed = self._packed_refs()
        self._loose = {}
        self._linked = {path for path in self._linked if not _under(path, self._refs_top)}
        pending = [self._refs_top]
        cut = len(self._top) + 1
        for entries in self._listings(pending):
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif not entry.name.endswith(".lock"):
                    self._loose_ref(entry.path, cut, entry)
        return {**self._packed, **self._loose}

    @property
    def _refs_top(self) -> str:
        return os.path.join(self._top, "refs")

    def _packed_refs(self) -> dict[str, str]:
        packed = self._file(os.path.join(self._top, "packed-refs"))
        refs: dict[str, str] = {}
        for line in (packed or b"").splitlines():
            if not line or line[:1] in (b"#", b"^"):
                continue
            sha, _, name = line.partition(b" ")
            refs[name.decode("utf-8", "surrogateescape")] = sha.decode()
        return refs

    def _loose_ref(self, path: str, cut: int, entry: os.DirEntry[str] | None = None) -> None:
        """Read the loose ref file at `path` into `_loose` (or out, when it is gone or
        empty: an empty file is one being written, not a ref yet). `entry`: the path's
        entry as the directory listed it, whose type and stat cost no more calls."""
        name = path[cut:]
        if entry.is_symlink() if entry is not None else os.path.islink(path):
            self._linked.add(path)
        else:
            self._linked.discard(path)
        try:
            data = self._read(path, entry.stat() if entry is not None else None)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            data = None
        value = data.strip().decode("utf-8", "replace") if data else ""
        if value:
            self._loose[name] = value
        else:
            self._loose.pop(name, None)


def _read_all(fd: int, size: int) -> bytes:
    """What is left to read of the regular file `fd`, `size` bytes expected (more if it
    grew): a read that returns less than it asked for has reached the end."""
    want = max(size + 1, 4096)
    chunks = []
    while True:
        chunk = os.read(fd, want)
        chunks.append(chunk)
        if len(chunk) < want:
            return b"".join(chunks)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


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


def of_known_modules(before: dict[str, Entry], after: dict[str, Entry]) -> dict[str, Entry]:
    """`after`'s entries of the submodules `before` had: one set up since (a stage
    that inits submodules in place) is new, not a change to what the user had."""
    known = {_module_of(name) for name in before}
    return {name: entry for name, entry in after.items() if _module_of(name) in known}


def _module_of(name: str) -> str:
    """The submodule an entry of `RepoState.modules` belongs to: `lib` of `lib/config`
    and of `lib/hooks/pre-commit`."""
    head, hooks, _rest = name.partition("/hooks/")
    return head if hooks else name.rsplit("/", 1)[0]


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
