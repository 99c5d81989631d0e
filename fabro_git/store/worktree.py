"""Run worktrees: where stages execute, and how their files become tree objects.

A run works in a real `git worktree`, made and removed with the git CLI: the admin
files under `.git/worktrees/` are git's business, and `git worktree list`, `prune` and
`status` must keep understanding them.

Turning the worktree into a tree object is also left to git, on the worktree's own
index: `git add -A` then `git write-tree`. The index is git's stat cache, written in C,
so a scan of a large tree only re-reads files whose stat data changed; and staging
through git applies the user's clean filters (LFS, autocrlf, ident) and .gitignore
exactly as their own commits would. Exclude globs become `:(glob,exclude)` pathspecs, so
nothing in the user's repository or config is modified. The untracked cache is switched
on for the call only (`-c`), never persisted in the user's config. When the caller knows
which paths changed, only those are staged, and the cost follows the change.

The commit itself is written by `GitRepo.write_commit` (dulwich) and the branch moved
by compare-and-swap, like every other ref move.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fabro_git.config.locations import make_private_dir, open_private
from fabro_git.errors import FabroError, RefRaceError, StoreError
from fabro_git.store import statcheck
from fabro_git.store._gitcli import (
    SEES_FIFO_WAITS,
    git_env,
    git_failure,
    lines_of,
    out,
    run_git,
)
from fabro_git.store.backoff import Clock
from fabro_git.store.repo import GitRepo

# Per-invocation settings for scanning big trees; nothing is written to any config file.
# A run worktree's index carries no untracked cache (`_NO_UNTRACKED_CACHE`).
_NO_UNTRACKED_CACHE = ("-c", "core.untrackedCache=false")
_SCAN_CONFIG = (
    *_NO_UNTRACKED_CACHE,
    "-c",
    "core.preloadIndex=true",
    "-c",
    "advice.addIgnoredFile=false",
    "-c",
    "advice.addEmbeddedRepo=false",
    "-c",
    "core.sparseCheckout=false",
)
# A new worktree gets an index in the compact v4 format, as `feature.manyFiles` would
# give it; this applies to the worktree's own index only. Not the untracked cache that
# setting brings: git never consults it for the scans here (each names a pathspec),
# and git 2.39's now and then called a directory unchanged just after a new one was
# made in it, so a `git status` an agent runs in the worktree could miss new files.
# The user's sparse checkout is not the run's: with sparse checkout off for the `add`,
# git neither copies the patterns into the new worktree nor checks out a partial tree.
_CREATE_CONFIG = (
    "-c",
    "index.version=4",
    *_NO_UNTRACKED_CACHE,
    "-c",
    "core.sparseCheckout=false",
)
_STALE_LOCK_SECONDS = 60


@contextlib.contextmanager
def _admin_lock(repo: GitRepo) -> Iterator[None]:
    """Serialise worktree creation and removal across processes.

    `git worktree add` reads every other worktree's admin directory while a concurrent
    `add` may be half-way through writing its own, and then fails ("failed to read
    .../commondir"); several runs starting at once in one repository would trip on it.
    """
    lock_dir = make_private_dir(Path(repo.git_dir) / "fabro")
    fd = open_private(lock_dir / "worktrees.flock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_worktree(
    repo: GitRepo, path: Path, *, branch: str | None, commit: str, new: bool = False
) -> None:
    """Check out `branch` (which must exist and point at `commit`) or a detached `commit`
    into a new worktree at `path`, creating parent directories.

    If `path` already is a live worktree in the same state (on `branch`, or detached),
    it is reset to `commit` instead, as on resume; local changes are discarded. With
    `new`, the caller made both `branch` and the directory around `path` just now (a new
    run), so no worktree of git's can already be registered at `path` or on `branch`,
    and git's list of them is not read.
    """
    with _admin_lock(repo):
        _add_worktree(repo, path, branch=branch, commit=commit, new=new)


def _add_worktree(repo: GitRepo, path: Path, *, branch: str | None, commit: str, new: bool) -> None:
    path = Path(path).absolute()
    if branch is not None:
        ref = f"refs/heads/{branch}"
        tip = repo.read_ref(ref)
        if tip is None:
            raise StoreError(f"cannot create a worktree on {branch}: the branch does not exist")
        if tip != commit:
            raise RefRaceError(
                f"{ref} is at {tip[:12]}, not {commit[:12]} as expected; "
                "the worktree was not created"
            )
    registered = [] if new else _worktrees(repo)
    stale = [w for w in registered if not Path(w["worktree"]).exists()]
    if any(
        _same_path(Path(w["worktree"]), path)
        or (branch is not None and w.get("branch") == f"refs/heads/{branch}")
        for w in stale
    ):
        # Deleted behind git's back: its registration would block this one.
        run_git(["worktree", "prune"], cwd=repo.root)
    live = next(
        (w for w in registered if w not in stale and _same_path(Path(w["worktree"]), path)),
        None,
    )
    if live is not None and not (path / ".git").exists():
        # A `git worktree remove` cut off half way (a kill as the run released it): the
        # directory is there, its link to the repository is not. Finish the removal.
        shutil.rmtree(path, ignore_errors=True)
        run_git(["worktree", "prune"], cwd=repo.root)
        live = None
    if live is not None:
        if (branch is None and "detached" in live) or (
            branch is not None and live.get("branch") == f"refs/heads/{branch}"
        ):
            checkout(path, commit)
            return
        where = live.get("branch", "a detached HEAD").removeprefix("refs/heads/")
        raise StoreError(
            f"{path} is already a worktree on {where}",
            hint="remove it (git worktree remove) or choose another directory",
        )
    make_private_dir(path.parent)  # ours; the checkout itself follows the user's umask
    args = [*_CREATE_CONFIG, "worktree", "add", "--quiet"]
    if branch is None:
        args += ["--detach", str(path), commit]
    else:
        args += [str(path), branch]
    # A failed `worktree add` removes what it made, so trying again is safe.
    run_git(args, cwd=repo.root, retry_transient=True)
    _keep_full_checkout(path)


def _keep_full_checkout(worktree: Path) -> None:
    """Switch sparse checkout off in a new worktree's own config, when it has one.

    `git sparse-checkout set` turns on per-worktree config and keeps its settings in the
    main worktree's `config.worktree`, which `git worktree add` copies into the new one;
    a stage running git there (an agent's `git add`) would then refuse paths outside
    the user's cone. The new worktree's copy is ours to change; the user's is untouched.
    Without per-worktree config the setting is shared, but no patterns were copied, and
    git treats sparse checkout without patterns as off.
    """
    if _private_git_dir(worktree).joinpath("config.worktree").is_file():
        run_git(["config", "--worktree", "core.sparseCheckout", "false"], cwd=worktree)


def _private_git_dir(worktree: Path) -> Path:
    """A linked worktree's own git dir, as its `.git` file names it (what `git rev-parse
    --git-path` resolves per-worktree files against), without a git process."""
    link = (worktree / ".git").read_text().strip()
    target = Path(link.removeprefix("gitdir:").strip())
    return target if target.is_absolute() else worktree / target


def remove_worktree(repo: GitRepo, path: Path) -> None:
    """Remove the worktree at `path` and its registration, discarding its files."""
    with _admin_lock(repo):
        _remove_worktree(repo, path)


def _remove_worktree(repo: GitRepo, path: Path) -> None:
    path = Path(path).absolute()
    if not path.exists():
        run_git(["worktree", "prune"], cwd=repo.root)
        return
    admin = _admin_dir_of(repo, path)
    if admin is not None:
        # What `git worktree remove --force --force` does, without its process: the
        # files first, then the registration, so a kill in between leaves what git
        # itself would leave (a registration whose directory is gone, which `prune`
        # clears, as `_add_worktree` does).
        try:
            shutil.rmtree(path)
            shutil.rmtree(admin)
            return
        except OSError:
            pass  # a file it cannot delete: git says what, below
    # Twice forced: also when modified, untracked or locked. Everything durable in a
    # run worktree is already in git.
    run_git(["worktree", "remove", "--force", "--force", str(path)], cwd=repo.root)


def _admin_dir_of(repo: GitRepo, path: Path) -> Path | None:
    """The registration (`<common dir>/worktrees/<name>`) of the linked worktree at
    `path`, when the two name each other plainly: its `.git` file points there, and the
    registration's `gitdir` points back at that `.git` file. None otherwise (a main
    worktree, a moved or damaged one): git is asked to remove it then."""
    dotgit = path / ".git"
    try:
        if not dotgit.is_file() or dotgit.is_symlink():
            return None
        link = dotgit.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not link.startswith("gitdir:"):
        return None
    admin = Path(link.removeprefix("gitdir:").strip())
    if not admin.is_absolute():
        return None
    registry = Path(os.path.realpath(repo.git_dir / "worktrees"))
    if Path(os.path.realpath(admin.parent)) != registry or admin.name in ("", ".", ".."):
        return None
    try:
        back = (admin / "gitdir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if os.path.realpath(back) != os.path.realpath(dotgit):
        return None
    return admin


def snapshot_tree(
    worktree: Path,
    *,
    exclude_globs: Sequence[str] = (),
    changed_paths: Sequence[str] | None = None,
    clock: Clock | None = None,
) -> str:
    """Stage the worktree's files in its index and return the tree's sha.

    With `changed_paths`, only those paths (files, or deleted files) are staged; if git
    refuses one of them (ignored, never tracked and now gone), the whole tree is
    rescanned instead, which is always correct. A held index lock is waited out on
    `clock` (`store.backoff`).
    """
    worktree = Path(worktree)
    excludes = [f":(glob,exclude){g}" for g in exclude_globs]
    staged = False
    if changed_paths is not None:
        if not changed_paths:
            staged = True
        else:
            spec = "\0".join([*(f":(literal){p}" for p in changed_paths), *excludes]) + "\0"
            proc = run_git(
                [*_SCAN_CONFIG, "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"],
                cwd=worktree,
                input=spec.encode("utf-8", "surrogateescape"),
                check=False,
                retry_transient=True,
                clock=clock,
                on_fifo=_walking(worktree, changed_paths),
            )
            staged = proc.returncode == 0
    if not staged:
        run_git(
            [*_SCAN_CONFIG, "add", "-A", "--", ".", *excludes],
            cwd=worktree,
            retry_transient=True,
            clock=clock,
            on_fifo=_walking(worktree),
        )
    return out(
        run_git(
            [*_NO_UNTRACKED_CACHE, "write-tree"], cwd=worktree, retry_transient=True, clock=clock
        )
    ).strip()


def _walking(worktree: Path, paths: Sequence[str] | None = None) -> Callable[[], FabroError]:
    """`run_git`'s `on_fifo` for a git that walks `worktree` (limited to `paths`): the
    error naming the special file git waits on. Where a git waiting on a FIFO cannot be
    seen, the worktree is looked at now instead (`statcheck.refuse_special_files`)."""
    if not SEES_FIFO_WAITS:
        statcheck.refuse_special_files(worktree, paths)

    def error() -> FabroError:
        # The git just killed held the index's lock: the next git there would wait on it.
        index = statcheck.index_path(worktree)
        if index is not None:
            with contextlib.suppress(FileNotFoundError):
                index.with_name("index.lock").unlink()
        try:
            statcheck.refuse_special_files(worktree, paths)
        except StoreError as err:
            return err
        return StoreError(
            f"git waited to open a named pipe (FIFO) as it read {worktree}, and was stopped",
            hint="a stage left a FIFO where git reads a file: remove it, and what made it",
        )

    return error


def head_branch(worktree: Path) -> str | None:
    """The full name of the branch the worktree's HEAD is on; None when HEAD is detached.

    Read from the worktree's HEAD file: this is asked after every stage, and a git
    process would cost more than the rest of the question.
    """
    from fabro_git.store.statcheck import index_path

    index = index_path(Path(worktree))
    if index is None:
        raise StoreError(f"{worktree} is not a git worktree")
    try:
        head = (index.parent / "HEAD").read_text(encoding="utf-8").strip()
    except OSError as err:
        raise StoreError(f"cannot read the HEAD of {worktree}: {err}") from err
    return head[len("ref: ") :] if head.startswith("ref: ") else None


def attach_head(worktree: Path, branch_ref: str) -> None:
    """Put the worktree's HEAD back on `branch_ref`, leaving every branch where it is
    (the index and files are the caller's to reset)."""
    run_git(["symbolic-ref", "HEAD", branch_ref], cwd=Path(worktree))


def checkout(worktree: Path, commit: str) -> None:
    """Make the worktree's index and tracked files match `commit`, discarding local changes.

    Untracked files are left alone, as with `git reset --hard`. An attached worktree stays
    on its branch; if the branch is elsewhere it is moved to `commit` by compare-and-swap
    first, so a concurrent writer is detected rather than overwritten.
    """
    worktree = Path(worktree)
    _clear_stale_index_lock(worktree)
    _drop_special_files(worktree)
    symref = run_git(["symbolic-ref", "-q", "HEAD"], cwd=worktree, check=False)
    branch_ref = out(symref).strip() if symref.returncode == 0 else None
    if branch_ref:
        repo = GitRepo.discover(worktree)
        try:
            tip = repo.read_ref(branch_ref)
            if tip != commit:
                repo.update_ref(
                    branch_ref, commit, old=tip, message=f"fabro: checkout {commit[:12]}"
                )
        finally:
            repo.close()
    _undo_sparse_checkout(worktree)
    run_git(
        [
            *_NO_UNTRACKED_CACHE,
            *("-c", "core.sparseCheckout=false"),
            *("reset", "--hard", "--quiet", commit, "--"),
        ],
        cwd=worktree,
        retry_transient=True,
    )


def _undo_sparse_checkout(worktree: Path) -> None:
    """Give a worktree that was checked out sparse (before runs turned sparse checkout
    off for their worktrees) its full tree back.

    Entries a sparse checkout left out are marked skip-worktree in the index; `git add`
    ignores them, so a stage's new version of such a file would never be recorded, and
    `git reset --hard` keeps the marks. Clearing them lets the reset write the files.
    """
    setting = run_git(["config", "--type=bool", "core.sparseCheckout"], cwd=worktree, check=False)
    if out(setting).strip() != "true":
        return
    _keep_full_checkout(worktree)
    listing = out(run_git(["ls-files", "-t", "-z"], cwd=worktree)).split("\0")
    skipped = [entry[2:] for entry in listing if entry.startswith("S ")]
    if skipped:
        run_git(
            ["update-index", "--no-skip-worktree", "-z", "--stdin"],
            cwd=worktree,
            input=("\0".join(skipped) + "\0").encode("utf-8", "surrogateescape"),
        )


def remove_untracked(worktree: Path, *, exclude_globs: Sequence[str] = ()) -> None:
    """Delete what git neither tracks nor ignores, so the worktree is its commit's tree.

    Ignored files stay (build caches such as `node_modules` are expensive to rebuild),
    and so do paths the run's exclude globs keep out of its snapshots. A nested
    repository in an untracked directory goes too (`-ff`).
    """
    excludes = [f":(glob,exclude){g}" for g in exclude_globs]
    _drop_special_files(Path(worktree))
    run_git(["clean", "-ffdq", "--", ".", *excludes], cwd=Path(worktree))


def _drop_special_files(worktree: Path) -> None:
    """Delete the FIFOs, sockets and devices named `.gitignore` or `.gitattributes`
    (`statcheck.special_files`) from a worktree about to be put back to a commit, which
    cannot hold them: git reads those names as it walks the worktree, and would wait on
    a FIFO for ever."""
    root = os.fsencode(worktree)
    for relpath, _ in list(statcheck.special_files(worktree)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, relpath))


def diff_text(worktree_or_repo: Path, old: str, new: str, *, max_bytes: int = 200_000) -> str:
    """Unified diff from `old` to `new`, cut at `max_bytes` with a marker saying so."""
    args = ["git", "-c", "core.quotepath=false", "diff", "--no-color", "--no-ext-diff"]
    args += ["--no-textconv", "--end-of-options", old, new, "--"]
    try:
        proc = subprocess.Popen(
            args,
            cwd=worktree_or_repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=git_env(),
        )
    except FileNotFoundError as err:
        raise StoreError(f"cannot run git diff in {worktree_or_repo}: {err}") from err
    assert proc.stdout is not None and proc.stderr is not None
    data = proc.stdout.read(max_bytes + 1)
    truncated = len(data) > max_bytes
    if truncated:
        proc.kill()
    stdout_rest = b"" if truncated else proc.stdout.read()
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    code = proc.wait()
    if not truncated and code != 0:
        failed = subprocess.CompletedProcess(args, code, data + stdout_rest, stderr)
        raise git_failure(args[1:], Path(worktree_or_repo), failed)
    if not truncated:
        return (data + stdout_rest).decode("utf-8", "replace")
    cut = data.rfind(b"\n", 0, max_bytes) + 1 or max_bytes
    text = data[:cut].decode("utf-8", "replace")
    return text + (
        f"[diff truncated at {cut} bytes; see the whole diff with: "
        f"git diff {old[:12]} {new[:12]}]\n"
    )


def files_changed(worktree_or_repo: Path, old: str, new: str) -> list[str]:
    """Paths that differ between the two commits (renames show as delete plus add)."""
    proc = run_git(
        ["diff", "--name-only", "-z", "--no-renames", "--end-of-options", old, new, "--"],
        cwd=Path(worktree_or_repo),
    )
    return [p for p in out(proc).split("\0") if p]


def checkouts_of(repo: GitRepo, branch: str) -> list[Path]:
    """The worktrees of `repo` that have `branch` checked out."""
    ref = f"refs/heads/{branch}"
    return [Path(w["worktree"]) for w in _worktrees(repo) if w.get("branch") == ref]


def main_worktree(repo: GitRepo) -> Path:
    """The repository's main worktree (git lists it first), which git never removes."""
    return Path(_worktrees(repo)[0]["worktree"])


def all_worktrees(repo: GitRepo) -> list[dict[str, str]]:
    """Every worktree of `repo` as git lists it (`worktree`, `HEAD`, `branch`, `prunable`...)."""
    return _worktrees(repo)


def checked_out_branches(repo: GitRepo) -> dict[str, Path]:
    """Every branch checked out in some worktree of `repo`: {full ref name: worktree}."""
    return {w["branch"]: Path(w["worktree"]) for w in _worktrees(repo) if "branch" in w}


def worktrees_under(repo: GitRepo, root: Path) -> list[Path]:
    """The worktrees registered in `repo` whose path lies under `root` (existing or not)."""
    base = Path(os.path.realpath(root))
    found = []
    for entry in _worktrees(repo):
        path = Path(entry["worktree"])
        if Path(os.path.realpath(path)).is_relative_to(base) or path.is_relative_to(base):
            found.append(path)
    return found


def _worktrees(repo: GitRepo) -> list[dict[str, str]]:
    """`git worktree list --porcelain` as one dict per worktree (main one included)."""
    listing = out(run_git(["worktree", "list", "--porcelain"], cwd=repo.root))
    entries = []
    for block in listing.split("\n\n"):
        fields = {}
        for line in lines_of(block):
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" in fields:
            entries.append(fields)
    return entries


def _same_path(a: Path, b: Path) -> bool:
    return a.absolute() == b.absolute() or os.path.realpath(a) == os.path.realpath(b)


def _clear_stale_index_lock(worktree: Path) -> None:
    """Remove an `index.lock` left by a git process that was killed in this worktree.

    A run worktree is private to the run, and `checkout` is called by the process that
    owns the run; a lock older than a minute can only be debris from a crash, and would
    otherwise make every later git command in the worktree fail, blocking resume.
    """
    proc = run_git(["rev-parse", "--git-path", "index.lock"], cwd=worktree, check=False)
    if proc.returncode != 0:
        return
    lock = worktree / out(proc).strip()
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > _STALE_LOCK_SECONDS:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
