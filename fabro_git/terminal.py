"""Run data made safe to print: the one sanitiser between a run and a terminal.

A model's reply, a command's output, a fetched run's manifest (workflow name, goal,
labels), file names and error texts are written by someone other than the user. Printed
raw, `ESC ]52;…` writes the user's clipboard, `ESC [2J` clears the screen, OSC 8 hides a
link behind innocent text, and CR, backspace or a bidi override make a line read as
something it is not. Every command passes such text through `printable` before it
reaches a terminal (or a pipe, which often ends in one); the colour our own renderers add
is applied afterwards, so it stays. JSON output needs nothing: JSON encoding escapes
control characters already. `show --raw` and `diff --raw` are the ways to get a run's
bytes unchanged.

The escapes are shown the way Python's `repr` writes them: `\\x1b`, `\\r`, `\\x08`,
`\\x9b`, `\\u202e`; a newline and a tab stay as they are in multi-line text (a reply, an
output) and are shown as `\\n` and `\\t` in a one-line field (a label, a name, a table
cell). A backslash already in the text is left alone, so `\\x1b` typed in a reply reads
the same as an escaped ESC; what matters is that nothing is executed and that distinct
control characters stay distinct.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls; the bidi embeddings, overrides,
# isolates and marks (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069), which reorder
# what is shown; lone surrogates (undecodable bytes), which no terminal can be sent.
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_MULTI_LINE = re.compile(f"[{_UNSAFE}]")
# A one-line field also shows the line and paragraph separators, which some readers
# break on.
_ONE_LINE = re.compile(f"[\t\n\u2028\u2029{_UNSAFE}]")
# Each character's escape: these three by name, the others filled in as they are met
# (a bounded set: the characters the patterns above match).
_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    escape = _ESCAPES.get(char)
    if escape is None:
        code = ord(char)
        escape = _ESCAPES[char] = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return escape


def printable(text: str, *, one_line: bool = False) -> str:
    """`text` with every control character, bidi control and lone surrogate shown as an
    escape (`\\x1b`), never executed. Newlines and tabs are kept unless `one_line`."""
    return (_ONE_LINE if one_line else _MULTI_LINE).sub(_escape, text)


# What JSON leaves raw but a terminal may act on: DEL, the C1 controls (U+009B is CSI),
# the bidi controls and the line and paragraph separators.
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]")


def json_printable(line: str) -> str:
    """A JSON text (`logs`, `--json`) with every character a terminal could act on
    written as its `\\uXXXX` escape: the same JSON value, nothing for a terminal to
    execute. (JSON escapes C0 controls itself.)"""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
