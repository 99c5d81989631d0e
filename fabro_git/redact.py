"""Secrets never reach git: the one redactor for everything we write from run data.

A run's data is full of text we did not write: command output, a goal, inputs, context
values. Each of them can carry a credential, and once a credential is in a git object it is
pushed with the run and stays in every clone. So every byte of run data is passed through
one `Redactor` before it becomes a git object or an event: the meta snapshot writer, the
commit messages we write, and the event bus (the live tail and the terminal show the same
redacted events the meta ref holds).

Two things count as secret:

- the value of an environment variable whose name looks secret (`*_KEY`, `*_TOKEN`,
  `*_SECRET`, `*PASSWORD*`, `*_CREDENTIALS`, `*_PASS`, `*_AUTH`, ..., plural or numbered
  too, `*_KEYS`, `*_TOKEN_2`, in any case), when it is at least
  `MIN_SECRET_LENGTH` characters long: a shorter value would redact ordinary words, and
  is no real secret anyway;
- the value of an input (`-V NAME=VALUE`) whose name looks secret, by the same rule:
  a script sees it as the variable `FABRO_INPUT_<NAME>`;
- text with the shape of a well-known credential (`sk-...`, `ghp_...`, `xoxb-...`,
  `AKIA...`, ...), whatever variable, file or prompt it came from.

A secret becomes `***` and its last four characters, so two keys can still be told apart.
Values are masked in a pass of their own, before key shapes: a shape that starts inside
a word (`risk-...` holds `sk-...`) is no key and is left alone, and in one pass its
match would hide a value further on in that word.
An environment value is also matched in its JSON-escaped form (a password with a quote in
it), because events, context and the checkpoint are JSON, and in its hex and base64 forms
(`encoded_forms`), which a command's output holds when it dumps its environment encoded.

Text that arrives in pieces (a model's streamed reply and reasoning, a tool's output, a
command's output read into git a chunk at a time) is masked by one `StreamMasker` per
stream (`Redactor.stream()`, `Redactor.stream_bytes()`), never piece by piece: a secret
cut across two pieces would be two halves no pattern recognises, and joining the pieces
would give it back. The masker (one per pass, the values' feeding the shapes') holds back the tail that could still be the start of a
secret, so what it releases, joined, is exactly what masking the whole text gives. It
holds at most:

- the tail that may still become a secret value (one that begins one of its literal
  forms): the longest form less one character at most;
- the trailing run of key-shaped characters (`[A-Za-z0-9_-]`, after `ya29.` too), up to
  `RUN_HOLD` characters (or the longest value, if longer). A longer run that begins a
  key shape is held as its first `RUN_HEAD` characters and its last few only: the key
  becomes `***` and its last four, as it would whole. A longer run that begins none is
  released, bar the literal hold (the values' pass, which runs first, holds that);
- from an unfinished private-key block (`-----BEGIN ... PRIVATE KEY-----` without its
  end), up to `PEM_HOLD` characters.

So a stream's pieces lag behind the text by that much at most, until `flush()` at the
stream's end releases the rest.

The pattern is compiled once per process from its environment (a run is one process).
The work product itself, the files a stage writes in its worktree, is the user's code and
is never rewritten.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

from fabro_git.jsondata import JsonValue

MIN_SECRET_LENGTH = 8
KEEP = 4  # trailing characters a redaction keeps
MASK = "***"
# What a stream holds back at most (see the module docstring), in characters (bytes for
# a byte stream): the run of key-shaped characters that may still become a key; the
# head of a longer one that is a key; an unfinished private-key block (its body is at
# most 8000 characters, with room for its two header lines).
RUN_HOLD = 1024
RUN_HEAD = 64
PEM_HOLD = 8400

# Matched against the variable's name, upper-cased.
# A plural, or a number after it, is one more of the same (`OPENAI_API_KEYS`,
# `GITHUB_TOKEN_2`); `PASS` and `AUTH` are short forms (`DB_PASS`, `PROXY_AUTH`).
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|CREDENTIAL|PASSWORD|PASSWD|PASSPHRASE|PASS|PAT|AUTH)"
    r"S?(?:_?[0-9]+)?$"
    r"|PASSWORD|PASSWD|SECRET"
)

_PEM = r"-----BEGIN [A-Z ]*PRIVATE KEY-----.{0,8000}?-----END [A-Z ]*PRIVATE KEY-----"

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
    r"|" + _PEM
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


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a variable of this name holds a secret: the one rule for what the
    redactor masks and what a stage's environment leaves out. Remembered by name: each
    stage's environment asks again of every variable the host has."""
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


