"""`git fabro fetch` and `git fabro push`: move runs between repositories explicitly.

`git clone` and a plain `git push` only carry `refs/heads/*`; the metadata lives under
`refs/fabro/`, so these commands name both halves of a run. Neither is ever forced: a
fetch takes every run that fast-forwards and keeps, as it is, each run one of whose refs
the remote would rewrite, names it and exits 1; a push reports each rejected ref.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.errors import FabroError

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo

FETCH_REFSPECS = (
    "refs/fabro/*:refs/fabro/*",
    "refs/heads/fabro/run/*:refs/heads/fabro/run/*",
)


def fetch(remote: str, run: str | None = None) -> int:
    """Fetch every run from `remote`, or with `run` (an id or a prefix the remote can
    resolve) just that run's refs, and say how many runs came new and how many moved.
    1 when a run was kept as it is because the remote's would rewrite it."""
    from fabro_git.store import remote as remotes
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo
    from fabro_git.store.worktree import checked_out_branches

    repo = GitRepo.discover(Path.cwd())
    before = _meta_tips(repo)
    # A branch that a worktree has checked out must not move under it: such run branches
    # (yours after `git switch`, or a live run's) are left out, and said so.
    checked_out = {
        ref: path
        for ref, path in checked_out_branches(repo).items()
        if ref.startswith(runrefs.RUN_BRANCH_PREFIX)
    }
    if run is None:
        report = remotes.fetch(
            repo, remote, FETCH_REFSPECS, skip=checked_out, group=runrefs.run_of_ref
        )
    else:
        _, report = runrefs.fetch_run(repo, remote, run, skip=checked_out)
    held = {ref: checked_out[ref] for ref in report.held}
    after = _meta_tips(repo)
    new = sorted(set(after) - set(before))
    updated = sorted(rid for rid in before if rid in after and after[rid] != before[rid])
    remote_name = _shown(remote)
    what = "runs" if run is None else f"run {_shown(run)}"
    print(
        f"fetched {what} from {remote_name}: {_runs(len(new))} new, "
        f"{_runs(len(updated))} updated, {len(after)} known here",
        file=sys.stderr,
    )
    # Run ids and ref names here are the remote's.
    for rid in new:
        print(f"  new      {_shown(rid)}", file=sys.stderr)
    for rid in updated:
        print(f"  updated  {_shown(rid)}", file=sys.stderr)
    for ref, path in held.items():
        print(
            f"not fetched: {_shown(ref.removeprefix('refs/heads/'))} is checked out in "
            f"{_shown(str(path))} (switch away from it, or let its run end, and fetch again)",
            file=sys.stderr,
        )
    for ref, (ours, theirs) in report.kept.items():
        run_id = _shown(runrefs.run_of_ref(ref))
        print(
            f"kept local {_shown(ref.removeprefix('refs/heads/'))} ({ours[:12]}) and the rest "
            f"of run {run_id}: {remote_name}'s ({theirs[:12]}) is not a fast-forward of it (the "
            f"two have diverged). To take {remote_name}'s, keep a copy of this one if you want "
            f"it (git fabro fork {run_id}), then git fabro rm {run_id} and fetch again",
            file=sys.stderr,
        )
    return 1 if report.kept else 0


def _shown(text: str) -> str:
    """A ref name, run id or remote as a terminal may be sent it: git lets a ref name
    hold a bidi override or a C1 control (UTF-8 encoded), and the remote chose them."""
    from fabro_git.terminal import printable

    return printable(text, one_line=True)


def _meta_tips(repo: GitRepo) -> dict[str, str]:
    from fabro_git.store import runs as runrefs

    prefix = runrefs.META_PREFIX
    return {
        name[len(prefix) :]: sha
        for name, sha in repo.list_refs(prefix).items()
        if runrefs.is_run_id(name[len(prefix) :])
    }


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def push(remote: str, run_ids: list[str]) -> int:
    from fabro_git.store import remote as remotes
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    ids = [runrefs.resolve_run_id(repo, r, remote=None) for r in run_ids] or runrefs.list_run_ids(
        repo
    )
    if not ids:
        print("no runs to push", file=sys.stderr)
        return 0
    refs: list[str] = []
    for run_id in ids:
        # The parallel branches' heads too: a run cut between its fan-out and fan-in
        # needs them to resume, and nothing else reaches them.
        owned = runrefs.run_refs(repo, run_id)
        refs.append(runrefs.meta_ref(run_id))
        refs.extend(name for name in owned if name != runrefs.meta_ref(run_id))
    report = remotes.push(repo, remote, refs)
    failed = [(ref, msg) for ref, ok, msg in report.refs if not ok]
    for ref, ok, msg in report.refs:
        # A rejection's reason is the remote's own words (a hook's, say).
        print(
            f"{'ok' if ok else 'rejected'}  {_shown(ref)}"
            + (f"  ({_shown(msg)})" if msg and not ok else ""),
            file=sys.stderr,
        )
    if failed:
        said = f"; git said:\n{report.stderr}" if report.stderr else ""
        raise FabroError(
            f"{len(failed)} ref(s) were rejected by {remote}{said}",
            hint="the remote has moved on; fetch with `git fabro fetch` and look at the runs before pushing again",
        )
    return 0
