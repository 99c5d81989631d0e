"""How a position in a shell script is quoted, so a template can become a variable there.

A template in a script becomes a reference to an environment variable (see
`templates.render_script`). `${VAR}` is right bare, inside double quotes, in a command
substitution and in an unquoted here-document, but inside single quotes the shell would
print it as written, and authors write `echo '{{ goal }}'`. So the renderer asks this
scanner where it stands: inside single quotes it closes them around a double-quoted
reference (`'"${VAR}"'`).

The scanner follows the parts of the shell grammar that change quoting: backslashes,
'...', "...", $'...', backquotes, $(...), $((...)), comments and here-documents. It is
not a parser and may misread an unusual script; that costs fidelity, never safety: every
form it can emit keeps the value out of the script's text, so a misreading prints the
reference literally or splits the value into words, and never runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PLAIN = "plain"  # unquoted, or in $(...) / `...`
SINGLE = "single"  # '...'
ANSI = "ansi"  # $'...'
DOUBLE = "double"  # "..."
HEREDOC = "heredoc"  # body of <<EOF: expands $VAR
HEREDOC_QUOTED = "heredoc-quoted"  # body of <<'EOF': expands nothing
_SUBST = "subst"  # $( ... ): plain, ends at its own ')'
_ARITH = "arith"  # $(( ... ))
_BACKTICK = "backtick"
_COMMENT = "comment"
_WORD_BREAK = " \t\n;&|()<>"
_AGAIN = -1


@dataclass
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    quoted: bool


@dataclass
class ShellQuoting:
    """Feed the script's text as it is produced; `state()` tells how its end is quoted."""

    text: str = ""
    _pos: int = 0
    _stack: list[str] = field(default_factory=list)
    _depth: list[int] = field(default_factory=list)  # open '(' in each $( or $((
    _pending: list[_Heredoc] = field(default_factory=list)
    _heredoc: _Heredoc | None = None
    _line_start: int = 0  # of the here-document line being read
    _line_dead: bool = False  # that line is already too long to be the delimiter

    def feed(self, text: str) -> None:
        self.text += text

    def state(self) -> str:
        self._scan()
        # Keep only what a later step may look back at, so feeding a long script in
        # many pieces stays linear.
        keep = max(0, self._pos - 1)
        if self._heredoc is not None and not self._line_dead:
            keep = min(keep, self._line_start)
        if keep:
            self.text = self.text[keep:]
            self._pos -= keep
            self._line_start = max(0, self._line_start - keep)
        if self._heredoc is not None:
            return HEREDOC_QUOTED if self._heredoc.quoted else HEREDOC
        top = self._stack[-1] if self._stack else PLAIN
        if top in (SINGLE, ANSI, DOUBLE):
            return top
        return PLAIN

    def _scan(self) -> None:
        text = self.text
        while self._pos < len(text):
            if self._heredoc is not None:
                if not self._heredoc_line():
                    return
                continue
            i = self._pos
            top = self._stack[-1] if self._stack else PLAIN
            inside = _INSIDE.get(top)
            step = inside(self, i, text[i]) if inside else self._plain(i, text[i], top)
            if step == _AGAIN:
                continue
            if step <= 0:
                return
            self._pos = i + step

    # One step inside each kind of quoting: how far to move on (0 waits for more text,
    # _AGAIN looks at the same character in the state it has just changed to).

    def _in_comment(self, i: int, char: str) -> int:
        if char == "\n":
            self._stack.pop()
            return _AGAIN
        return 1

    def _in_single(self, i: int, char: str) -> int:
        if char == "'":
            self._stack.pop()
        return 1

    def _in_ansi(self, i: int, char: str) -> int:
        if char == "\\":
            return 2
        if char == "'":
            self._stack.pop()
        return 1

    def _in_double(self, i: int, char: str) -> int:
        if char == "\\":
            return 2
        if char == '"':
            self._stack.pop()
        elif char == "`":
            self._stack.append(_BACKTICK)
        elif char == "$" and self.text.startswith("$(", i):
            return self._open_paren(i)
        return 1

    def _in_arith(self, i: int, char: str) -> int:
        if char == "(":
            self._depth[-1] += 1
        elif char == ")":
            if self._depth[-1] != 0:
                self._depth[-1] -= 1
                return 1
            if i + 1 >= len(self.text):
                return 0
            self._stack.pop()
            self._depth.pop()
            return 2
        return 1

    def _plain(self, i: int, char: str, top: str) -> int:
        """One step in unquoted text (top level, $(...) or `...`); 0 waits for more."""
        if char == "\\":
            return 2
        if char == "'":
            self._stack.append(SINGLE)
        elif char == '"':
            self._stack.append(DOUBLE)
        elif char == "$":
            return self._dollar(i)
        elif char == "`":
            if top == _BACKTICK:
                self._stack.pop()
            else:
                self._stack.append(_BACKTICK)
        elif char == "#" and (i == 0 or self.text[i - 1] in _WORD_BREAK):
            self._stack.append(_COMMENT)
        else:
            return self._plain_structure(i, char, top)
        return 1

    def _dollar(self, i: int) -> int:
        text = self.text
        if i + 1 >= len(text):
            return 0
        if text[i + 1] == "'":
            self._stack.append(ANSI)
            return 2
        if text[i + 1] == "(":
            return self._open_paren(i)
        return 1

    def _plain_structure(self, i: int, char: str, top: str) -> int:
        """Parentheses of a $(...), a here-document operator, the end of a line."""
        if char == "(" and top == _SUBST:
            self._depth[-1] += 1
        elif char == ")" and top == _SUBST:
            if self._depth[-1] == 0:
                self._stack.pop()
                self._depth.pop()
            else:
                self._depth[-1] -= 1
        elif char == "<" and self.text.startswith("<<", i):
            return self._heredoc_operator(i)
        elif char == "\n" and self._pending:
            self._heredoc = self._pending.pop(0)
            self._line_start = i + 1
            self._line_dead = False
        return 1

    def _open_paren(self, i: int) -> int:
        if i + 2 >= len(self.text):
            return 0
        if self.text[i + 2] == "(":
            self._stack.append(_ARITH)
            self._depth.append(0)
            return 3
        self._stack.append(_SUBST)
        self._depth.append(0)
        return 2

    def _heredoc_operator(self, i: int) -> int:
        """Read `<<[-] WORD` and queue its body for the next line; 0 waits for more."""
        text = self.text
        j = i + 2
        if text.startswith("<", j):  # <<< here-string
            return 3
        strip_tabs = text.startswith("-", j)
        if strip_tabs:
            j += 1
        while j < len(text) and text[j] in " \t":
            j += 1
        start = j
        while j < len(text) and text[j] not in _WORD_BREAK:
            j += 1
        if j >= len(text):
            return 0
        word = text[start:j]
        if not word:
            return j - i
        quoted = any(q in word for q in "'\"\\")
        delimiter = word.replace("'", "").replace('"', "").replace("\\", "")
        self._pending.append(_Heredoc(delimiter, strip_tabs, quoted))
        return j - i

    def _heredoc_line(self) -> bool:
        """Consume one whole line of a here-document body; False waits for more."""
        heredoc = self._heredoc
        assert heredoc is not None
        end = self.text.find("\n", self._pos)
        if end < 0:
            self._pos = len(self.text)
            if not self._line_dead:
                line = self.text[self._line_start :]
                line = line.lstrip("\t") if heredoc.strip_tabs else line
                self._line_dead = len(line) > len(heredoc.delimiter)
            return False
        if not self._line_dead:
            line = self.text[self._line_start : end]
            line = line.lstrip("\t") if heredoc.strip_tabs else line
            if line == heredoc.delimiter:
                self._heredoc = self._pending.pop(0) if self._pending else None
        self._line_start = self._pos = end + 1
        self._line_dead = False
        return True


def reference(variable: str, state: str) -> str | None:
    """Shell text that expands `variable` at a position quoted as `state`; None where
    nothing expands (a here-document with a quoted delimiter)."""
    if state == SINGLE:
        return "'\"${" + variable + "}\"'"
    if state == ANSI:
        return "'\"${" + variable + "}\"$'"
    if state == HEREDOC_QUOTED:
        return None
    return "${" + variable + "}"


# The step for each quoting state; any other state scans as plain text.
_INSIDE: dict[str, Callable[[ShellQuoting, int, str], int]] = {
    _COMMENT: ShellQuoting._in_comment,
    SINGLE: ShellQuoting._in_single,
    ANSI: ShellQuoting._in_ansi,
    DOUBLE: ShellQuoting._in_double,
    _ARITH: ShellQuoting._in_arith,
}
