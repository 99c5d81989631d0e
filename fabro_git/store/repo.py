"""The repository as fabro's database: objects and refs through dulwich.

Everything durable a run produces is a git object, and every change of state is a ref
moving. Refs move only by compare-and-swap against the value the caller last saw, and
each move leaves a reflog line, so `git reflog show refs/fabro/meta/<id>` tells the
run's story and a lost race surfaces as `RefRaceError` instead of a silent overwrite.

Objects are written as loose objects by `store.loose`, without dulwich's lock files.

Discovery uses `git rev-parse` once, so GIT_CEILING_DIRECTORIES, safe.directory and
gitdir files mean what they mean to git. Inside one of our own run worktrees it
resolves to the main working tree, so `git fabro ps` behaves the same there.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import msgspec
from dulwich.errors import NotGitRepository
from dulwich.file import FileLocked, SharedPerm
from dulwich.graph import can_fast_forward
from dulwich.objects import Blob, Commit, ObjectID, ShaFile, Tree, valid_hexsha
from dulwich.refs import DiskRefsContainer, Ref, check_ref_format
from dulwich.repo import Repo, UnsupportedExtension, UnsupportedVersion, parse_shared_repository

from fabro_git.errors import MissingObject, RefRaceError, RepositoryError, StoreError, disk_full_in
from fabro_git.store import blobs
from fabro_git.store._gitcli import config_entries, git_failure, lines_of, out, run_git, start_git
from fabro_git.store.asked_early import DISCOVER_ARGS, SETTINGS_ARGS, STATUS_ARGS, EarlyAnswers
from fabro_git.store.backoff import DEADLINE_SECONDS, SYSTEM_CLOCK, Clock, retrying
from fabro_git.store.commit_count import commits_between
from fabro_git.store.durability import durability
from fabro_git.store.identity import Identities, Identity
from fabro_git.store.loose import LooseObjects
from fabro_git.store.refwrite import swap_ref
from fabro_git.store.tree_diff import TreeDiffs

if TYPE_CHECKING:
    from fabro_git.redact import StreamMasker

# The run branches' ref prefix, named with the rest of the layout by `store/runs.py`,
# which builds on this module: defined here because discovering a repository tells a
# run's worktree by its branch.
RUN_BRANCH_PREFIX = "refs/heads/fabro/run/"
_TRAILER_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*)$")


class HeadInfo(msgspec.Struct, frozen=True):
    sha: str | None
    branch: str | None  # short name such as "main"; None when HEAD is detached


class CommitInfo(msgspec.Struct, frozen=True):
    sha: str
    tree: str
    parents: tuple[str, ...]
    subject: str
    message: str
    trailers: dict[str, str]
    author_time: int
    commit_time: int


class GitRepo:
    """A non-bare git repository, opened at its common git dir."""

    def __init__(
        self, root: Path, git_dir: Path, head_dir: Path, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.root = root
        # What a ref move held up by another git's lock waits on (`store.backoff`).
        self.clock = clock
        self.git_dir = git_dir
        try:
            self._repo = Repo(controldir=str(head_dir), commondir=str(git_dir), worktree=str(root))
        except (NotGitRepository, UnsupportedExtension, UnsupportedVersion) as err:
            raise RepositoryError(
                f"git fabro cannot use the repository at {root}: {err}",
                hint="repositories with reftable refs or newer format extensions "
                "are not supported yet",
            ) from err
        if self._repo.object_format.name != "sha1":
            self._repo.close()
            raise RepositoryError(
                f"{root} uses {self._repo.object_format.name} object ids; "
                "git fabro supports sha1 repositories only"
            )
        self.objects = LooseObjects(root, git_dir / "objects", self._repo.object_store)
        # git's answers asked before this object was made (`discover`).
        self._early: EarlyAnswers | None = None
        # Refs whose directories (and their reflogs') `update_ref` has made or found.
        self._ref_dirs_made: set[str] = set()
        # The packs dulwich opened are closed with this object, if `close` was not called
        # (a web request's repository, a reader's): their files are not held for long.
        self._closing = weakref.finalize(self, self._repo.close)

    @functools.cached_property
    def _shared_perm(self) -> SharedPerm | None:
        """`core.sharedRepository`, read once: the permissions new reflogs get."""
        try:
            value = self._repo.get_config().get(("core",), "sharedRepository")
        except KeyError:
            return None
        return parse_shared_repository(value)

    @functools.cached_property
    def ref_lock_deadline(self) -> float:
        """How long a ref move waits out another git's lock on it, read once: git's own
        `core.filesRefLockTimeout` (milliseconds; negative: for ever) when it is set,
        else the store's default, longer than git's 100 ms (`store.backoff`)."""
        try:
            value = self._repo.get_config_stack().get(("core",), "filesRefLockTimeout")
            millis = int(value)
        except (KeyError, ValueError):
            return DEADLINE_SECONDS
        return float("inf") if millis < 0 else millis / 1000

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def discover(
        cls,
        path: Path | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        early: EarlyAnswers | None = None,
    ) -> GitRepo:
        """The repository `path` (the current directory) is in. `early` holds git's
        answers asked as the command started (`fabro_git.store.asked_early`), taken
        when they are of `path`."""
        start = Path(path) if path is not None else Path.cwd()
        if not start.is_dir():
            raise RepositoryError(f"{start} is not a directory")
        if early is not None and early.cwd != start:
            early = None
        waiting = early.take("discovery") if early is not None else None
        proc = waiting() if waiting is not None else run_git(DISCOVER_ARGS, cwd=start, check=False)
        lines = lines_of(out(proc))
        if len(lines) < 4:
            detail = proc.stderr.decode("utf-8", "replace").strip()
            if "not a git repository" in detail or not detail:
                raise RepositoryError(
                    f"{start} is not inside a git repository; run git init or cd into a repository"
                )
            raise RepositoryError(f"git cannot open the repository at {start}: {detail}")
        git_dir, common_dir = Path(lines[0]), Path(lines[1])
        if lines[2] == "true":
            raise RepositoryError(
                f"{common_dir} is a bare repository; runs need a working tree",
                hint=f"clone it ({shlex.join(['git', 'clone', str(common_dir)])} <dir>) and run git fabro "
                "in the clone",
            )
        if lines[3] != "true" or len(lines) < 5:
            raise RepositoryError(
                f"{start} is inside the git directory, not the working tree",
                hint="cd into the repository's working tree",
            )
        toplevel = Path(lines[4])
        if git_dir != common_dir and _is_run_worktree(git_dir, toplevel):
            main = _main_worktree(common_dir)
            if main is not None:
                return cls(main, common_dir, common_dir, clock=clock)
        repo = cls(toplevel, common_dir, git_dir, clock=clock)
        repo._early = early  # of this very repository
        return repo

    def close(self) -> None:
        self._closing()

    def __enter__(self) -> GitRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HEAD and the working tree ---------------------------------------------------

    def head(self) -> HeadInfo:
        names, sha = self._repo.refs.follow(Ref(b"HEAD"))
        branch: str | None = None
        if len(names) > 1 and names[-1].startswith(b"refs/heads/"):
            branch = names[-1][len(b"refs/heads/") :].decode()
        return HeadInfo(sha=sha.decode() if sha else None, branch=branch)

    def require_base(self) -> HeadInfo:
        info = self.head()
        if info.sha is None:
            raise RepositoryError(
                f"the repository at {self.root} has no commits yet; a run starts from a commit",
                hint='make a first commit (git commit --allow-empty -m "initial") and try again',
            )
        if info.branch is None:
            raise RepositoryError(
                f"HEAD is detached at {info.sha[:12]} in {self.root}; a run needs a base branch",
                hint="check out a branch (git switch <branch>) and try again",
            )
        return info

    def uncommitted_changes(self) -> list[str]:
        return self.uncommitted_changes_later()()

    def uncommitted_changes_later(self) -> Callable[[], list[str]]:
        """`uncommitted_changes`, asked of git now (or as the command started) and
        answered when called (once)."""
        args = list(STATUS_ARGS)
        wait = self._early.take("status") if self._early is not None else None
        wait = wait or start_git(args, cwd=self.root)

        def answer() -> list[str]:
            proc = wait()
            if proc.returncode != 0:
                raise git_failure(args, self.root, proc)
            return [line for line in lines_of(out(proc)) if line]

        return answer

    def origin_url(self, remote: str = "origin") -> str | None:
        return self.origin_url_later(remote)()

    def origin_url_later(self, remote: str = "origin") -> Callable[[], str | None]:
        """`origin_url`, asked of git now and answered when called (once)."""
        wait = start_git(["config", "--get", f"remote.{remote}.url"], cwd=self.root)
        return lambda: out(wait()).strip() or None

    def settings_later(self) -> Callable[[], dict[str, str]]:
        """The repository's whole configuration (`git config --list`, as
        `_gitcli.config_entries` gives it), asked of git now and answered when called
        (as often as wanted): one git process for several questions, asked now (or as
        the command started)."""
        early = self._early.take("settings") if self._early is not None else None
        wait = early or start_git(SETTINGS_ARGS, cwd=self.root)
        return functools.cache(lambda: config_entries(wait()))

    @staticmethod
    def origin_url_in(settings: Mapping[str, str], remote: str = "origin") -> str | None:
        """`origin_url`, from `settings_later`'s answer."""
        return settings.get(f"remote.{remote}.url", "").strip() or None

    # -- refs ------------------------------------------------------------------------

    def read_ref(self, name: str) -> str | None:
        try:
            _, sha = self._repo.refs.follow(Ref(name.encode()))
        except KeyError:
            return None
        return sha.decode() if sha else None

    def list_refs(self, prefix: str) -> dict[str, str]:
        base = prefix.rstrip("/")
        found = self._repo.refs.as_dict(Ref(base.encode()))
        return {f"{base}/{k.decode()}": v.decode() for k, v in sorted(found.items())}

    def update_ref(self, name: str, new: str, *, old: str | None, message: str) -> None:
        """Move `name` from `old` to `new` atomically; old=None means it must not exist yet."""
        ref = _checked_ref(name)
        if not valid_hexsha(new):
            raise StoreError(f"cannot point {name} at {new!r}: not an object id")
        self.objects.flush()  # what the ref will lead to is on disk first
        ident = self.committer()
        refs = self._repo.refs
        assert isinstance(refs, DiskRefsContainer)
        flush = durability(self.root).refs
        log_dir = (self.git_dir / "logs" / name).parent

        def swap(make_dirs: bool) -> bool:
            if make_dirs:
                try:
                    # dulwich creates missing reflog directories one mkdir at a time and
                    # fails if another process creates one first; make them up front.
                    log_dir.mkdir(parents=True, exist_ok=True)
                except (FileExistsError, NotADirectoryError):
                    conflict = self.conflicting_ref(name)
                    if conflict is not None:
                        raise ref_conflict_error(name, conflict) from None
                    raise
            return swap_ref(
                refs,
                ref,
                None if old is None else ObjectID(old.encode()),
                ObjectID(new.encode()),
                fsync=flush,
                logs=self.git_dir / "logs",
                shared=self._shared_perm,
                committer=ident.raw,
                timestamp=ident.time,
                timezone=ident.tz_offset,
                message=_one_line(message),
                make_dirs=make_dirs,
            )

        def attempt() -> bool:
            # A run moves its two refs at every stage: their directories are made once,
            # and again only when one has gone (`git pack-refs` removes emptied ones).
            if name in self._ref_dirs_made:
                try:
                    return swap(make_dirs=False)
                except FileNotFoundError:
                    self._ref_dirs_made.discard(name)
            result = swap(make_dirs=True)
            self._ref_dirs_made.add(name)
            return result

        with self._ref_errors(name, "updated"):
            ok = retrying(
                attempt,
                transient=_held_lock_or_dir_race,
                deadline=self.ref_lock_deadline,
                clock=self.clock,
            )
        if not ok:
            raise self._race(name, expected=old)

    def delete_ref(self, name: str, *, old: str, message: str) -> None:
        """Delete `name` if it still points at `old`. Like git, this drops its reflog too."""
        ref = _checked_ref(name)
        with self._ref_errors(name, "deleted"):
            ok = retrying(
                lambda: self._repo.refs.remove_if_equals(ref, ObjectID(old.encode())),
                transient=_held_lock_or_dir_race,
                deadline=self.ref_lock_deadline,
                clock=self.clock,
            )
        if not ok:
            raise self._race(name, expected=old)
        # `message` has nowhere to go: git removes a ref's reflog with the ref, and a
        # leftover log file would shadow a later ref of the same name.
        del message
        log = self.git_dir / "logs" / name
        with contextlib.suppress(FileNotFoundError):
            log.unlink()
        for parent in log.parents:
            if parent == self.git_dir / "logs" / "refs":
                break
            try:
                parent.rmdir()
            except OSError:
                break

    @contextlib.contextmanager
    def _ref_errors(self, name: str, done: str) -> Iterator[None]:
        """Turn what is left after the retries into errors that say what to do."""
        try:
            yield
        except FileLocked as err:
            lock = self.git_dir / f"{name}.lock"
            raise RefRaceError(
                f"{name} stayed locked by another process for {self.ref_lock_deadline:g}s; "
                f"it was not {done}",
                hint=f"if no git command is running in {self.root}, a crashed one left "
                f"{lock} behind: delete that file and retry",
            ) from err
        except (NotADirectoryError, FileExistsError) as err:
            conflict = self.conflicting_ref(name)
            if conflict is None:
                raise StoreError(f"cannot update {name}: {err}") from err
            raise ref_conflict_error(name, conflict) from err
        except OSError as err:
            raise (disk_full_in(err) or StoreError(f"cannot update {name}: {err}")) from err

    def conflicting_ref(self, name: str) -> str | None:
        """An existing ref whose name is a directory of `name` (git cannot hold both
        `refs/heads/a` and `refs/heads/a/b`), loose or packed; None if there is none."""
        parts = name.split("/")
        for end in range(2, len(parts)):
            prefix = "/".join(parts[:end])
            if prefix in ("refs", "refs/heads", "refs/tags", "refs/remotes"):
                continue
            if (self.git_dir / prefix).is_file():
                return prefix
            if prefix.encode() in self._repo.refs.get_packed_refs():
                return prefix
        return None

    def _race(self, name: str, *, expected: str | None) -> RefRaceError:
        current = self.read_ref(name)
        want = expected[:12] if expected else "no ref"
        have = current[:12] if current else "no ref"
        return RefRaceError(
            f"{name} moved underneath us: expected {want}, found {have}; nothing was overwritten",
            hint="another process is writing this run; stop it or retry once it has finished",
        )

    # -- reading objects -------------------------------------------------------------

    def commit_info(self, sha: str) -> CommitInfo:
        commit = self._commit(sha)
        message = commit.message.decode("utf-8", "replace")
        return CommitInfo(
            sha=commit.id.decode(),
            tree=commit.tree.decode(),
            parents=tuple(p.decode() for p in commit.parents),
            subject=message.split("\n", 1)[0].strip(),
            message=message,
            trailers=parse_trailers(message),
            author_time=commit.author_time,
            commit_time=commit.commit_time,
        )

    def read_file(
        self, commit: str, path: str, *, limit: int = blobs.FILE_MAX_BYTES
    ) -> bytes | None:
        """The bytes of the file at `path` in `commit` (None when it is not a file there);
        one bigger than `limit` is refused unread (`check_blob`)."""
        sha = self._file_entry(commit, path)
        if sha is None:
            return None
        self.check_blob(sha, path=path, limit=limit, missing_ok=True)
        blob = self._object(sha, "blob")
        return blob.as_raw_string() if isinstance(blob, Blob) else None

    def file_size(self, commit: str, path: str) -> int | None:
        """The size of the file at `path` in `commit`, without reading it; None when it
        is not a file there."""
        sha = self._file_entry(commit, path)
        if sha is None:
            return None
        held = self.objects.held(sha)
        if held is not None:
            return len(held[1])
        found = blobs.blob_size(sha, self._repo.object_store, self.root)
        if found is None:
            raise MissingObject(f"blob {sha} ({path}) is missing from {self.git_dir}")
        return found.size

    def copy_file(self, commit: str, path: str, out: BinaryIO) -> bool:
        """Write the file at `path` in `commit` to the open file `out`, streamed from git
        in bounded memory (a command's whole output can be hundreds of megabytes); False
        when it is not a file there."""
        sha = self._file_entry(commit, path)
        if sha is not None:
            blobs.copy_blob(self.root, sha, out, f"{path} of {commit[:12]}")
        return sha is not None

    def read_file_ends(self, commit: str, path: str, keep: int) -> tuple[bytes, bytes] | None:
        """The first and last `keep` bytes of a file too large to read whole (a command's
        500 MB output), streamed from git in bounded memory; None when it is no file."""
        sha = self._file_entry(commit, path)
        return None if sha is None else blobs.blob_ends(self.root, sha, keep)

    def _file_entry(self, commit: str, path: str) -> str | None:
        """The blob id of the file at `path` in `commit`; None when it is no file there."""
        entry = self._lookup(commit, path)
        if entry is None or entry[0] & 0o170000 == 0o040000 or entry[0] == 0o160000:
            return None
        return entry[1].decode()

    def check_blob(self, sha: str, *, path: str, limit: int, missing_ok: bool = False) -> None:
        """Refuse blob `sha` unread (`BlobTooLarge`, naming it by `path`) when its header
        says it is bigger than `limit` (a loose file, that it is the size it says);
        MissingObject when git does not have it, unless `missing_ok`. An object this
        process holds is its own, and in memory already."""
        if not valid_hexsha(sha) or self.objects.held(sha) is not None:
            return
        found = blobs.blob_size(sha, self._repo.object_store, self.root, whole=limit)
        if found is None and not missing_ok:
            raise MissingObject(f"blob {sha} ({path}) is missing from {self.git_dir}")
        blobs.check_size(sha, path, found, limit)

    def list_dir(self, commit: str, path: str) -> list[str] | None:
        entries = self.dir_entries(commit, path)
        return None if entries is None else sorted(entries)

    def dir_entries(self, commit: str, path: str) -> dict[str, tuple[int, str]] | None:
        """The entries of the directory `path` of `commit`: name -> (mode, object id);
        None when it is not a directory there. A caller reading many files of one
        directory reads them by id (`read_blob`) instead of walking to each again."""
        entry = self._lookup(commit, path)
        if entry is None or entry[0] & 0o170000 != 0o040000:
            return None
        tree = self.tree(entry[1].decode())
        return {
            e.path.decode("utf-8", "surrogateescape"): (e.mode, e.sha.decode())
            for e in tree.iteritems()
        }

    def read_blob(
        self, sha: str, *, limit: int = blobs.FILE_MAX_BYTES, path: str | None = None
    ) -> bytes:
        """The bytes of blob `sha` (MissingObject when git does not have it); one bigger
        than `limit` is refused unread (`check_blob`, naming it by `path`)."""
        self.check_blob(sha, path=path or f"blob {sha}", limit=limit, missing_ok=True)
        blob = self._object(sha, "blob")
        if not isinstance(blob, Blob):
            raise StoreError(f"{sha} is a {blob.type_name.decode()}, not a blob")
        return blob.as_raw_string()

    def list_files(self, commit: str, path: str) -> list[tuple[str, int]]:
        """Every file under the directory `path` of `commit` (`""`: the whole tree),
        recursively: its path below `path` and its size, without reading the blobs.
        Empty when there is no such directory."""
        inside = path.strip("/")
        if inside and self.list_dir(commit, inside) is None:
            return []
        spec = ["--", inside] if inside else []
        args = ["ls-tree", "-r", "-l", "-z", commit, *spec]
        proc = run_git(args, cwd=self.root, check=False)
        if proc.returncode != 0:
            detail = proc.stderr.decode("utf-8", "replace").strip()
            if "not a tree object" in detail or "bad tree" in detail or "bad object" in detail:
                raise MissingObject(f"a tree of {commit} is missing from {self.git_dir}: {detail}")
            raise git_failure(args, self.root, proc)
        prefix = inside + "/" if inside else ""
        found: list[tuple[str, int]] = []
        for line in proc.stdout.split(b"\0"):
            header, tab, name = line.partition(b"\t")
            fields = header.split()
            if not tab or len(fields) != 4 or fields[1] != b"blob":
                continue
            relpath = name.decode("utf-8", "surrogateescape").removeprefix(prefix)
            if not fields[3].isdigit():
                # git prints BAD for the size of a blob it does not have.
                raise MissingObject(
                    f"blob {fields[2].decode()} ({relpath}) is missing from {self.git_dir}"
                )
            found.append((relpath, int(fields[3])))
        return found

    def iter_log(self, sha: str) -> Iterator[CommitInfo]:
        next_sha: str | None = sha
        while next_sha is not None:
            info = self.commit_info(next_sha)
            yield info
            next_sha = info.parents[0] if info.parents else None

    @functools.cached_property
    def _diffs(self) -> TreeDiffs:
        return TreeDiffs(lambda sha: self._object(sha, "object"), self.tree_body)

    def small_tree_diff(self, old_tree: str, new_tree: str, *, max_bytes: int) -> str | None:
        """See `TreeDiffs.small_diff`."""
        return self._diffs.small_diff(old_tree, new_tree, max_bytes=max_bytes)

    def changed_paths(self, old_tree: str, new_tree: str, *, limit: int) -> list[str]:
        """See `TreeDiffs.changed_paths`."""
        return self._diffs.changed_paths(old_tree, new_tree, limit=limit)

    def change_summary(self, base: str, tip: str) -> tuple[int, int]:
        """(commits, files changed) from `base` to `tip`, as `git log`/`git diff` count."""
        commits = commits_between(
            self.git_dir,
            base,
            tip,
            parents=lambda sha: self._commit(sha).parents,
            has_replace_refs=lambda: bool(self.list_refs("refs/replace")),
        )
        args = ["rev-list", "--count", f"{base}..{tip}"]
        # Else git counts, while the files are diffed.
        counting = start_git(args, cwd=self.root) if commits is None else None
        try:
            # The files in process: the two trees are in this repository's objects, and
            # only the subtrees that differ are read.
            old, new = self._commit(base).tree.decode(), self._commit(tip).tree.decode()
            files = len(self.changed_paths(old, new, limit=sys.maxsize)) if old != new else 0
        finally:
            proc = counting() if counting is not None else None
        if proc is None:
            assert commits is not None
            return commits, files
        if proc.returncode != 0:
            raise git_failure(args, self.root, proc)
        return int(out(proc).strip() or 0), files

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        a = self._commit(ancestor).id
        d = self._commit(descendant).id
        try:
            return bool(can_fast_forward(self._repo, a, d))
        except KeyError as err:
            raise MissingObject(
                f"the history between {ancestor[:12]} and {descendant[:12]} is incomplete: "
                f"commit {err.args[0]!r} is missing from {self.git_dir}"
            ) from err

    def tree_body(self, sha: str) -> bytes:
        """The serialised entries of tree `sha`, as git stores them (no `Tree` built).
        A tree this process wrote is taken from the bytes it still holds, not read back."""
        held = self.objects.held(sha) or self.objects.read_loose(sha)
        if held is not None and held[0] == b"tree":
            return held[1]
        store = self._repo.object_store
        try:
            kind, raw = store.get_raw(ObjectID(sha.encode()))
        except KeyError:
            self.tree(sha)  # a repack may have moved it; else MissingObject says so
            kind, raw = store.get_raw(ObjectID(sha.encode()))
        if kind != Tree.type_num:
            raise StoreError(f"{sha} is not a tree")
        return raw

    def tree(self, sha: str) -> Tree:
        """The parsed tree object `sha` (store-internal: dulwich types stay in `store`)."""
        obj = self._object(sha, "tree")
        if not isinstance(obj, Tree):
            raise StoreError(f"{sha} is a {obj.type_name.decode()}, not a tree")
        return obj

    def _commit(self, rev: str) -> Commit:
        sha = rev if valid_hexsha(rev) else self.read_ref(rev)
        if sha is None:
            raise StoreError(f"{rev} is neither a commit id nor an existing ref")
        obj = self._object(sha, "commit")
        if not isinstance(obj, Commit):
            raise StoreError(f"{sha} is a {obj.type_name.decode()}, not a commit")
        return obj

    def _object(self, sha: str, kind: str) -> ShaFile:
        if not valid_hexsha(sha):  # say, a ref file's content: dulwich asserts on it
            raise StoreError(f"{sha[:80]!r} is not an object id (40 hex digits)")
        found = self.objects.read(sha)  # held bytes or its loose file, before the packs
        if found is not None:
            return found
        store = self._repo.object_store
        # Looked for twice: a `git repack` may move it from a loose file into a pack
        # between the places dulwich looks.
        for _ in range(2):
            with (
                contextlib.suppress(KeyError, ValueError),
                blobs.damaged_as_error(sha, self.git_dir),
            ):
                return store[ObjectID(sha.encode())]
        raise MissingObject(f"{kind} {sha} is missing from {self.git_dir}")

    def _lookup(self, commit: str, path: str) -> tuple[int, ObjectID] | None:
        mode, sha = 0o040000, self._commit(commit).tree
        for part in (p for p in path.strip("/").split("/") if p and p != "."):
            if mode & 0o170000 != 0o040000:
                return None
            try:
                mode, sha = self.tree(sha.decode())[part.encode("utf-8", "surrogateescape")]
            except KeyError:
                return None
        return mode, sha

    # -- identity --------------------------------------------------------------------

    @functools.cached_property
    def identities(self) -> Identities:
        return Identities(self._repo.get_config_stack)

    def author(self) -> Identity:
        return self.identities.author()

    def committer(self) -> Identity:
        return self.identities.committer()

    def override_author(self, name: str | None, email: str | None) -> None:
        """See `Identities.override_author`."""
        self.identities.override_author(name, email)

    # -- writing objects -------------------------------------------------------------

    def write_commit(
        self,
        *,
        tree: str,
        parents: list[str],
        message: str,
        timestamp: int | None = None,
    ) -> str:
        """Create a commit object (no ref moves). `timestamp` pins both dates, for replays."""
        author, committer = self.author(), self.committer()
        commit = Commit()
        commit.tree = ObjectID(tree.encode())
        commit.parents = [ObjectID(p.encode()) for p in parents]
        commit.author = author.raw
        commit.committer = committer.raw
        commit.author_time = author.time if timestamp is None else timestamp
        commit.commit_time = committer.time if timestamp is None else timestamp
        commit.author_timezone = author.tz_offset
        commit.commit_timezone = committer.tz_offset
        commit.message = (message.rstrip("\n") + "\n").encode()
        return self.store_object(commit)

    def store_object(self, obj: ShaFile) -> str:
        """Write `obj` as a loose object unless packed; safe against concurrent writers."""
        return self.objects.store_object(obj)

    def store_raw(self, type_name: bytes, raw: bytes) -> str:
        """Write an object given as its serialised body (`raw`, say a tree's entries)."""
        return self.objects.store_raw(type_name, raw)

    def store_blob(self, data: bytes) -> str:
        """Write `data` as a blob."""
        return self.objects.store_blob(data)

    def store_file(self, path: Path, masker: StreamMasker[bytes]) -> tuple[str, int]:
        """Write the file at `path` as a blob, through `masker` (secrets out), a bounded
        chunk at a time; its id and size."""
        return self.objects.store_file(path, masker)

    def consolidate_packs(self) -> None:
        """Merge the packs this process's checkpoints wrote into one
        (`LooseObjects.consolidate`)."""
        self.objects.consolidate()

    def note_written(self, sha: str) -> None:
        """Count `sha` (say, a tree git wrote for us) among the objects `missing_written`
        checks."""
        self.objects.note_written(sha)

    def missing_written(self, also: Iterable[str] = ()) -> list[str]:
        """The objects this process wrote (and `also`) that git does not have now, after
        writing again those whose bytes are still held (`LooseObjects.missing_written`)."""
        return self.objects.missing_written(also)


