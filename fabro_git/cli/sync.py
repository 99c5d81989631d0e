"""`git fabro fetch` and `git fabro push`: move runs between repositories explicitly.

`git clone` and a plain `git push` only carry `refs/heads/*`; the metadata lives under
`refs/fabro/`, so these commands name both halves of a run. Pushes are never forced.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fabro_git.errors import FabroError

FETCH_REFSPECS = (
    "refs/fabro/*:refs/fabro/*",
    "refs/heads/fabro/run/*:refs/heads/fabro/run/*",
)


def fetch(remote: str) -> int:
    from fabro_git.store import remote as rem
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    before = set(runrefs.list_run_ids(repo))
    rem.fetch(repo, remote, FETCH_REFSPECS)
    after = set(runrefs.list_run_ids(repo))
    print(f"fetched runs from {remote}: {len(after)} known, {len(after - before)} new", file=sys.stderr)
    return 0


def push(remote: str, run_ids: list[str]) -> int:
    from fabro_git.store import remote as rem
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    ids = [runrefs.resolve_run_id(repo, r, remote=None) for r in run_ids] or runrefs.list_run_ids(repo)
    if not ids:
        print("no runs to push", file=sys.stderr)
        return 0
    refs: list[str] = []
    for run_id in ids:
        refs.append(runrefs.meta_ref(run_id))
        if repo.read_ref(runrefs.run_branch_ref(run_id)) is not None:
            refs.append(runrefs.run_branch_ref(run_id))
        # The parallel branches' heads: a run cut between its fan-out and fan-in needs
        # them to resume, and nothing else reaches them.
        refs.extend(repo.list_refs(f"{runrefs.PARALLEL_PREFIX}{run_id}"))
    report = rem.push(repo, remote, refs)
    failed = [(ref, msg) for ref, ok, msg in report.refs if not ok]
    for ref, ok, msg in report.refs:
        print(f"{'ok' if ok else 'rejected'}  {ref}" + (f"  ({msg})" if msg and not ok else ""), file=sys.stderr)
    if failed:
        said = f"; git said:\n{report.stderr}" if report.stderr else ""
        raise FabroError(
            f"{len(failed)} ref(s) were rejected by {remote}{said}",
            hint="the remote has moved on; fetch with `git fabro fetch` and look at the runs before pushing again",
        )
    return 0
