"""A run's commits counted in process: `git rev-list --count BASE..TIP` without a git
process, where the objects alone decide the answer.

The result line after a run says how many commits its branch holds over its base.
Every line of descent from a run's tip comes down to its base, so a walk from the tip
that stops at the base meets exactly the commits git counts: each one met descends
from the base, so none of them is in the base's past. Where that does not hold (a line
reaches a root commit: history that does not grow from the base), where the walk is
long, where an object cannot be read here, or where git could see another history
than the objects hold (a shallow clone, grafts, replace refs), the answer is None and
git counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from fabro_git.errors import FabroError

# The most commits walked here before leaving the count to git (a run makes two or
# three a stage).
WALK_LIMIT = 10_000


def commits_between(
    git_dir: Path,
    base: str,
    tip: str,
    *,
    parents: Callable[[str], Sequence[bytes]],
    has_replace_refs: Callable[[], bool],
) -> int | None:
    """The number of commits in `base..tip`, or None for git to count (see above).
    `parents` reads a commit's parents; `has_replace_refs` says whether any
    `refs/replace/` ref exists."""
    if (
        os.environ.get("GIT_REPLACE_REF_BASE")
        or (git_dir / "shallow").exists()
        or (git_dir / "info" / "grafts").exists()
        or has_replace_refs()
    ):
        return None
    seen: set[str] = set()
    pending = [tip]
    try:
        while pending:
            sha = pending.pop()
            if sha == base or sha in seen:
                continue
            if len(seen) >= WALK_LIMIT:
                return None
            seen.add(sha)
            found = parents(sha)
            if not found:
                return None
            pending.extend(parent.decode() for parent in found)
    except (FabroError, KeyError, ValueError, OSError):
        return None  # git counts, and says what is wrong if anything is
    return len(seen)
