"""Secrets never reach git: the one redactor for everything we write from run data.

A run's data is full of text we did not write: command output, a goal, inputs, context
values. Any of it can carry a credential, and once a credential is in a git object it is
pushed with the run and stays in every clone. So every byte of run data is passed through
one `Redactor` before it becomes a git object or an event: the meta snapshot writer, the
commit messages we write, and the event bus (the live tail and the terminal show the same
redacted events the meta ref holds).

Two things count as secret:

- the value of an environment variable whose name looks secret (`*_KEY`, `*_TOKEN`,
  `*_SECRET`, `*PASSWORD*`, `*_CREDENTIALS`, ..., in any case), when it is at least
  `MIN_SECRET_LENGTH` characters long: a shorter value would redact ordinary words, and
  is no real secret anyway;
- the value of an input (`-V NAME=VALUE`) whose name looks secret, by the same rule:
  a script sees it as the variable `FABRO_INPUT_<NAME>`;
- text with the shape of a well-known credential (`sk-...`, `ghp_...`, `xoxb-...`,
  `AKIA...`, ...), whatever variable, file or prompt it came from.

A secret becomes `***` and its last four characters, so two keys can still be told apart.
An environment value is also matched in its JSON-escaped form (a password with a quote in
it), because events, context and the checkpoint are JSON.

The pattern is compiled once per process from its environment (a run is one process).
The work product itself, the files a stage writes in its worktree, is the user's code and
is never rewritten.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from typing import Any

MIN_SECRET_LENGTH = 8
KEEP = 4  # trailing characters a redaction keeps
MASK = "***"

# Matched against the variable's name, upper-cased.
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|CREDENTIALS?|PASSWORD|PASSWD|PASSPHRASE|PAT)$"
    r"|PASSWORD|PASSWD|SECRET"
)

# Well-known credential shapes. A shape that starts inside a longer word
# (`risk-assessment-...`) is left alone (see `_starts_word`); one right after a JSON
# escape (`\nsk-...`, `\fsk-...`, `\u001bsk-...`) is not inside a word.
_SHAPES = (
    r"sk-[A-Za-z0-9_-]{20,}"  # OpenAI and Anthropic: sk-..., sk-proj-..., sk-ant-...
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{22,}"  # GitHub fine-grained tokens
    r"|xox[abeprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"  # AWS access key ids
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|AIza[A-Za-z0-9_-]{35}"  # Google API keys
    r"|ya29\.[A-Za-z0-9_-]{20,}"  # Google OAuth access tokens
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|npm_[A-Za-z0-9]{36}"  # npm
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.{0,8000}?-----END [A-Z ]*PRIVATE KEY-----"
)
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _starts_word(data: str | bytes, start: int) -> bool:
    """Whether a match at `start` begins a word rather than continuing one.

    Checked here rather than by a look-behind in the pattern, which would cost the
    regex engine its fast scan for the first character (twice as slow on a big log).
    """
    if start == 0:
        return True
    before = data[start - 1 : start]
    code = before[0] if isinstance(before, bytes) else ord(before)
    if code not in _WORD:
        return True
    # After a JSON escape of a control character: `\n`, `\b`, ..., or `\u001b`.
    escape = data[start - 2 : start - 1]
    if escape in ("\\", b"\\") and before in _ESCAPED:
        return True
    unicode = data[start - 6 : start]
    return len(unicode) == 6 and unicode[:2] in ("\\u", b"\\u") and _is_hex(unicode[2:])


_ESCAPED = frozenset(("n", "r", "t", "b", "f", b"n", b"r", b"t", b"b", b"f"))


def _is_hex(digits: str | bytes) -> bool:
    text = digits.decode("latin-1") if isinstance(digits, bytes) else digits
    return all(c in "0123456789abcdefABCDEF" for c in text)


# Names the rule above catches that locate a tool's files or settings and hold no secret;
# they are neither redacted nor kept from a stage (`fabro_git.engine.stage_env`).
NOT_SECRET = frozenset({"PASSWORD_STORE_DIR", "PASSWORD_STORE_KEY", "PASSWORD_STORE_GPG_OPTS"})


def is_secret_name(name: str) -> bool:
    """Whether a variable of this name holds a secret: the one rule for what the
    redactor masks and what a stage's environment leaves out."""
    return name not in NOT_SECRET and bool(_SECRET_NAME.search(name.upper()))


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of `environ` that are secrets, longest first."""
    values = {
        value
        for name, value in environ.items()
        if is_secret_name(name) and len(value.strip()) >= MIN_SECRET_LENGTH
    }
    return sorted(values, key=len, reverse=True)


def mask(secret: str) -> str:
    """`***` and the last four characters."""
    return MASK + secret[-KEEP:]


class Redactor:
    """Replaces secrets in text, bytes and JSON-like values; see the module docstring."""

    def __init__(self, values: list[str]) -> None:
        # Each literal form of an environment secret, and what it becomes.
        literal: dict[str, str] = {}
        # No value has a character JSON escapes (`"`, `\`, a control character): a
        # text's JSON string form then holds every match the text holds.
        self._plain = True
        for value in values:
            literal[value] = mask(value)
            escaped = json.dumps(value, ensure_ascii=False)[1:-1]
            if escaped != value:
                literal[escaped] = json.dumps(mask(value), ensure_ascii=False)[1:-1]
                self._plain = False
        self._literal = literal
        forms = sorted(literal, key=len, reverse=True)
        alternatives = [re.escape(form) for form in forms]
        alternatives.append(_SHAPES)
        source = "|".join(alternatives)
        self._text = re.compile(source, re.DOTALL)
        self._bytes = re.compile(source.encode("utf-8", "surrogateescape"), re.DOTALL)
        self._quick = _quick_filter(alternatives)

    def _replace_text(self, match: re.Match[str]) -> str:
        found = match.group()
        literal = self._literal.get(found)
        if literal is not None:
            return literal
        return mask(found) if _starts_word(match.string, match.start()) else found

    def _replace_bytes(self, match: re.Match[bytes]) -> bytes:
        found = match.group().decode("utf-8", "surrogateescape")
        literal = self._literal.get(found)
        if literal is None:
            if not _starts_word(match.string, match.start()):
                return match.group()
            literal = mask(found)
        return literal.encode("utf-8", "surrogateescape")

    def mask_text(self, text: str) -> str:
        return self._text.sub(self._replace_text, text)

    def mask_bytes(self, data: bytes) -> bytes:
        if self._quick is not None and self._quick.search(data) is None:
            return data
        return self._bytes.sub(self._replace_bytes, data)

    def found_in(self, data: bytes) -> bool:
        """Whether `data` may hold a secret (a cheap test before a rewrite)."""
        if self._quick is not None and self._quick.search(data) is None:
            return False
        return self._bytes.search(data) is not None

    def clean_with_text(self, encoded: bytes) -> bool:
        """Whether `encoded`, the JSON string form of a text (`msgspec.json.encode` of
        a str), holds nothing to mask, and neither does the text's UTF-8 form.

        Encoding a text keeps every run of its bytes other than `"`, backslash and control
        characters as it is, and no match holds one of those when no secret value has
        one (credential shapes and the private-key header never do): any match in the
        text is then in its JSON form too. So one scan of the JSON form, by the quick
        filter that ignores word boundaries, answers for both; False (scan each) when
        a value has such a character or RE2 is missing."""
        return self._plain and self._quick is not None and self._quick.search(encoded) is None

    def mask_value(self, value: Any) -> Any:
        """A copy of JSON-like data (dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self.mask_text(value)
        if isinstance(value, dict):
            return {self.mask_value(k): self.mask_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.mask_value(v) for v in value]
        return value


def _quick_filter(alternatives: list[str]) -> Any:
    """A linear-time RE2 pattern that matches wherever the redaction pattern may: the
    same alternatives, bytes read as Latin-1 so they match byte for byte, with the
    private-key block cut to its first line (RE2 bounds repeats at 1000). Python's
    `re` tries every alternative at every byte (15 ms and more a megabyte); RE2 scans
    several times faster, so the text with nothing to mask, nearly all of it, costs
    little. None when RE2 cannot take the pattern: `re` alone is then used."""
    try:
        import re2  # google-re2
    except ImportError:
        return None
    pem = r".{0,8000}?-----END [A-Z ]*PRIVATE KEY-----"
    source = "|".join(alternatives).replace(pem, "")
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.dot_nl = True
    options.never_capture = True
    options.log_errors = False
    options.max_mem = 64 << 20
    try:
        return re2.compile(source.encode("utf-8", "surrogateescape"), options)
    except re2.error:
        return None


def from_environ(environ: Mapping[str, str]) -> Redactor:
    return Redactor(secret_values(environ))


_remembered: dict[str, str] = {}


def remember(named_values: Mapping[str, str]) -> None:
    """Count the values whose names look secret (a run's inputs) as secrets too.

    Call before the run's event bus and recorder are made: they hold `for_process()`.
    """
    _remembered.update(named_values)
    for_process.cache_clear()


_literal: set[str] = set()


def remember_values(values: list[str]) -> None:
    """Count these values as secrets whatever their names (the credentials a run's
    configuration hands to a server), when they are at least `MIN_SECRET_LENGTH` long."""
    _literal.update(v for v in values if len(v.strip()) >= MIN_SECRET_LENGTH)
    for_process.cache_clear()


@functools.cache
def for_process() -> Redactor:
    """The redactor for this process's environment (and remembered values)."""
    named: dict[str, str] = dict(os.environ)
    named.update({f"FABRO_INPUT_{k}": v for k, v in _remembered.items()})
    values = set(secret_values(named)) | _literal
    return Redactor(sorted(values, key=len, reverse=True))
