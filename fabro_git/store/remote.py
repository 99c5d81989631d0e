"""Moving run refs to and from other repositories.

This is the one place the store talks to remotes, and it does so through the git CLI:
git owns URL rewriting, credential helpers, ssh configuration and proxies, and users
expect `git fabro push` to authenticate exactly as `git push` does. Pushes are never
forced and happen only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from fabro_git.errors import StoreError
from fabro_git.store._gitcli import describe_failure, out, run_git
from fabro_git.store.repo import GitRepo


def ls_remote(repo: GitRepo, remote: str, patterns: Sequence[str]) -> dict[str, str]:
    """Refs on `remote` matching `patterns` (as `git ls-remote` matches them): {name: sha}."""
    proc = run_git(["ls-remote", "--refs", remote, "--", *patterns], cwd=repo.root)
    refs: dict[str, str] = {}
    for line in out(proc).splitlines():
        sha, _, name = line.partition("\t")
        if name:
            refs[name] = sha
    return refs


def local_refs(repo: GitRepo, patterns: Sequence[str]) -> list[str]:
    """This repository's refs under `patterns` (exact names or prefixes), as git lists
    them: a separate process, so safe beside writes from another thread."""
    proc = run_git(["for-each-ref", "--format=%(refname)", "--", *patterns], cwd=repo.root)
    return sorted(line for line in out(proc).splitlines() if line)


def fetch(repo: GitRepo, remote: str, refspecs: Sequence[str]) -> None:
    """`git fetch` the refspecs from `remote`; StoreError with git's message on failure."""
    if not refspecs:
        return
    # Not --quiet: that also silences the lines saying which ref was rejected and why,
    # and a failure would reach the user with no detail at all.
    run_git(["fetch", "--no-tags", "--no-write-fetch-head", remote, *refspecs], cwd=repo.root)


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
    proc = run_git(["push", "--porcelain", remote, *specs], cwd=repo.root, check=False, env=env)
    results: dict[str, tuple[str, bool, str]] = {}
    for line in out(proc).splitlines():
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
