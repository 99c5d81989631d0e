"""The redactor's RE2 pre-scan only skips text with nothing to mask: with it or without
it, every input masks to the same bytes."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from fabro_git import redact

SECRETS = ["plain-env-secret-value", 'with "quote" and ü-12345']
PIECES = [
    b"sk-" + b"A" * 24,
    b"ghp_" + b"b" * 36,
    b"github_pat_" + b"c" * 30,
    b"xoxb-0123456789ab",
    b"AKIA" + b"Q" * 16,
    b"glpat-" + b"d" * 20,
    b"AIza" + b"e" * 35,
    b"ya29." + b"f" * 20,
    b"sk_live_" + b"g" * 16,
    b"hf_" + b"h" * 30,
    b"npm_" + b"i" * 36,
    b"-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
    b"-----BEGIN OPENSSH PRIVATE KEY-----",
    b"plain-env-secret-value",
    'with "quote" and ü-12345'.encode(),
    'with \\"quote\\" and ü-12345'.encode(),
    b"risk-assessment-",
    b"\\n",
    b"\xff\xfe",
    b"\n",
    b" ",
    b"x",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.binary(max_size=12), max_size=20))
def test_the_pre_scan_never_changes_what_is_masked(parts: list[bytes]) -> None:
    data = b"".join(parts)
    quick = redact.Redactor(SECRETS)
    assert quick._quick is not None
    slow = copy.copy(quick)
    slow._quick = None
    assert quick.mask_bytes(data) == slow.mask_bytes(data)
    assert quick.found_in(data) == slow.found_in(data)
