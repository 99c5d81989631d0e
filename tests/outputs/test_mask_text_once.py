"""An offloaded reply is two files: its text (`response.md`) and its JSON string form
(the value's file). One secret scan of the JSON form answers for both, when that is
provably enough; otherwise each is scanned."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fabro_git.engine.recorder import _is_utf8_of, _masked_once
from fabro_git.redact import Redactor

PLAIN = "svcK3yQ9zT2wM4rXp7"  # nothing in it that JSON escapes
QUOTED = 'pwK3yQ9"zT2\\wM4r'  # a quote and a backslash

# Pieces of secrets, of credential shapes and of what JSON escapes, so random texts
# often hold a secret whole, or cut by an escaped character.
FRAGMENTS = [
    PLAIN,
    PLAIN[:7],
    PLAIN[7:],
    QUOTED,
    "ghp_",
    "npm_",
    "sk-",
    "rk_live_",
    "AKIA",
    "a1B2c3D4e5F6g7H8i9J0",
    "ABCDEFGHIJKLMNOP",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "\n",
    "\r",
    "\t",
    "\f",
    "\b",
    "\x01",
    "\x1b",
    "\x7f",
    '"',
    "\\",
    "u001b",
    " ",
    "é",
    "\u2028",
]

texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40).map(
    "".join
)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_a_clean_json_form_means_a_clean_text(text: str) -> None:
    redactor = Redactor([PLAIN])
    encoded = msgspec.json.encode(text)
    raw = text.encode("utf-8", "surrogatepass")
    if redactor.clean_with_text(encoded):
        assert redactor.mask_bytes(encoded) == encoded
        assert redactor.mask_bytes(raw) == raw


def test_an_ordinary_text_is_clean_by_its_json_form() -> None:
    """So the property above is not vacuous: its branch is taken for ordinary text."""
    assert Redactor([PLAIN]).clean_with_text(msgspec.json.encode('plain "words", é\n'))


@settings(max_examples=100, deadline=None)
@given(texts)
def test_a_secret_json_escapes_means_each_file_is_scanned(text: str) -> None:
    assert not Redactor([QUOTED]).clean_with_text(msgspec.json.encode(text))


def test_the_one_scan_is_taken_when_it_can_be_and_refused_when_it_finds_anything() -> None:
    redactor = Redactor([PLAIN])
    reply = "".join(f"line {i} of a long reply\n" for i in range(10_000))
    assert redactor.clean_with_text(msgspec.json.encode(reply))
    for held in (PLAIN, "\fghp_" + "a1B2" * 9, "x\x1bAKIAABCDEFGHIJKLMNOP"):
        assert not redactor.clean_with_text(msgspec.json.encode(reply + held))
    assert not Redactor([PLAIN[:9] + "\n" + PLAIN[9:]]).clean_with_text(b'"ordinary"')


def test_a_file_is_paired_with_a_text_only_when_it_is_that_text_in_utf8() -> None:
    text = "réponse\n" * 20_000
    assert _is_utf8_of(text.encode(), text)
    assert not _is_utf8_of(text.encode()[:-1] + b"!", text)
    assert not _is_utf8_of(text.encode()[:-1], text)
    ascii_text = "reply\n" * 20_000
    assert _is_utf8_of(ascii_text.encode(), ascii_text)
    assert not _is_utf8_of(ascii_text.encode() + b" ", ascii_text)
    assert not _is_utf8_of(b"x" * 10, "\udc80" * 5)  # not encodable: no pair


def test_a_premasked_file_is_taken_only_for_the_very_object_scanned() -> None:
    calls: list[int] = []

    def mask(data: bytes) -> bytes:
        calls.append(len(data))
        return data.replace(b"secret", b"***")

    big = b"x" * 200_000 + b"secret"
    twin = bytes(bytearray(big))  # equal bytes, another object
    premasked = {id(big): (big, big.replace(b"secret", b"###"))}
    masked = _masked_once(mask, {"a.json": big}, premasked)
    assert calls == [] and masked["a.json"].endswith(b"###")
    # An entry under the id of another object is not that object's result.
    masked = _masked_once(mask, {"b.json": twin}, {id(twin): (big, b"wrong")})
    assert calls == [len(twin)] and masked["b.json"].endswith(b"***")
