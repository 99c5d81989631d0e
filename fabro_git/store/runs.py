"""Run ids and the names of the refs a run owns.

A run is known by a ULID: it sorts by creation time, so `git for-each-ref` and `ps` list
runs in order without reading anything else, and any unique prefix names a run. All of
a run's state hangs off refs derived from its id, so listing runs is listing
`refs/fabro/meta/*`, and a fresh clone (which copies `refs/heads/*` only) can find a
run on the remote and fetch just that run's refs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection

from fabro_git.errors import AmbiguousRunId, RunNotFound, StoreError
from fabro_git.store import remote as _remote
from fabro_git.store.repo import GitRepo, ref_conflict_error

META_PREFIX = "refs/fabro/meta/"
RUN_BRANCH_PREFIX = "refs/heads/fabro/run/"
PARALLEL_PREFIX = "refs/fabro/parallel/"

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ALIASES = str.maketrans({"I": "1", "L": "1", "O": "0"})
_ULID_LEN = 26


def run_branch_name(run_id: str) -> str:
    return f"fabro/run/{run_id}"


def run_branch_ref(run_id: str) -> str:
    return f"{RUN_BRANCH_PREFIX}{run_id}"


def meta_ref(run_id: str) -> str:
    return f"{META_PREFIX}{run_id}"


def parallel_ref(run_id: str, node_id: str, branch_index: int) -> str:
    # Its own namespace, so it can never sit beneath the run branch or the meta ref
    # (git refuses `a/b/c` next to a ref `a/b`).
    return f"{PARALLEL_PREFIX}{run_id}/{node_id}/{branch_index}"


def check_names_free(repo: GitRepo, run_id: str, *, with_branch: bool) -> None:
    """Refuse, before anything is written, when an existing ref (a user's branch named
    `fabro`, say) sits where one of the run's refs needs a directory."""
    names = [meta_ref(run_id)] + ([run_branch_ref(run_id)] if with_branch else [])
    for name in names:
        conflict = repo.conflicting_ref(name)
        if conflict is not None:
            raise ref_conflict_error(name, conflict)


def run_refs(repo: GitRepo, run_id: str) -> dict[str, str]:
    """Every ref the run owns here, {name: sha}: its parallel branches' heads, then its
    branch, then its meta ref. Deleting in this order keeps the run listed (by its meta
    ref) until nothing else of it is left, so a deletion cut short can be done again."""
    refs = dict(repo.list_refs(f"{PARALLEL_PREFIX}{run_id}"))
    for name in (run_branch_ref(run_id), meta_ref(run_id)):
        sha = repo.read_ref(name)
        if sha is not None:
            refs[name] = sha
    return refs


def list_run_ids(repo: GitRepo) -> list[str]:
    """Ids of the runs this repository has metadata for, oldest first."""
    return sorted(name[len(META_PREFIX) :] for name in repo.list_refs(META_PREFIX))


def resolve_run_id(repo: GitRepo, prefix: str, *, remote: str | None = "origin") -> str:
    """The one run whose id starts with `prefix` (case-insensitive).

    Local runs first. If none matches and `remote` is configured, the remote's run
    refs are listed; a single match there is fetched (meta ref, run branch and
    parallel refs) and its id returned.
    """
    wanted = _normalise(prefix)
    if not wanted:
        raise RunNotFound("no run id given", hint="pass a run id or a prefix of one (git fabro ps)")
    local = [rid for rid in list_run_ids(repo) if rid.upper().startswith(wanted)]
    exact = [rid for rid in local if rid.upper() == wanted]
    if exact:
        return exact[0]
    if len(local) == 1:
        return local[0]
    if len(local) > 1:
        raise _ambiguous(prefix, local)
    has_remote = remote is not None and repo.origin_url(remote) is not None
    if remote is not None and has_remote:
        found = _resolve_remote(repo, remote, prefix, wanted)
        if found is not None:
            return found
    where = f"here or on {remote}" if has_remote else "here"
    raise RunNotFound(
        f"no run matches {prefix!r} {where}",
        hint="list runs with git fabro ps; fetch runs from a remote with git fabro fetch",
    )