# -- helpers -------------------------------------------------------------------------


def parse_trailers(message: str) -> dict[str, str]:
    """`Key: value` lines of the message's last paragraph, when that whole paragraph is
    trailers (continuation lines start with whitespace). The subject is never one."""
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", message.strip("\n")) if p.strip()]
    if len(paragraphs) < 2:
        return {}
    trailers: dict[str, str] = {}
    last: str | None = None
    for line in lines_of(paragraphs[-1]):  # as git reads them: at "\n" alone
        if line[:1] in (" ", "\t") and last is not None:
            trailers[last] += " " + line.strip()
            continue
        match = _TRAILER_RE.match(line)
        if match is None:
            return {}
        last = match.group(1)
        trailers[last] = match.group(2).strip()
    return trailers


def _checked_ref(name: str) -> Ref:
    if not name.startswith("refs/") or not check_ref_format(Ref(name[5:].encode())):
        raise StoreError(f"{name!r} is not a valid full ref name (refs/...)")
    return Ref(name.encode())


def _held_lock_or_dir_race(err: Exception) -> bool:
    """A ref lock held by another git process, or a reflog directory that a concurrent
    ref deletion removed (or created) while we were making it: wait and try again.
    A lost compare-and-swap is not an exception at all, so it is never retried."""
    return isinstance(err, FileLocked | FileNotFoundError | FileExistsError)


