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
            char = text[i]
            top = self._stack[-1] if self._stack else PLAIN
            step = 1
            if top == _COMMENT:
                if char == "\n":
                    self._stack.pop()
                    continue
            elif top == SINGLE:
                if char == "'":
                    self._stack.pop()
            elif top == ANSI:
                if char == "\\":
                    step = 2
                elif char == "'":
                    self._stack.pop()
            elif top == DOUBLE:
                if char == "\\":
                    step = 2
                elif char == '"':
                    self._stack.pop()
                elif char == "`":
                    self._stack.append(_BACKTICK)
                elif char == "$" and text.startswith("$(", i):
                    step = self._open_paren(i)
            elif top == _ARITH:
                if char == "(":
                    self._depth[-1] += 1
                elif char == ")":
                    if self._depth[-1] == 0:
                        if i + 1 >= len(text):
                            return
                        self._stack.pop()
                        self._depth.pop()
                        step = 2
                    else:
                        self._depth[-1] -= 1
            else:
                step = self._plain(i, char, top)
            if step <= 0:
                return
            self._pos = i + step

    def _plain(self, i: int, char: str, top: str) -> int:
        """One step in unquoted text (top level, $(...) or `...`); 0 waits for more."""
        text = self.text
        if char == "\\":
            return 2
        if char == "'":
            self._stack.append(SINGLE)
        elif char == '"':
            self._stack.append(DOUBLE)
        elif char == "$":
            if i + 1 >= len(text):
                return 0
            if text[i + 1] == "'":
                self._stack.append(ANSI)
                return 2
            if text[i + 1] == "(":
                return self._open_paren(i)
        elif char == "`":
            if top == _BACKTICK:
                self._stack.pop()
            else:
                self._stack.append(_BACKTICK)
        elif char == "#" and (i == 0 or text[i - 1] in _WORD_BREAK):
            self._stack.append(_COMMENT)
        elif char == "(" and top == _SUBST:
            self._depth[-1] += 1
        elif char == ")" and top == _SUBST:
            if self._depth[-1] == 0:
                self._stack.pop()
                self._depth.pop()
            else:
                self._depth[-1] -= 1
        elif char == "<" and text.startswith("<<", i):
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
