"""Removing runs, and what runs leave on disk, for `rm` and `prune`.

A run is its refs; everything else it has here (worktree registrations, the scratch
dir, lock files) is derived from them and disposable. A removal takes the run's lock
first, so a live run is refused and nothing can start the run meanwhile; then it kills
what the run's process records still name (a run killed with -9 leaves its stage
commands to its watcher, which may not be done, or gone too), then it removes the
worktrees, then the refs by compare-and-swap with the meta ref last, then the scratch
dir and the lock files. A removal cut short leaves the run listed (its meta
ref goes last), so running the command again finishes it.

Every check is made for every run before anything is deleted: a refused run stops the
whole command, not half of it.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.cli._runs import RunRow
from fabro_git.config.locations import repo_key, run_scratch_dir, runs_dir
from fabro_git.errors import FabroError, RunLocked

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo

_ULID_LEN = 26
# A scratch dir is made just before its run takes its lock and writes its first ref:
# one younger than this may belong to a run being created right now.
ORPHAN_GRACE_SECONDS = 60


class RunLive(FabroError):
    """The run is being executed: it cannot be removed."""


@dataclass
class Removal:
    """Everything one run owns in this repository and on this machine."""

    run_id: str
    row: RunRow | None
    refs: dict[str, str]
    worktrees: list[Path]
    scratch: Path | None
    lock_files: list[Path]
    checked_out: list[Path] = field(default_factory=list)  # the user's checkouts of its branch

    def lines(self) -> list[str]:
        row = self.row
        about = (
            f" ({row.workflow}, {row.status}, started {row.started[:19].replace('T', ' ')})"
            if row is not None
            else ""
        )
        shown = [f"run {self.run_id}{about}"]
        shown += [f"  ref       {name} ({sha[:12]})" for name, sha in self.refs.items()]
        shown += [f"  worktree  {path}" for path in self.worktrees]
        if self.scratch is not None:
            shown.append(f"  scratch   {self.scratch}")
        shown += [f"  lock      {path}" for path in self.lock_files]
        from fabro_git.terminal import printable

        # The workflow and status are the run's own (a fetched run's): one line each.
        return [printable(line, one_line=True) for line in shown]


def plan(repo: GitRepo, run_id: str, row: RunRow | None) -> Removal:
    from fabro_git.engine.lock import lock_path, starting_path
    from fabro_git.store import runs as runrefs
    from fabro_git.store.worktree import checkouts_of, worktrees_under

    git_dir = Path(repo.git_dir)
    root = runs_dir()
    worktrees = [p for p in worktrees_under(repo, root) if run_of(p, root) == run_id]
    scratch = run_scratch_dir(git_dir, run_id)
    locks = [p for p in (lock_path(git_dir, run_id), starting_path(git_dir, run_id)) if p.exists()]
    checked_out = [
        p for p in checkouts_of(repo, runrefs.run_branch_name(run_id)) if p not in worktrees
    ]
    return Removal(
        run_id=run_id,
        row=row,
        refs=runrefs.run_refs(repo, run_id),
        worktrees=worktrees,
        scratch=scratch if scratch.exists() else None,
        lock_files=locks,
        checked_out=checked_out,
    )


def check(repo: GitRepo, removal: Removal) -> None:
    """Refuse a live run, and a run whose branch is checked out in the user's checkout
    (deleting the branch would leave that checkout on a branch that is gone)."""
    from fabro_git.engine.lock import is_live

    if is_live(Path(repo.git_dir), removal.run_id):
        raise RunLive(
            f"run {removal.run_id} is running; a live run cannot be removed",
            hint=f"stop it first with `git fabro interrupt {removal.run_id}`, or wait for "
            f"it to end: `git fabro logs -f {removal.run_id}`",
        )
    if removal.checked_out:
        where = ", ".join(str(p) for p in removal.checked_out)
        raise FabroError(
            f"run {removal.run_id}'s branch fabro/run/{removal.run_id} is checked out in {where}",
            hint="switch that checkout to another branch (git switch main), then remove the run",
        )


def remove(repo: GitRepo, removal: Removal) -> None:
    """Delete what `plan` found, holding the run's lock throughout."""
    from fabro_git.engine.lock import RunLock

    check(repo, removal)
    lock = RunLock(repo, removal.run_id)
    try:
        lock.acquire()
    except RunLocked as err:
        raise RunLive(
            f"run {removal.run_id} is running; a live run cannot be removed",
            hint=f"stop it first with `git fabro interrupt {removal.run_id}`, or wait for "
            f"it to end: `git fabro logs -f {removal.run_id}`",
        ) from err
    try:
        if removal.scratch is not None:
            stop_leftovers(removal.scratch)
        for path in removal.worktrees:
            remove_worktree(repo, path)
        for name, sha in removal.refs.items():
            repo.delete_ref(name, old=sha, message=f"fabro: rm {removal.run_id}")
        if removal.scratch is not None:
            shutil.rmtree(removal.scratch, ignore_errors=True)
        for path in [lock.path, *removal.lock_files]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        lock.release()


