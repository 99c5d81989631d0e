"""'Did you mean …?': the known names within a small edit distance of a typo.

Edit distance, not a similarity ratio: `logz` is one keystroke from `logs` and should
be suggested, while `prune` is two from `run` and names something else entirely. Adjacent
transpositions count as one edit (`inpsect`).
"""

from __future__ import annotations

from collections.abc import Iterable


def edit_distance(a: str, b: str, limit: int) -> int:
    """Damerau-Levenshtein distance (adjacent transpositions), or `limit + 1` once it is
    known to exceed `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        previous2, previous = previous, current
    return previous[-1]


def close_names(word: str, known: Iterable[str], *, most: int = 2) -> list[str]:
    """The names in `known` closest to `word`: one edit away for short words, two for
    words of six characters or more; nearest first, at most `most` of them."""
    limit = 1 if len(word) < 6 else 2
    scored = []
    for name in set(known):
        if name == word:
            continue
        distance = edit_distance(word.lower(), name.lower(), limit)
        if distance <= limit:
            scored.append((distance, name))
    return [name for _, name in sorted(scored)[:most]]