def encoded_forms(value: str) -> list[str]:
    """`value` as it reads hex-encoded (either case) and base64-encoded (standard and
    URL-safe alphabets), wherever it starts in the encoded data: `env | base64` or a
    hex dump must not carry a secret out either. In base64 the characters at a value's
    two ends also hold bits of what comes before and after it; the forms are the
    characters between, which the value alone decides, one for each of the three
    places it can start in a group of three bytes."""
    import base64

    data = value.encode("utf-8", "surrogateescape")
    forms = [data.hex(), data.hex().upper()]
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data).decode("ascii")
        # Character i holds bits [6i, 6i + 6): from the first wholly past the `offset`
        # bytes before the value to the last wholly inside it.
        inner = encoded[-(-8 * offset // 6) : 8 * (offset + len(data)) // 6]
        forms += [inner, inner.translate(_URL_SAFE)]
    return [form for form in dict.fromkeys(forms) if len(form) >= MIN_SECRET_LENGTH]


_URL_SAFE = str.maketrans("+/", "-_")


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
            for form in encoded_forms(value):
                literal.setdefault(form, mask(form))
        self._literal = literal
        self._literal_bytes = {
            form.encode("utf-8", "surrogateescape"): masked.encode("utf-8", "surrogateescape")
            for form, masked in literal.items()
        }
        forms = sorted(literal, key=len, reverse=True)
        alternatives = [re.escape(form) for form in forms]
        # Two passes, values first: a key shape that starts inside a word (`risk-...`)
        # is left alone, and a match of it would hide a value inside that word from a
        # single pass (its scan resumes after the match). Where a value and a shape
        # overlap, the value wins.
        self._values = _Pass(alternatives) if alternatives else None
        self._shapes = _Pass([_SHAPES])
        # Both at once: for `widen_cut` (spans only) and `clean_with_text`.
        self._source = "|".join([*alternatives, _SHAPES])
        self._quick = _quick_filter([*alternatives, _SHAPES])

    @functools.cached_property
    def _text(self) -> re.Pattern[str]:
        return re.compile(self._source, re.DOTALL)

    def _replace_value_text(self, match: re.Match[str]) -> str:
        return self._literal[match.group()]

    def _replace_value_bytes(self, match: re.Match[bytes]) -> bytes:
        return self._literal_bytes[match.group()]

    @staticmethod
    def _replace_shape_text(match: re.Match[str]) -> str:
        found = match.group()
        return mask(found) if _starts_word(match.string, match.start()) else found

    @staticmethod
    def _replace_shape_bytes(match: re.Match[bytes]) -> bytes:
        if not _starts_word(match.string, match.start()):
            return match.group()
        return mask(match.group().decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape"
        )

    def mask_text(self, text: str) -> str:
        if self._values is not None:
            text = self._values.as_text.sub(self._replace_value_text, text)
        return self._shapes.as_text.sub(self._replace_shape_text, text)

    def widen_cut(self, text: str, start: int, end: int) -> tuple[int, int]:
        """The part of `text` to leave out instead of `text[start:end]`, so that no
        secret is cut in two: a secret across either edge is left out whole (a part of
        one, kept, would be a part no pattern recognises)."""
        if start >= end:
            return start, end
        for match in self._text.finditer(text):
            first, last = match.span()
            if first >= end:
                break
            if first < start < last:
                start = first
            if first < end < last:
                end = last
        return start, end

    def stream(self) -> StreamMasker[str]:
        """A masker for one stream of text that arrives in pieces: the two passes of
        `mask_text`, one masker each, the values' feeding the shapes'."""
        values = None
        if self._values is not None:
            longest = max(map(len, self._literal))
            values = StreamMasker(
                self._values.as_text, self._replace_value_text, self._literal, longest, _TEXT, None
            )
        return StreamMasker(
            self._shapes.as_text, self._replace_shape_text, {}, 0, _TEXT, None, first=values
        )

    def stream_bytes(self) -> StreamMasker[bytes]:
        """A masker for one stream of bytes (a file read a chunk at a time)."""
        values = None
        if self._values is not None:
            literal = self._literal_bytes
            values = StreamMasker(
                self._values.as_bytes,
                self._replace_value_bytes,
                literal,
                max(map(len, literal)),
                _BYTES,
                self._values.quick,
            )
        return StreamMasker(
            self._shapes.as_bytes,
            self._replace_shape_bytes,
            {},
            0,
            _BYTES,
            self._shapes.quick,
            first=values,
        )

    def mask_bytes(self, data: bytes) -> bytes:
        if self._quick is not None and self._quick.search(data) is None:
            return data
        if self._values is not None and self._values.may_match(data):
            data = self._values.as_bytes.sub(self._replace_value_bytes, data)
        if self._shapes.may_match(data):
            data = self._shapes.as_bytes.sub(self._replace_shape_bytes, data)
        return data

    def found_in(self, data: bytes) -> bool:
        """Whether `data` may hold a secret (a cheap test before a rewrite)."""
        if self._quick is not None and self._quick.search(data) is None:
            return False
        passes = [self._shapes] if self._values is None else [self._values, self._shapes]
        return any(p.as_bytes.search(data) is not None for p in passes)

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

    def mask_value(self, value: JsonValue) -> JsonValue:
        """A copy of JSON-like data (dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self.mask_text(value)
        if isinstance(value, dict):
            return {self.mask_text(k): self.mask_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.mask_value(v) for v in value]
        return value


class _Pass:
    """One pass of the redactor: its pattern as text and as bytes, and its RE2 filter.

    Each of the two `re` patterns is compiled when first used (a millisecond or so, at
    the start of every command): the RE2 filter answers alone for text with nothing to mask,
    which is most of it."""

    def __init__(self, alternatives: list[str]) -> None:
        self._source = "|".join(alternatives)
        self.quick = _quick_filter(alternatives)

    @functools.cached_property
    def as_text(self) -> re.Pattern[str]:
        return re.compile(self._source, re.DOTALL)

    @functools.cached_property
    def as_bytes(self) -> re.Pattern[bytes]:
        return re.compile(self._source.encode("utf-8", "surrogateescape"), re.DOTALL)

    def may_match(self, data: bytes) -> bool:
        return self.quick is None or self.quick.search(data) is not None


def _quick_filter(alternatives: list[str]) -> QuickFilter | None:
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


Chunk = TypeVar("Chunk", str, bytes)


class QuickFilter(Protocol):
    """A compiled RE2 pattern (google-re2, an optional import), as the redactor uses it."""

    def search(self, data: str | bytes) -> object: ...


class _Alphabet(Generic[Chunk]):
    """The constants a stream masker needs, as text or as bytes."""

    def __init__(self, convert: Callable[[str], Chunk]) -> None:
        self.empty: Chunk = convert("")
        self.word: Chunk = convert(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
        )
        self.oauth: Chunk = convert("ya29.")  # the one key shape with a dot
        self.pem_begin: Chunk = convert("-----BEGIN")
        self.pem_label: Chunk = convert("PRIVATE KEY")
        self.dashes: Chunk = convert("-----")
        self.pem_head: re.Pattern[Chunk] = re.compile(convert(r"-----BEGIN [A-Z ]*"))
        self.pem: re.Pattern[Chunk] = re.compile(convert(_PEM), re.DOTALL)


_TEXT: _Alphabet[str] = _Alphabet(str)
_BYTES: _Alphabet[bytes] = _Alphabet(str.encode)
_LOOK_BEHIND = 6  # characters `_starts_word` looks back at most


class StreamMasker(Generic[Chunk]):
    """Masks one stream that arrives in pieces: `feed` each piece and take what it
    returns, then `flush` at the stream's end (also when it ends early) for the rest.
    The returned pieces, joined, are the whole text masked (`Redactor.mask_text`), see
    the module docstring for what is held back meanwhile."""

    def __init__(
        self,
        pattern: re.Pattern[Chunk],
        replace: Callable[[re.Match[Chunk]], Chunk],
        literal: Mapping[Chunk, Chunk],
        longest: int,
        alphabet: _Alphabet[Chunk],
        quick: QuickFilter | None,
        *,
        first: StreamMasker[Chunk] | None = None,
    ) -> None:
        # The pass before this one (the values'), whose output this one masks.
        self._first: StreamMasker[Chunk] | None = first
        self._pattern: re.Pattern[Chunk] = pattern
        self._replace: Callable[[re.Match[Chunk]], Chunk] = replace
        self._literal: Mapping[Chunk, Chunk] = literal
        self._literal_hold = max(longest - 1, 0)
        # The first character of each literal form: where a tail to hold may begin.
        self._firsts: list[Chunk] = list(dict.fromkeys(form[:1] for form in literal if form))
        self._run_hold = max(RUN_HOLD, longest)
        self._run_head = max(RUN_HEAD, longest)
        self._alphabet: _Alphabet[Chunk] = alphabet
        self._quick = quick
        self._held: Chunk = alphabet.empty
        self._behind: Chunk = alphabet.empty  # released text `_starts_word` may look at
        self._masked = 0

    @property
    def masked(self) -> int:
        """How many secrets were masked so far."""
        return self._masked + (self._first.masked if self._first is not None else 0)

    @property
    def holding(self) -> int:
        """How many characters are held back now."""
        return len(self._held) + (self._first.holding if self._first is not None else 0)

    def feed(self, piece: Chunk) -> Chunk:
        """The masked text that `piece` (and what was held back) lets go now."""
        if self._first is not None:
            piece = self._first.feed(piece)
        if not piece:
            return self._alphabet.empty
        return self._step(self._held + piece, final=False)

    def flush(self) -> Chunk:
        """The rest, masked: the stream has ended."""
        if self._first is not None:
            rest = self._first.flush()
            if rest:
                released = self._step(self._held + rest, final=True)
                return released
        if not self._held:
            return self._alphabet.empty
        return self._step(self._held, final=True)

    def _step(self, pending: Chunk, *, final: bool) -> Chunk:
        start = len(self._behind)
        text = self._behind + pending
        end = len(text)
        if self._quick is not None and self._quick.search(text) is None:
            matches: list[re.Match[Chunk]] = []
        else:
            matches = list(self._pattern.finditer(text, start))
        cut, compress = (end, False) if final else self._hold_from(text, start, matches)
        out: list[Chunk] = []
        position = start
        for match in matches:
            first, last = match.span()
            if first >= cut:
                break
            if last > cut:
                if last == end and self._may_grow(match.group()):
                    break  # a shape the whole text may continue (masked or not, see above)
                cut = last
            out.append(text[position:first])
            replaced = self._replace(match)
            if replaced != match.group():
                self._masked += 1
            out.append(replaced)
            position = last
        out.append(text[position:cut])
        held = text[cut:]
        if compress:
            # A key too long to hold: its head (for the pattern to match it again from
            # its start) and its last characters (for its mask); what lies between
            # matched the key's repeated class and is no longer needed.
            held = held[: self._run_head] + held[-KEEP:]
        self._held = held
        self._behind = text[max(0, cut - _LOOK_BEHIND) : cut]
        return self._alphabet.empty.join(out)

    def _may_grow(self, found: Chunk) -> bool:
        """Whether a match that ends where the text does may go on in the next piece:
        a key shape may; a value and a complete private-key block may not."""
        return found not in self._literal and not found.startswith(self._alphabet.pem_begin)

    def _hold_from(
        self, text: Chunk, start: int, matches: list[re.Match[Chunk]]
    ) -> tuple[int, bool]:
        """Where the part that may still change begins, and whether it is one long key
        to hold in short."""
        alphabet = self._alphabet
        end = len(text)
        literal_from = self._literal_from(text, start)
        run_from = max(start, len(text.rstrip(alphabet.word)))
        oauth = len(alphabet.oauth)
        if run_from >= oauth and text[run_from - oauth : run_from] == alphabet.oauth:
            run_from = max(start, run_from - oauth)
        pem_from = self._pem_from(text, start)
        cut = min(literal_from, run_from, pem_from)
        if end - run_from > self._run_hold and pem_from >= run_from:
            # A shape begins a run at most a JSON escape (`\u001b`) after its start.
            for match in matches:
                first = match.start()
                if first > run_from + _LOOK_BEHIND:
                    break
                if (
                    first >= run_from
                    and match.end() == end
                    and self._may_grow(match.group())
                    and _starts_word(text, first)
                ):
                    return first, True
            cut = min(literal_from, pem_from)
        return max(cut, start), False

    def _literal_from(self, text: Chunk, start: int) -> int:
        """Where the earliest tail of `text` that is the start of a secret value (in one
        of its literal forms) begins: the end of `text` when none is. Only such a tail
        may become a value with the next piece; the rest goes on at once."""
        end = len(text)
        low = max(start, end - self._literal_hold)
        found = end
        for first in self._firsts:
            at = text.find(first, low, found)
            while at >= 0:
                tail = text[at:]
                if any(form.startswith(tail) for form in self._literal):
                    found = at
                    break
                at = text.find(first, at + 1, found)
        return found

    def _pem_from(self, text: Chunk, start: int) -> int:
        """Where an unfinished private-key block begins (the end of `text`: none)."""
        alphabet = self._alphabet
        end = len(text)
        begin = text.find(alphabet.pem_begin, max(start, end - PEM_HOLD))
        while begin >= 0:
            head = alphabet.pem_head.match(text, begin)
            if head is None:  # `-----BEGIN` and no space after it
                if end - begin == len(alphabet.pem_begin):
                    return begin
                begin = text.find(alphabet.pem_begin, begin + 1)
                continue
            after = head.end()
            if after == end:
                return begin
            if text[begin:after].endswith(alphabet.pem_label):
                dashes = text[after : after + len(alphabet.dashes)]
                if len(dashes) < len(alphabet.dashes) and alphabet.dashes.startswith(dashes):
                    return begin
                if dashes == alphabet.dashes and alphabet.pem.match(text, begin) is None:
                    return begin
            begin = text.find(alphabet.pem_begin, begin + 1)
        return end


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


def masked(text: str) -> str:
    """`text` with every secret this process knows of masked (`for_process`)."""
    return for_process().mask_text(text)


def clip(text: str, limit: int, *, end: bool = False) -> str:
    """The first `limit` characters of `text` masked (its last, with `end`).

    Every cut of run data goes through here or masks first: cut first, a secret across
    the cut leaves a part of it, which no pattern recognises, so the masking that comes
    when the text is written keeps it. The same holds for any rewrite of the text
    (folding whitespace, lower-casing): mask, then rewrite.
    """
    text = masked(text)
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return text[-limit:] if end else text[:limit]


@functools.cache
def for_process() -> Redactor:
    """The redactor for this process's environment (and remembered values)."""
    named: dict[str, str] = dict(os.environ)
    named.update({f"FABRO_INPUT_{k}": v for k, v in _remembered.items()})
    values = set(secret_values(named)) | _literal
    return Redactor(sorted(values, key=len, reverse=True))