def stop_leftovers(scratch: Path) -> None:
    """Kill what a run that is not live left running, by the records in its scratch
    dir, before the worktree it writes into and the records that name it go."""
    from fabro_git.engine import reaper
    from fabro_git.engine.process_groups import records_dir

    reaper.kill_recorded(records_dir(scratch))


def remove_worktree(repo: GitRepo, path: Path) -> None:
    """Remove a scratch worktree and its registration, also when its link back to the
    repository is broken (a repository that moved): then its files go first, and the
    registration of the missing directory is pruned."""
    from fabro_git.store import worktree

    try:
        worktree.remove_worktree(repo, path)
    except FabroError:
        shutil.rmtree(path, ignore_errors=True)
        worktree.remove_worktree(repo, path)


def run_of(path: Path, root: Path) -> str | None:
    """The run id a path under the scratch root belongs to (`<run id>-<key>/...`)."""
    for base in (Path(root), Path(root).resolve()):
        with contextlib.suppress(ValueError):
            name = Path(path).relative_to(base).parts[0]
            if len(name) == _ULID_LEN or (len(name) > _ULID_LEN and name[_ULID_LEN] == "-"):
                return name[:_ULID_LEN]
            return None
    return None


@dataclass
class Orphans:
    """What runs whose refs are gone left behind, in this repository and its scratch."""

    worktrees: list[Path] = field(default_factory=list)
    scratch_dirs: list[Path] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)
    lock_files: list[Path] = field(default_factory=list)

    def lines(self) -> list[str]:
        shown = [f"  worktree  {p}" for p in self.worktrees]
        shown += [f"  scratch   {p}" for p in self.scratch_dirs]
        shown += [f"  ref       {n} ({s[:12]})" for n, s in self.refs.items()]
        shown += [f"  lock      {p}" for p in self.lock_files]
        from fabro_git.terminal import printable

        shown = [printable(line, one_line=True) for line in shown]
        return ["left by runs that are gone:", *shown] if shown else []

    def __bool__(self) -> bool:
        return bool(self.worktrees or self.scratch_dirs or self.refs or self.lock_files)


def find_orphans(repo: GitRepo, kept: set[str]) -> Orphans:
    """Leftovers of runs not in `kept` (the runs that exist) and not live: scratch
    worktrees registered here, this repository's scratch dirs, parallel refs, lock files.
    A run's `.starting` marker whose process died is stale even when the run stays."""
    from fabro_git.engine.lock import is_live
    from fabro_git.store import runs as runrefs
    from fabro_git.store.worktree import worktrees_under

    git_dir = Path(repo.git_dir)
    root = runs_dir()
    found = Orphans()

    def gone(run_id: str | None) -> bool:
        return run_id is not None and run_id not in kept and not is_live(git_dir, run_id)

    found.worktrees = [p for p in worktrees_under(repo, root) if gone(run_of(p, root))]
    found.scratch_dirs = _scratch_of_gone_runs(root, f"-{repo_key(git_dir)}", gone)
    found.scratch_dirs += [p for p in scratch_of_gone_repositories() if p not in found.scratch_dirs]
    for name, sha in repo.list_refs(runrefs.PARALLEL_PREFIX).items():
        if gone(name[len(runrefs.PARALLEL_PREFIX) :].split("/", 1)[0]):
            found.refs[name] = sha
    found.lock_files = _stale_locks(git_dir, kept, gone)
    return found


