"""Moving run refs to and from other repositories.

This is the one place the store talks to remotes, and it does so through the git CLI:
git owns URL rewriting, credential helpers, ssh configuration and proxies, and users
expect `git fabro push` to authenticate exactly as `git push` does. Pushes are never
forced and happen only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import msgspec

from fabro_git.errors import StoreError
from fabro_git.store._gitcli import describe_failure, out_lines, run_git
from fabro_git.store.repo import GitRepo


def ls_remote(repo: GitRepo, remote: str, patterns: Sequence[str]) -> dict[str, str]:
    """Refs on `remote` matching `patterns` (as `git ls-remote` matches them): {name: sha}."""
    proc = run_git(["ls-remote", "--refs", remote, "--", *patterns], cwd=repo.root)
    refs: dict[str, str] = {}
    for line in out_lines(proc):
        sha, _, name = line.partition("\t")
        if name:
            refs[name] = sha
    return refs


def local_refs(repo: GitRepo, patterns: Sequence[str]) -> list[str]:
    """This repository's refs under `patterns` (exact names or prefixes), as git lists
    them: a separate process, so safe beside writes from another thread."""
    proc = run_git(["for-each-ref", "--format=%(refname)", "--", *patterns], cwd=repo.root)
    return sorted(line for line in out_lines(proc) if line)


# Where a fetch lands before anything of this repository moves: one namespace per fetch,
# outside `refs/fabro/` so no listing of runs ever sees it, deleted when the fetch ends.
INCOMING_PREFIX = "refs/fabro-incoming/"
_ZERO = "0" * 40


class FetchReport(msgspec.Struct):
    moved: dict[str, str]  # ref: its new id (created, or fast-forwarded)
    kept: dict[str, tuple[str, str]]  # ref not moved, as it is not a fast-forward: (ours, theirs)
    held: list[str]  # refs left alone as asked (`skip`), though the remote has them


def fetch(
    repo: GitRepo,
    remote: str,
    refspecs: Sequence[str],
    *,
    skip: Collection[str] = (),
    group: Callable[[str], str] = lambda ref: ref,
) -> FetchReport:
    """Fetch `src:dst` refspecs from `remote`, taking what fast-forwards.

    git's own fetch fails as a whole when one ref would not fast-forward (it moves the
    others, then exits 1, with no say in which of ours it kept), so the remote's refs
    land in a namespace of their own first. A ref that is new here, or fast-forwards, is
    then moved; one that would be rewritten is kept and reported, and so is every other
    ref of its `group` (a run's refs move together or not at all). Refs in `skip` are
    left alone. The moves are one `update-ref` transaction that checks each ref still
    points where it did. StoreError with git's message when the fetch itself fails."""
    if not refspecs:
        return FetchReport({}, {}, [])
    import uuid

    incoming = f"{INCOMING_PREFIX}{uuid.uuid4().hex}/"
    staged_specs = [_staged(spec, incoming) for spec in refspecs]
    try:
        # Not --quiet: that also silences the lines saying what failed and why.
        run_git(
            ["fetch", "--no-tags", "--no-write-fetch-head", remote, *staged_specs], cwd=repo.root
        )
        theirs = {
            "refs/" + name.removeprefix(incoming): sha
            for name, sha in _ref_ids(repo, [incoming]).items()
        }
        ours = _ref_ids(repo, sorted({_pattern(spec) for spec in refspecs}))
        return _take(repo, theirs, ours, skip=skip, group=group)
    finally:
        staged = _ref_ids(repo, [incoming])
        if staged:
            lines = "".join(f"delete {name}\n" for name in staged)
            run_git(["update-ref", "--stdin"], cwd=repo.root, input=lines.encode(), check=False)


def _staged(spec: str, incoming: str) -> str:
    source, _, destination = spec.lstrip("+").partition(":")
    return f"+{source}:{incoming}{destination.removeprefix('refs/')}"


def _pattern(spec: str) -> str:
    """What `for-each-ref` lists for a refspec's destination: its name, or the prefix
    its `*` stands under."""
    destination = spec.partition(":")[2]
    return destination.partition("*")[0]


def _ref_ids(repo: GitRepo, patterns: Sequence[str]) -> dict[str, str]:
    proc = run_git(
        ["for-each-ref", "--format=%(objectname) %(refname)", "--", *patterns], cwd=repo.root
    )
    found: dict[str, str] = {}
    for line in out_lines(proc):
        sha, _, name = line.partition(" ")
        if name:
            found[name] = sha
    return found


def _take(
    repo: GitRepo,
    theirs: Mapping[str, str],
    ours: Mapping[str, str],
    *,
    skip: Collection[str],
    group: Callable[[str], str],
) -> FetchReport:
    moves: dict[str, tuple[str | None, str]] = {}
    kept: dict[str, tuple[str, str]] = {}
    held: list[str] = []
    for name, sha in sorted(theirs.items()):
        mine = ours.get(name)
        if name in skip:
            held.append(name)
        elif mine == sha:
            continue
        elif mine is None or _is_ancestor(repo, mine, sha):
            moves[name] = (mine, sha)
        else:
            kept[name] = (mine, sha)
    refused = {group(name) for name in kept}
    for name in [name for name in moves if group(name) in refused]:
        mine, _ = moves.pop(name)
        if mine is not None:  # a ref this repository does not have yet is simply not taken
            kept[name] = (mine, theirs[name])
    if moves:
        lines = "".join(
            f"update {name} {new} {old or _ZERO}\n" for name, (old, new) in moves.items()
        )
        run_git(["update-ref", "--stdin"], cwd=repo.root, input=lines.encode())
    return FetchReport({name: new for name, (_, new) in moves.items()}, kept, held)


def _is_ancestor(repo: GitRepo, ancestor: str, descendant: str) -> bool:
    proc = run_git(
        ["merge-base", "--is-ancestor", ancestor, descendant], cwd=repo.root, check=False
    )
    return proc.returncode == 0


class PushReport(msgspec.Struct):
    refs: list[tuple[str, bool, str]]  # (ref, ok, git's summary) per ref
    stderr: str  # what git said besides, e.g. why the remote refused


def push(
    repo: GitRepo, remote: str, refs: Sequence[str], *, env: Mapping[str, str] | None = None
) -> PushReport:
    """Push each full ref name to the same name on `remote`, never forced.

    A rejected ref does not stop the others. StoreError when git fails before reporting
    any ref (unreachable remote, auth).
    """
    if not refs:
        return PushReport([], "")
    specs = [f"{ref}:{ref}" for ref in refs]
    # This push names the metadata refs itself, so the pre-push hook of `git fabro hooks
    # install` stands aside (a user's own hook it kept still runs): racing this push to
    # the same refs, it would make them "already exist" and this push fail.
    env = {**(env or {}), "GIT_FABRO_PRE_PUSH": "1"}
    proc = run_git(["push", "--porcelain", remote, *specs], cwd=repo.root, check=False, env=env)
    results: dict[str, tuple[str, bool, str]] = {}
    for line in out_lines(proc):
        parts = line.split("\t")
        if len(parts) < 3 or len(parts[0]) != 1:
            continue
        flag, spec, summary = parts[0], parts[1], "\t".join(parts[2:])
        src = spec.split(":", 1)[0]
        results[src] = (src, flag not in "!", summary.strip())
    if not results and proc.returncode != 0:
        raise StoreError(describe_failure(["push"], repo.root, proc))
    stderr = proc.stderr.decode("utf-8", "replace").strip()
    detail = stderr or "not reported by git push"
    return PushReport([results.get(r, (r, False, detail)) for r in refs], stderr)
