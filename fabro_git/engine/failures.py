"""Failure signatures and the circuit breaker that stops loops repeating one failure.

A signature is `node|class|normalised message`: lowercased, hex runs and digits folded,
cut to 240 characters, so the same root cause groups together even when line numbers or
timestamps differ. Only deterministic and structural failures count.
"""

from __future__ import annotations

import re

from fabro_git import redact
from fabro_git.engine.outcome import DETERMINISTIC, STRUCTURAL, TRANSIENT

_HEX = re.compile(r"\b(?:0x)?[0-9a-f]{7,}\b")
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")

TRACKED_CLASSES = (DETERMINISTIC, STRUCTURAL)


def normalize_message(message: str) -> str:
    # Masked before it is folded: a secret lower-cased, or with its digits folded, is
    # one no pattern recognises any more.
    text = redact.masked(message).strip().lower()
    text = _HEX.sub("<hex>", text)
    text = _DIGITS.sub("<n>", text)
    text = _SPACE.sub(" ", text)
    return text[:240]


def failure_signature(node_id: str, failure_class: str | None, message: str | None) -> str:
    return f"{node_id}|{failure_class or DETERMINISTIC}|{normalize_message(message or '')}"


def is_tracked(failure_class: str | None) -> bool:
    return (failure_class or DETERMINISTIC) in TRACKED_CLASSES


def may_cross_loop_restart(failure_class: str | None) -> bool:
    return failure_class == TRANSIENT
