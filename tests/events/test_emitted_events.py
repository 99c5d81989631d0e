"""The events the code emits, read from the code itself: every one is modelled, and
every property it passes is a field of the event's Struct.

The scan finds the event Structs of `fabro_git.events.catalogue` constructed anywhere in
fabro_git, and any `emit("name", ...)` call that passes an event by name (there must be
none: `Emit` takes a Struct, so mypy checks each property); nothing here is a hand-kept
list of events.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from helpers import parsed

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


def _catalogue_names(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The catalogue Structs a module imports (local name → class name), and the names
    it binds the catalogue module itself to."""
    classes: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            local = alias.asname or alias.name
            if node.module == "fabro_git.events.catalogue" and alias.name in BY_CLASS:
                classes[local] = alias.name
            elif node.module == "fabro_git.events" and alias.name == "catalogue":
                modules.add(local)
    return classes, modules


def _struct_called(func: ast.expr, classes: dict[str, str], modules: set[str]) -> str | None:
    if isinstance(func, ast.Name):
        return classes.get(func.id)
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in modules
        and func.attr in BY_CLASS
    ):
        return func.attr
    return None


@functools.cache
def emitted_in_code() -> tuple[Emitted, ...]:
    found: list[Emitted] = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "events" and path.name == "catalogue.py":
            continue
        tree = parsed(path)
        classes, modules = _catalogue_names(tree)
        rel = path.relative_to(ROOT.parent)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            where = f"{rel}:{node.lineno}"
            struct = _struct_called(node.func, classes, modules)
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if struct is not None:
                found.append(Emitted(BY_CLASS[struct].NAME, where, keywords, typed=True))
            elif (
                name is not None
                and name.endswith("emit")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(Emitted(node.args[0].value, where, keywords, typed=False))
    return tuple(found)


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


def test_every_event_is_emitted_as_its_struct() -> None:
    by_name = [f"{e.where}: {e.event}" for e in emitted_in_code() if not e.typed]
    assert by_name == []