def ref_conflict_error(name: str, conflict: str) -> RepositoryError:
    """A ref `conflict` stands where `name` needs a directory; git can hold only one."""
    if conflict.startswith("refs/heads/"):
        short = conflict.removeprefix("refs/heads/")
        return RepositoryError(
            f"your branch {short!r} is in the way: git fabro needs the branch "
            f"{name.removeprefix('refs/heads/')}, and git cannot hold a branch {short} "
            f"and branches beneath {short}/ at once; nothing was created",
            hint=f"rename your branch ({shlex.join(['git', 'branch', '-m', short])} <new-name>) and "
            "try again",
        )
    return RepositoryError(
        f"the ref {conflict} is in the way: git fabro needs {name}, and git cannot hold "
        f"both; nothing was created",
        hint=f"rename or delete {conflict} ({shlex.join(['git', 'update-ref', '-d', conflict])}) "
        "and try again",
    )


def _one_line(message: str) -> bytes:
    return " ".join(message.split()).encode()


def _is_run_worktree(worktree_git_dir: Path, toplevel: Path) -> bool:
    """One of ours: on a run branch, or living under fabro's scratch directory."""
    try:
        head = (worktree_git_dir / "HEAD").read_text().strip()
    except OSError:
        head = ""
    if head.startswith("ref: " + RUN_BRANCH_PREFIX):
        return True
    from fabro_git.config.locations import runs_dir

    try:
        toplevel.resolve().relative_to(runs_dir().resolve())
    except ValueError:
        return False
    return True


def _main_worktree(common_dir: Path) -> Path | None:
    proc = run_git(["worktree", "list", "--porcelain"], cwd=common_dir, check=False)
    lines = lines_of(out(proc))
    if not lines or not lines[0].startswith("worktree "):
        return None
    if len(lines) > 1 and lines[1] == "bare":
        return None
    return Path(lines[0][len("worktree ") :])