def _resolve_remote(repo: GitRepo, remote: str, prefix: str, wanted: str) -> str | None:
    try:
        matches, refs = _remote_matches(repo, remote, wanted)
    except StoreError as err:
        raise RunNotFound(
            f"no local run matches {prefix!r}, and {remote} could not be listed: {err.message}",
            hint=f"check that {remote} is reachable, then retry or run git fabro fetch",
        ) from err
    if not matches:
        return None
    if len(matches) > 1:
        raise _ambiguous(prefix, matches, where=f" on {remote}")
    run_id = matches[0]
    _fetch_listed(repo, remote, run_id, refs)
    return run_id


def fetch_run(repo: GitRepo, remote: str, prefix: str, *, skip: Collection[str] = ()) -> str:
    """Fetch the refs of the one run on `remote` whose id starts with `prefix`, whether or
    not this repository has it already, except the refs named in `skip`; returns its id."""
    wanted = _normalise(prefix)
    if not wanted:
        raise RunNotFound("no run id given", hint="pass a run id or a prefix of one")
    matches, refs = _remote_matches(repo, remote, wanted)
    exact = [rid for rid in matches if rid.upper() == wanted]
    if exact:
        matches = exact
    if not matches:
        raise RunNotFound(
            f"no run on {remote} matches {prefix!r}",
            hint=f"list what {remote} has with git ls-remote {remote} 'refs/fabro/meta/*'",
        )
    if len(matches) > 1:
        raise _ambiguous(prefix, matches, where=f" on {remote}")
    _fetch_listed(repo, remote, matches[0], refs, skip=skip)
    return matches[0]


def _remote_matches(repo: GitRepo, remote: str, wanted: str) -> tuple[list[str], dict[str, str]]:
    """Ids of the runs on `remote` starting with the normalised `wanted`, and the
    remote's run refs as listed."""
    refs = _remote.ls_remote(
        repo, remote, [f"{META_PREFIX}*", f"{RUN_BRANCH_PREFIX}*", f"{PARALLEL_PREFIX}*"]
    )
    matches = sorted(
        name[len(META_PREFIX) :]
        for name in refs
        if name.startswith(META_PREFIX) and name[len(META_PREFIX) :].upper().startswith(wanted)
    )
    return matches, refs


def _fetch_listed(
    repo: GitRepo, remote: str, run_id: str, refs: dict[str, str], *, skip: Collection[str] = ()
) -> None:
    """Fetch the run's meta ref, branch and parallel refs, as `refs` lists them."""
    specs = [f"{meta_ref(run_id)}:{meta_ref(run_id)}"]
    if run_branch_ref(run_id) in refs and run_branch_ref(run_id) not in skip:
        specs.append(f"{run_branch_ref(run_id)}:{run_branch_ref(run_id)}")
    parallel = f"{PARALLEL_PREFIX}{run_id}/"
    if any(name.startswith(parallel) for name in refs):
        specs.append(f"{parallel}*:{parallel}*")
    _remote.fetch(repo, remote, specs)


def _ambiguous(prefix: str, candidates: list[str], *, where: str = "") -> AmbiguousRunId:
    shown = "\n".join(f"  {c}" for c in candidates[:20])
    more = f"\n  … and {len(candidates) - 20} more" if len(candidates) > 20 else ""
    return AmbiguousRunId(
        f"{prefix!r} matches {len(candidates)} runs{where}:\n{shown}{more}",
        hint="give more characters of the run id",
    )


def _normalise(prefix: str) -> str:
    text = prefix.strip()
    for lead in (META_PREFIX, RUN_BRANCH_PREFIX, "fabro/meta/", "fabro/run/"):
        if text.startswith(lead):
            text = text[len(lead) :]
            break
    return text.upper().translate(_ALIASES)


# -- ULIDs ---------------------------------------------------------------------------

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def new_ulid() -> str:
    """A 26-character ULID; ids made later in this process always sort after earlier ones."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            rand = _last_rand + 1
            if rand >= 1 << 80:  # randomness exhausted within one millisecond
                ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _last_ms, _last_rand = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(_ULID_LEN):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))
