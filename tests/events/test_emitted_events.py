"""The events the code emits, read from the code itself: every one is modelled, and
every property it passes is a field of the event's Struct.

The scan finds the event Structs of `fabro_git.events.catalogue` constructed anywhere in
fabro_git, and the names passed to an `emit("name", ...)` call that has not moved to a
Struct yet; nothing here is a hand-kept list of events.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import fabro_git
from fabro_git.events.catalogue import CATALOGUE

ROOT = Path(fabro_git.__file__).parent
BY_CLASS = {cls.__name__: cls for cls in CATALOGUE.values()}


@dataclass(frozen=True)
class Emitted:
    event: str
    where: str
    keywords: tuple[str, ...]
    typed: bool


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def emitted_in_code() -> list[Emitted]:
    found: list[Emitted] = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "events" and path.name == "catalogue.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(ROOT.parent)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            where = f"{rel}:{node.lineno}"
            if name in BY_CLASS:
                found.append(Emitted(BY_CLASS[name].NAME, where, keywords, typed=True))
            elif (
                name is not None
                and name.endswith("emit")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(Emitted(node.args[0].value, where, keywords, typed=False))
    return found


ENVELOPE = {"node_id", "node_label", "stage_id", "session_id", "parent_session_id", "actor"}


def test_the_scan_sees_the_engine_emit() -> None:
    events = {e.event for e in emitted_in_code()}
    assert {
        "stage.started",
        "stage.completed",
        "parallel.branch.started",
        "run.completed",
    } <= events


def test_every_emitted_event_is_modelled() -> None:
    unknown = [f"{e.where}: {e.event}" for e in emitted_in_code() if e.event not in CATALOGUE]
    assert unknown == []


def test_every_property_passed_is_a_field_of_the_event() -> None:
    problems = []
    for e in emitted_in_code():
        fields = set(CATALOGUE[e.event].__struct_fields__)
        allowed = fields if e.typed else fields | ENVELOPE
        problems += [
            f"{e.where}: {e.event} has no property {k!r}" for k in e.keywords if k not in allowed
        ]
    assert problems == []
