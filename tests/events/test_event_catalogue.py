"""Every event Struct agrees with the seed: names, order, required-ness, JSON types.

This reads the seed page, so a change to the contract or to a Struct that breaks their
agreement fails here, naming the event and the field.
"""

from __future__ import annotations

import msgspec
import msgspec.inspect as mi
import pytest
from event_contract.seed import Catalogue, PropSpec

from fabro_git.events import catalogue as catalogue_module
from fabro_git.events.catalogue import CATALOGUE, NOT_EMITTED
from fabro_git.events.envelope import Envelope, EventProps


def _strip_none(t: mi.Type) -> tuple[mi.Type, bool]:
    if isinstance(t, mi.UnionType):
        rest = tuple(x for x in t.types if not isinstance(x, mi.NoneType))
        has_none = len(rest) != len(t.types)
        if len(rest) == 1:
            return rest[0], has_none
        return mi.UnionType(rest), has_none
    return t, False


def _type_problem(
    t: mi.Type, spec: PropSpec, nested: dict[str, dict[str, PropSpec]], path: str
) -> list[str]:
    match spec.type:
        case "string":
            if isinstance(t, mi.LiteralType):
                if spec.enum is not None and set(t.values) != set(spec.enum):
                    return [f"{path}: Literal{list(t.values)} != seed values {list(spec.enum)}"]
                return []
            if spec.enum is not None:
                return [f"{path}: seed enumerates {list(spec.enum)}; use a Literal"]
            ok = isinstance(t, mi.StrType)
        case "number":
            members = t.types if isinstance(t, mi.UnionType) else (t,)
            ok = all(isinstance(m, mi.IntType | mi.FloatType) for m in members)
        case "boolean":
            ok = isinstance(t, mi.BoolType)
        case "object":
            if isinstance(t, mi.StructType):
                return _struct_problems(t.cls, nested.get(spec.name), path)
            ok = isinstance(t, mi.DictType) and spec.name not in nested
        case "array":
            if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
                return _struct_problems(t.item_type.cls, nested.get(f"{spec.name}[]"), path + "[]")
            ok = isinstance(t, mi.ListType) and f"{spec.name}[]" not in nested
        case "string[]":
            ok = isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StrType)
        case "any":
            ok = isinstance(t, mi.AnyType)
        case _:
            return [f"{path}: unknown seed type {spec.type}"]
    return [] if ok else [f"{path}: {t!r} does not encode as seed type {spec.type}"]


def _field_problems(
    fields: tuple[mi.Field, ...],
    specs: dict[str, PropSpec],
    nested: dict[str, dict[str, PropSpec]],
    where: str,
) -> list[str]:
    problems: list[str] = []
    names = [f.name for f in fields]
    if names != list(specs):
        problems.append(f"{where}: fields {names} != seed properties {list(specs)}")
    for field in fields:
        spec = specs.get(field.name)
        if spec is None:
            continue
        path = f"{where}.{field.name}"
        inner, has_none = _strip_none(field.type)
        if not spec.optional:
            if not field.required:
                problems.append(f"{path}: required by the seed but has a default")
            if has_none:
                problems.append(f"{path}: required by the seed but accepts None")
        elif spec.nullable:
            if not (field.default is None and has_none):
                problems.append(f"{path}: optional in the seed, so must be `T | None = None`")
        elif spec.type in ("array", "string[]") and field.default_factory is not list:
            problems.append(f"{path}: seed omits it when empty; default to an empty list")
        problems += _type_problem(inner, spec, nested, path)
    return problems


def _struct_problems(
    cls: type[msgspec.Struct], specs: dict[str, PropSpec] | None, path: str
) -> list[str]:
    if specs is None:
        return []  # the seed documents no fields for this nested object
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return _field_problems(info.fields, specs, {}, path)


def test_the_unscoped_events_are_the_two_the_seed_names() -> None:
    """The contract checker keeps its own copy (the seed's words); the product's may not
    drift from it, since events it calls unscoped go out without node_id."""
    from event_contract.check import UNSCOPED_EVENTS as named_by_the_seed

    assert named_by_the_seed == catalogue_module.UNSCOPED_EVENTS


def test_catalogue_keys_match_names() -> None:
    for name, cls in CATALOGUE.items():
        assert name == cls.NAME


def test_every_struct_is_registered() -> None:
    defined = {
        obj
        for obj in vars(catalogue_module).values()
        if isinstance(obj, type) and issubclass(obj, EventProps) and obj is not EventProps
    }
    assert defined == set(CATALOGUE.values())


def test_every_seed_event_is_modelled_or_excluded(catalogue: Catalogue) -> None:
    assert set(CATALOGUE) | NOT_EMITTED == set(catalogue)
    assert not set(CATALOGUE) & NOT_EMITTED


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_struct_agrees_with_seed(name: str, catalogue: Catalogue) -> None:
    spec = catalogue[name]
    cls = CATALOGUE[name]
    config = cls.__struct_config__
    assert config.omit_defaults, f"{cls.__name__} must omit defaults"
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    problems = _field_problems(info.fields, spec.properties, spec.nested, name)
    assert problems == []


def test_the_agreement_check_can_fail(catalogue: Catalogue) -> None:
    """A Struct that drifts from the seed is caught, field by field."""

    class Drifted(EventProps, kw_only=True):
        index: int = 0  # required in the seed: must have no default
        duration_ms: str  # number in the seed
        status: str  # enumerated in the seed: must be a Literal
        preferred_label: str | None = None
        suggested_next_ids: list[str] = msgspec.field(default_factory=list)

    spec = catalogue["stage.completed"]
    info = mi.type_info(Drifted)
    assert isinstance(info, mi.StructType)
    problems = "\n".join(_field_problems(info.fields, spec.properties, spec.nested, "x"))
    assert "fields [" in problems
    assert "x.index: required by the seed but has a default" in problems
    assert "x.duration_ms" in problems and "seed type number" in problems
    assert "x.status: seed enumerates" in problems
    assert "x.suggested_next_ids: required by the seed but has a default" in problems


def test_envelope_fields_follow_the_seed(catalogue: Catalogue) -> None:
    fields = list(Envelope.__struct_fields__)
    seed = list(catalogue.envelope)
    # Seed order, with the two prose-only fields just before `properties`.
    assert fields == [*seed[:-1], "stage_id", "actor", "properties"]
    info = mi.type_info(Envelope)
    assert isinstance(info, mi.StructType)
    for field in info.fields:
        spec = catalogue.envelope.get(field.name)
        if spec is not None:
            assert field.required == (not spec.optional), field.name
