"""Who a commit is by: git's author and committer identities, as git works them out.

GIT_AUTHOR_*/GIT_COMMITTER_* first, then the `author`/`committer` and `user` config
sections, then EMAIL, then a fallback, so fabro's commits carry the names `git commit`
would write. The config stack is read once per repository object, since reading it
costs more than writing a commit.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import time
from collections.abc import Callable

import msgspec
from dulwich.config import StackedConfig

FALLBACK_NAME = "git fabro"
FALLBACK_EMAIL = "fabro@localhost"


class Identity(msgspec.Struct, frozen=True):
    name: str
    email: str
    time: int
    tz_offset: int  # seconds east of UTC

    @property
    def raw(self) -> bytes:
        return f"{self.name} <{self.email}>".encode()


class Identities:
    """The author and committer of one repository's commits."""

    def __init__(self, config: Callable[[], StackedConfig]) -> None:
        self._config = config
        self._cache: dict[tuple[str, str], tuple[str, str]] = {}

    def author(self) -> Identity:
        return self._identity("AUTHOR", "author")

    def committer(self) -> Identity:
        return self._identity("COMMITTER", "committer")

    def override_author(self, name: str | None, email: str | None) -> None:
        """Author this object's commits as `name <email>` (a run's `[run.git.author]`),
        over git's config and GIT_AUTHOR_*; the committer stays whoever runs the tool,
        as with `git commit --author`. A part left None keeps git's value."""
        current_name, current_email = self._names("AUTHOR", "author")
        self._cache[("AUTHOR", "author")] = (
            clean_ident(name or "") or current_name,
            clean_ident(email or "").strip("<>") or current_email,
        )

    def _identity(self, kind: str, section: str) -> Identity:
        name, email = self._names(kind, section)
        when = parse_git_date(os.environ.get(f"GIT_{kind}_DATE"))
        if when is None:
            now = int(time.time())
            when = (now, time.localtime(now).tm_gmtoff)
        return Identity(name=name, email=email, time=when[0], tz_offset=when[1])

    def _names(self, kind: str, section: str) -> tuple[str, str]:
        """Name and email for `kind`; config is read once per repository object, since
        reading git's config stack costs more than writing a commit."""
        key = (kind, section)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        config = self._config()

        def setting(*keys: tuple[str, str]) -> str | None:
            for sec, name in keys:
                try:
                    value = config.get((sec,), name)
                except KeyError:
                    continue
                if value:
                    return value.decode("utf-8", "replace")
            return None

        name = os.environ.get(f"GIT_{kind}_NAME") or setting((section, "name"), ("user", "name"))
        email = os.environ.get(f"GIT_{kind}_EMAIL") or setting(
            (section, "email"), ("user", "email")
        )
        email = email or os.environ.get("EMAIL")
        result = (
            clean_ident(name) or FALLBACK_NAME,
            clean_ident(email).strip("<>") or FALLBACK_EMAIL,
        )
        self._cache[key] = result
        return result


def clean_ident(value: str | None) -> str:
    # git strips these from identities; a stray "<" or newline would corrupt the header.
    return "".join(ch for ch in (value or "") if ch not in "<>\n\0").strip()


def parse_git_date(value: str | None) -> tuple[int, int] | None:
    """GIT_*_DATE in git's internal (`[@]<epoch> <+hhmm>`) or ISO 8601 form."""
    if not value:
        return None
    match = re.fullmatch(r"@?(\d+)(?:\s+([+-])(\d\d)(\d\d))?", value.strip())
    if match:
        offset = 0
        if match.group(2):
            offset = int(match.group(3)) * 3600 + int(match.group(4)) * 60
            offset = -offset if match.group(2) == "-" else offset
        return int(match.group(1)), offset
    try:
        parsed = _dt.datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()
    delta = parsed.utcoffset() or _dt.timedelta(0)
    return int(parsed.timestamp()), int(delta.total_seconds())
