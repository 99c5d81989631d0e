"""What a run's and a batch's refs are called, and the ids a repository holds, listed by
git itself. This module imports no dulwich and nothing of the engine: shell completion
asks it at every Tab and must answer in the time a process takes to start."""

from __future__ import annotations

import re
from pathlib import Path

from fabro_git.store._gitcli import out_lines, run_git

META_PREFIX = "refs/fabro/meta/"
# A batch (`git fabro batch`): a commit whose tree holds one file, the batch record.
BATCH_PREFIX = "refs/fabro/batch/"

_RUN_ID = re.compile(r"[0-9A-Z]{26}")


def is_run_id(name: str) -> bool:
    """Whether a name read from a ref can be a run id: 26 digits and capitals, a ULID's
    shape, as every run is given one (`new_ulid`; `--run-id` takes nothing else). A
    fetched ref's name is not vouched for: `refs/fabro/meta/a/b` would nest the run's
    scratch and lock paths, and a name with `;` or `$(` would be shell code in every
    command a message suggests for the run."""
    return _RUN_ID.fullmatch(name) is not None


def listed(prefix: str, cwd: Path, *, trailer: str = "") -> list[tuple[str, list[str]]]:
    """The ids under `prefix` (`META_PREFIX` or `BATCH_PREFIX`) in the repository at
    `cwd`, oldest first, each with the values of `trailer` in its commit's message. A
    name that cannot be an id is left out. Nothing when `cwd` is in no repository."""
    values = f"%(trailers:key={trailer},valueonly,unfold,separator=%x00)" if trailer else ""
    proc = run_git(
        ["for-each-ref", f"--format=%(refname)%00{values}", prefix], cwd=cwd, check=False
    )
    if proc.returncode != 0:
        return []
    found = []
    for line in out_lines(proc):
        name, _, rest = line.partition("\0")
        ident = name.removeprefix(prefix)
        if name.startswith(prefix) and is_run_id(ident):
            found.append((ident, [value for value in rest.split("\0") if value]))
    return sorted(found)