def _scratch_of_gone_runs(root: Path, key: str, gone: Callable[[str], bool]) -> list[Path]:
    """This repository's scratch dirs (named `<run id>-<key>`) of runs that are gone,
    untouched for the grace period."""
    found: list[Path] = []
    if not root.is_dir():
        return found
    now = time.time()
    for entry in sorted(root.iterdir()):
        if not (entry.name.endswith(key) and len(entry.name) == _ULID_LEN + len(key)):
            continue
        with contextlib.suppress(OSError):
            if gone(entry.name[:_ULID_LEN]) and now - entry.stat().st_mtime >= ORPHAN_GRACE_SECONDS:
                found.append(entry)
    return found


def _stale_locks(git_dir: Path, kept: set[str], gone: Callable[[str], bool]) -> list[Path]:
    """Lock files of runs that are gone, and `.starting` markers whose process died."""
    from fabro_git.engine.lock import is_live

    found: list[Path] = []
    locks = git_dir / "fabro" / "locks"
    if not locks.is_dir():
        return found
    for entry in sorted(locks.iterdir()):
        run_id = entry.name.split(".", 1)[0]
        if len(run_id) != _ULID_LEN:
            continue
        if entry.suffix == ".starting" and run_id in kept:
            # Not live with the marker there: the process it names has died.
            if not is_live(git_dir, run_id):
                found.append(entry)
        elif gone(run_id):
            found.append(entry)
    return found


def scratch_of_gone_repositories() -> list[Path]:
    """Scratch dirs whose repository no longer exists (deleted with `rm -rf`, say).

    A scratch dir's name holds only a hash of its repository's git dir, so the way back
    is the `source_directory` its run's first event recorded: when that directory is
    gone, so is every run the scratch dir could serve. One with no such record, or one
    touched within the grace period, is left alone."""
    import json

    root = runs_dir()
    if not root.is_dir():
        return []
    found = []
    now = time.time()
    for entry in sorted(root.iterdir()):
        name = entry.name
        if len(name) != _ULID_LEN + 13 or name[_ULID_LEN] != "-" or entry.is_symlink():
            continue
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            if now - entry.stat().st_mtime < ORPHAN_GRACE_SECONDS:
                continue
            with (entry / "events.jsonl").open("rb") as tail:
                first = json.loads(tail.readline())
            source = (first.get("properties") or {}).get("source_directory")
            named = first.get("event") == "run.created" and isinstance(source, str)
            if named and source and not Path(source).exists():
                found.append(entry)
    return found


def remove_orphans(repo: GitRepo, orphans: Orphans) -> None:
    for path in orphans.scratch_dirs:
        stop_leftovers(path)
    for path in orphans.worktrees:
        remove_worktree(repo, path)
    for name, sha in orphans.refs.items():
        repo.delete_ref(name, old=sha, message="fabro: prune")
    for path in orphans.scratch_dirs:
        shutil.rmtree(path, ignore_errors=True)
    for path in orphans.lock_files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def confirm(question: str, *, yes: bool, what: str) -> bool:
    """True when the user agreed (or passed --yes). Without a terminal to ask on and
    without --yes, refuse: a script must say what it means."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise FabroError(
            f"not removing {what} without confirmation, and there is no terminal to ask on",
            hint="pass --yes to remove them, or --dry-run to only list them",
        )
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
