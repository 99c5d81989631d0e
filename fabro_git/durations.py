"""Durations as a person writes them (`250ms`, `30s`, `15m`, `2h`, `1d`, or `90` for
seconds): one parser for workflow attributes, run configuration and command options
alike, so `wait --timeout 90` means what `timeout="90"` on a node means."""

from __future__ import annotations

import re

# No sign: a negative duration is no duration (a timeout or a wait cannot be one).
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# What a workflow attribute's duration must be, as its error says.
DURATION_EXPECTED = "a duration of zero or more, such as 250ms, 30s, 15m, 2h or 1d"


def parse_duration(text: str) -> float | None:
    """Seconds for `250ms`, `30s`, `15m`, `2h`, `1d` or a bare number of seconds; None
    for anything else, a negative duration included."""
    match = _DURATION_RE.match(text)
    if not match:
        return None
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def option_seconds(value: str, option: str) -> float:
    """Seconds for a command option's duration (units in either case), or a user error
    naming the option and the forms it takes."""
    from fabro_git.errors import ConfigError

    seconds = parse_duration(value.lower())
    if seconds is None:
        raise ConfigError(
            f"{option} expects a duration such as 90 (seconds), 30s, 10m, 2h or 1d, not {value!r}"
        )
    return seconds
