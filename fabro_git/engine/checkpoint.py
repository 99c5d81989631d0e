"""The checkpoint: everything `resume` needs, stored as `checkpoint.json` on the meta ref.

History lives in the event segments and the per-node directories, which are only ever
added. The checkpoint itself holds per-node maps (visits, outcomes) and the context,
which grow with the run; writing them whole at every stage would make stage 1,000 cost
more than stage 10. So most stage checkpoints are written as a delta (`CheckpointDelta`):
the scalar fields whole, and of the maps only the entries that changed since a complete
checkpoint, which the delta names by its meta commit (an ancestor on the same ref). A
complete one is written at least every `FULL_EVERY` stages (more often early in a run:
`DeltaWriter._interval`), at the start of each process and for every snapshot other than
a stage checkpoint (`init`, `finalize`), so a finished run's `checkpoint.json` is always
complete. `read_checkpoint` is the one reader: it puts a delta back together with its
base.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, TypeVar, overload

import msgspec

from fabro_git.events.envelope import format_ts
from fabro_git.jsondata import JsonObject

if TYPE_CHECKING:
    from _typeshed import SupportsKeysAndGetItem

    from fabro_git.config.recorded import RecordedConfig
    from fabro_git.config.run_config import RunSection
    from fabro_git.engine.outcome import StageRecord, Usage

    StageRecords = dict[str, StageRecord]
else:
    # Read as stored, key for key and value for value: a record an older version
    # wrote loads and is written back byte for byte.
    StageRecords = dict[str, JsonObject]

FORMAT_VERSION = 1


# A git object id as a record holds it: a stored run is data from elsewhere (a fetched
# ref), and an id is handed to git, where `--output=...` would be an option.
ObjectId = Annotated[str, msgspec.Meta(pattern="^(?:[0-9a-f]{40}|[0-9a-f]{64})$")]


def now_iso() -> str:
    """The time now as checkpoints and manifests write it (UTC, milliseconds)."""
    return format_ts(time.time_ns() // 1_000_000)


class PendingCommit(msgspec.Struct, kw_only=True):
    """A run-branch commit the cycle had decided on but may not have made before a crash."""

    tree: ObjectId
    parent: ObjectId
    node_id: str
    status: str
    completed: int
    extra_parents: list[ObjectId] = msgspec.field(default_factory=list)


class TokenTotals(msgspec.Struct, kw_only=True):
    """The tokens a run's model calls used, summed over every stage (every scope)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, usage: Usage) -> None:
        """Add a stage's usage (`engine.outcome.Usage`: counts that may be None)."""
        self.input_tokens += usage.input_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.reasoning_tokens += usage.reasoning_tokens or 0
        self.cache_read_tokens += usage.cache_read_tokens or 0
        self.cache_write_tokens += usage.cache_write_tokens or 0


_V = TypeVar("_V")
_T = TypeVar("_T")

if TYPE_CHECKING:
    # What a dict is made or updated from: a mapping, or (key, value) pairs.
    _Items = SupportsKeysAndGetItem[str, _V] | Iterable[tuple[str, _V]]


class TrackedMap(dict[str, _V]):
    """A checkpoint's map that notes the keys set or removed in it, so a delta looks at
    those alone rather than at every entry of the run (`DeltaWriter`).

    Every method that changes a dict is overridden: the C ones (`update`, `|=`,
    `setdefault` ...) do not go through `__setitem__`. A key noted may hold what it held
    before; that only costs a comparison."""

    __slots__ = ("_generation", "_touched")

    def __init__(self, values: _Items[_V] = (), /) -> None:
        super().__init__(values)
        self._touched: set[str] = set()
        self._generation = 0

    def track(self) -> int:
        """Start noting changes afresh; the number to pass to `touched_since`."""
        self._touched = set()
        self._generation += 1
        return self._generation

    def touched_since(self, generation: int) -> set[str] | None:
        """The keys set or removed since `track()` gave `generation` (None: it was
        called again since, by someone else, and the keys before it are lost)."""
        return self._touched if generation == self._generation else None

    def __reduce__(self) -> tuple[type, tuple[dict[str, _V]]]:
        # A copy (copy, deepcopy, pickle) is a new map: it notes keys from its making on.
        return TrackedMap, (dict(self),)

    def __setitem__(self, key: str, value: _V) -> None:
        self._touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._touched.add(key)
        super().__delitem__(key)

    @overload
    def pop(self, key: str, /) -> _V: ...
    @overload
    def pop(self, key: str, default: _V, /) -> _V: ...
    @overload
    def pop(self, key: str, default: _T, /) -> _V | _T: ...
    def pop(self, key: str, /, *default: object) -> object:
        self._touched.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, _V]:
        item = super().popitem()
        self._touched.add(item[0])
        return item

    def setdefault(self, key: str, /, *default: _V) -> _V:
        self._touched.add(key)
        return super().setdefault(key, *default)

    def update(
        self,
        other: _Items[_V] = (),
        /,
        **kwargs: _V,
    ) -> None:
        items = dict(other, **kwargs)
        self._touched.update(items)
        super().update(items)

    def __ior__(self, other: _Items[_V]) -> TrackedMap[_V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self._touched.update(self)
        super().clear()


class Checkpoint(msgspec.Struct, kw_only=True):
    format_version: int = FORMAT_VERSION
    status: str = "running"
    timestamp: str = ""
    current_node: str | None = None
    next_node_id: str | None = None
    completed_nodes: list[str] = msgspec.field(default_factory=list)
    node_visits: dict[str, int] = msgspec.field(default_factory=TrackedMap)
    node_retries: dict[str, int] = msgspec.field(default_factory=TrackedMap)
    node_outcomes: StageRecords = msgspec.field(default_factory=TrackedMap)
    context_values: JsonObject = msgspec.field(default_factory=TrackedMap)
    git_commit_sha: ObjectId | None = None
    pending_commit: PendingCommit | None = None
    loop_failure_signatures: dict[str, int] = msgspec.field(default_factory=TrackedMap)
    restart_failure_signatures: dict[str, int] = msgspec.field(default_factory=TrackedMap)
    stage_index: int = 0
    # The last serial of each qualified node's stage executions (`<node>@<serial>` is
    # the stage_id): counted over the whole run, so loop restarts, branches, child
    # workflows and resumes never give two executions one stage_id.
    stage_serials: dict[str, int] = msgspec.field(default_factory=TrackedMap)
    event_segments: int = 0
    last_event_id: str | None = None
    error: str | None = None
    started_at: str = ""
    finished_at: str | None = None
    active_ms: int = 0
    artifact_count: int = 0
    # What the run's model calls cost so far, by the catalogue's prices (every scope).
    total_cost: float = 0.0
    tokens: TokenTotals = msgspec.field(default_factory=TokenTotals)

    def spend(self, usage: Usage) -> None:
        """Count a model call's usage (`engine.outcome.Usage`) in the run's cost and tokens."""
        self.total_cost += usage.cost or 0.0
        self.tokens.add(usage)

    def __post_init__(self) -> None:
        # Decoded, or given plain dicts: the maps become TrackedMaps before anyone
        # holds them. One assigned later is a plain dict until the next decode; its
        # deltas compare it whole.
        for name in DELTA_MAPS:
            value = getattr(self, name)
            if type(value) is not TrackedMap:
                setattr(self, name, TrackedMap(value))


class RecordedOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options a run started with, as its manifest's `settings` records them beside
    its `[run]` table (`config`). Read by `read_options`, never strictly: a value that
    does not fit (a later version's, or a fetched run's written by hand) reads as the
    default, as an unreadable key of the table is left out."""

    dry_run: bool = False
    auto_approve: bool = False
    retro: bool = True
    retro_narrative: bool = False
    model: str | None = None
    provider: str | None = None
    setup_commands: tuple[str, ...] = ()
    exclude_globs: tuple[str, ...] = ()
    # Not a setting: what did not fit, in words, for the run's notices.
    unreadable: tuple[str, ...] = ()


def read_options(settings: JsonObject) -> RecordedOptions:
    """The options `settings` records: each that fits its type, else its default and a
    line in `unreadable`."""
    fitted: JsonObject = {}
    unreadable: list[str] = []
    for field in msgspec.structs.fields(RecordedOptions):
        if field.name == "unreadable" or field.encode_name not in settings:
            continue
        value = settings[field.encode_name]
        try:
            msgspec.convert(value, field.type)
        except msgspec.ValidationError as exc:
            unreadable.append(f"settings.{field.name}: {str(exc)[0].lower()}{str(exc)[1:]}")
        else:
            fitted[field.encode_name] = value
    options = msgspec.convert(fitted, RecordedOptions)
    return msgspec.structs.replace(options, unreadable=tuple(unreadable))


class Manifest(msgspec.Struct, kw_only=True, dict=True):
    format_version: int = FORMAT_VERSION
    run_id: str
    workflow_name: str
    workflow_slug: str
    workflow_path: str | None
    goal: str
    inputs: dict[str, str]
    labels: dict[str, str]
    base_sha: ObjectId
    base_branch: str | None
    run_branch: str | None
    meta_ref: str
    created_at: str
    source_directory: str
    origin_url: str | None
    in_place: bool
    settings: JsonObject
    tool_version: str
    # The workflow file's path inside its root: `graphs/` keeps the files it names by
    # the same relative paths (None for runs recorded before `graphs/` existed).
    workflow_file: str | None = None
    # Set on a run made by `fork` or `rewind`: {run_id, node, visit, checkpoint} of the
    # checkpoint it started from.
    forked_from: JsonObject | None = None
    # Set on a run that `rewind` replaced: the id of the run that carries on from it.
    superseded_by: str | None = None

    @functools.cached_property
    def recorded_config(self) -> RecordedConfig:
        """`settings["config"]`, the run's effective `[run]` table, read once: what this
        version could read of it, and what it could not (`read_recorded`)."""
        from fabro_git.config.recorded import read_recorded

        return read_recorded(self.settings.get("config"))

    @functools.cached_property
    def options(self) -> RecordedOptions:
        """The options the run started with (`settings` beside `config`), typed."""
        return read_options(self.settings)

    @property
    def run_config(self) -> RunSection:
        """The run's effective `[run]` configuration, typed."""
        return self.recorded_config.run


_encoder = msgspec.json.Encoder(order="deterministic")


def encode(obj: object) -> bytes:
    return msgspec.json.format(_encoder.encode(obj), indent=2) + b"\n"


def decode_checkpoint(data: bytes) -> Checkpoint:
    """A complete checkpoint's bytes; `read_checkpoint` reads any checkpoint.json."""
    if is_delta(data):
        raise msgspec.DecodeError("a checkpoint delta read as a complete checkpoint")
    return msgspec.json.decode(data, type=Checkpoint)


# The checkpoint's maps that a delta carries entry by entry.
DELTA_MAPS = (
    "node_visits",
    "node_retries",
    "node_outcomes",
    "context_values",
    "loop_failure_signatures",
    "restart_failure_signatures",
    "stage_serials",
)
# A complete checkpoint at least this often, so a reader applies one delta to one base.
FULL_EVERY = 50
# And at most this often.
FULL_EVERY_LEAST = 8


class CheckpointDelta(Checkpoint, kw_only=True):
    """A stage checkpoint written as the change from a complete one: the scalar fields
    whole (where a complete checkpoint has them), of the maps only the entries that
    changed, of completed_nodes only the ones after the base's."""

    # The meta commit whose checkpoint.json is complete and is the base of this one.
    delta_of: str
    # Keys of each map (by field name) that the base has and this checkpoint no longer has.
    removed: dict[str, list[str]] = msgspec.field(default_factory=dict)


class _Probe(msgspec.Struct):
    delta_of: str | None = None


def is_delta(data: bytes) -> bool:
    return msgspec.json.decode(data, type=_Probe).delta_of is not None


def apply_delta(base: Checkpoint, delta: CheckpointDelta) -> Checkpoint:
    """The complete checkpoint that `delta` stands for."""
    fields = {name: getattr(delta, name) for name in Checkpoint.__struct_fields__}
    for name in DELTA_MAPS:
        merged: TrackedMap[object] = TrackedMap(getattr(base, name))
        for key in delta.removed.get(name, ()):
            merged.pop(key, None)
        merged.update(fields[name])
        fields[name] = merged
    fields["completed_nodes"] = [*base.completed_nodes, *delta.completed_nodes]
    return Checkpoint(**fields)


def read_checkpoint(
    read_file: Callable[[str, str], bytes | None], meta_sha: str
) -> Checkpoint | None:
    """The complete checkpoint of the meta snapshot `meta_sha` (None if it has none).

    `read_file(commit, path)` reads a file of a meta commit. msgspec.DecodeError when a
    file is not a checkpoint.
    """
    from fabro_git.store.runs import CHECKPOINT as CHECKPOINT_FILE

    data = read_file(meta_sha, CHECKPOINT_FILE)
    if data is None:
        return None
    if not is_delta(data):
        return msgspec.json.decode(data, type=Checkpoint)
    delta = msgspec.json.decode(data, type=CheckpointDelta)
    base_data = read_file(delta.delta_of, CHECKPOINT_FILE)
    if base_data is None or is_delta(base_data):
        raise msgspec.DecodeError(
            f"the checkpoint of {meta_sha[:12]} is a delta on {delta.delta_of[:12]}, "
            "which holds no complete checkpoint"
        )
    return apply_delta(decode_checkpoint(base_data), delta)


class DeltaWriter:
    """Decides, for each stage checkpoint, whether to write it whole or as a delta, and
    makes the delta.

    An entry counts as unchanged only when it would encode to the same bytes as in the
    base, so putting a delta back together gives exactly the checkpoint that was meant
    (`1 == 1.0 == True` in Python, not in JSON). Encoding every entry at every stage would
    cost what writing the whole checkpoint did, so the cheap cases are decided first: the
    very object the base held, or a string, int or bool equal to the base's and of the
    same type. Anything else is encoded.

    The very object is unchanged because the engine replaces an entry, never changes one
    in place: a stage's record is made whole when the stage ends, handlers see the
    records as read-only mappings, and the context's copy (`context.CheckpointCopy`)
    replaces the values a stage set. Comparing each held record with its copy instead
    cost a deep comparison of every record of the run at every stage (about a
    millisecond at 1,000 nodes). For the same reason the base keeps the objects it held,
    not their encodings: a held object encodes as it did when the base was written, so
    it is encoded only when an entry that is not the very object must be compared with
    it (encoding and decoding every entry of every complete checkpoint cost about 5 ms
    at 1,000 nodes).

    Which entries are looked at at all: a map that is still the very `TrackedMap` the
    base held names the keys set or removed since, and only those are compared.
    Comparing every map whole cost about 0.3 ms a stage at 1,000 nodes, the largest part
    of what made stage 1,000 cost more than stage 10. A map assigned whole since the
    base (a resume's context, a branch's) is compared whole once; if it is a
    `TrackedMap`, from then on the keys that differed then and those it names after.
    """

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self.full_every = full_every
        self._base_sha: str | None = None
        # The maps' entries as the base held them: the very objects.
        self._base_entries: dict[str, dict[str, object]] = {}
        # A map whose values are all of one scalar type: that type and a copy of it.
        self._base_plain: dict[str, tuple[type, dict[str, object]]] = {}
        self._base_completed: list[str] = []
        self._since_base = 0
        # The maps whose changes since the base are known without comparing them whole.
        self._tracked: dict[str, _Tracking] = {}

    def delta(self, cp: Checkpoint) -> CheckpointDelta | None:
        """`cp` as a delta on the last complete checkpoint; None when it is to be whole."""
        if self._base_sha is None or self._since_base + 1 >= self._interval(cp):
            return None
        done = len(self._base_completed)
        if cp.completed_nodes[:done] != self._base_completed:
            return None  # the walk went back (a checkpoint git refused): start afresh
        changed: dict[str, dict[str, object]] = {}
        removed: dict[str, list[str]] = {}
        for name in DELTA_MAPS:
            current: dict[str, object] = getattr(cp, name)
            base = self._base_entries[name]
            keys = self._keys_to_compare(name, current)
            if keys is not None:
                changed[name] = {
                    key: current[key]
                    for key in keys
                    if key in current and not _unchanged(current[key], base.get(key, _MISSING))
                }
                gone = {key for key in keys if key in base and key not in current}
            else:
                changed[name], gone = self._compare_whole(name, current)
                if isinstance(current, TrackedMap):
                    # From here on its changes are known: those just found, and the
                    # keys set or removed after.
                    self._tracked[name] = _Tracking(
                        current, current.track(), {*changed[name], *gone}
                    )
            if gone:
                removed[name] = sorted(gone)
        fields = {name: getattr(cp, name) for name in Checkpoint.__struct_fields__}
        fields.update(changed, completed_nodes=cp.completed_nodes[done:])
        return CheckpointDelta(**fields, delta_of=self._base_sha, removed=removed)

    def _interval(self, cp: Checkpoint) -> int:
        """How many snapshots apart complete checkpoints are, at this point of the run.

        A delta holds every stage's record since its base, so it grows by about one
        record a stage, while a complete checkpoint holds the records of every stage so
        far. Over an interval of k stages, at stage n, a stage writes about n / k + k / 2
        records: least at k = sqrt(2n). A run of 50 stages then writes a complete one
        every 8 to 10 stages rather than deltas that grow to the whole checkpoint; at
        1,000 stages the interval is 44, about `full_every`, which bounds it."""
        best = math.isqrt(2 * len(cp.completed_nodes))
        return min(self.full_every, max(FULL_EVERY_LEAST, best))

    def _keys_to_compare(self, name: str, current: dict[str, object]) -> set[str] | None:
        """The keys of the map `name` that may differ from the base: those noted since it
        was last compared whole (None: it must be compared whole)."""
        tracking = self._tracked.get(name)
        if tracking is None or tracking.tracked is not current:
            return None
        touched = tracking.tracked.touched_since(tracking.generation)
        if touched is None:
            return None
        return touched | tracking.differed

    def _compare_whole(
        self, name: str, current: dict[str, object]
    ) -> tuple[dict[str, object], set[str]]:
        """The entries of the map `name` that differ from the base, and the base's keys it
        no longer has, entry by entry."""
        base = self._base_entries[name]
        plain = self._base_plain.get(name)
        if plain is not None and set(map(type, current.values())) <= {plain[0]}:
            # Every value, here and in the base, of one type (int or str): equal
            # values encode to equal bytes, and the items that differ are found by
            # a set difference, in C, rather than entry by entry.
            changed = dict(current.items() - plain[1].items())
        else:
            changed = _changed_entries(current, base)
        return changed, base.keys() - current.keys()

    def written(self, cp: Checkpoint, meta_sha: str, *, whole: bool) -> None:
        """A snapshot holding `cp` is now in git as `meta_sha`."""
        if not whole:
            self._since_base += 1
            return
        self._base_sha = meta_sha
        self._base_entries = {name: dict(getattr(cp, name)) for name in DELTA_MAPS}
        self._base_plain = {}
        self._tracked = {}
        for name in DELTA_MAPS:
            values: dict[str, object] = getattr(cp, name)
            kinds = set(map(type, values.values()))
            if len(kinds) == 1 and kinds <= {int, str}:
                self._base_plain[name] = (kinds.pop(), dict(values))
            if isinstance(values, TrackedMap):
                self._tracked[name] = _Tracking(values, values.track(), set())
        self._base_completed = list(cp.completed_nodes)
        self._since_base = 0


class _Tracking(msgspec.Struct):
    """A map of the checkpoint whose changes since the base are known: the very map, the
    `TrackedMap.track` generation it notes keys for, and the keys that differed from the
    base when it was last compared whole (none for the base's own map)."""

    tracked: TrackedMap[object]
    generation: int
    differed: set[str]


_SCALARS = (str, int, bool)
_MISSING = object()


def _changed_entries(current: dict[str, object], base: dict[str, object]) -> dict[str, object]:
    """The entries of `current` that would not encode as they did in the base.

    A run's maps mostly grow, so the base's keys usually lead `current` in the same
    order. Then the cheap test of `_unchanged` (the very object the base held) runs over
    all of them in C, and only the entries it fails are looked at one by one; anything
    else takes the entry-by-entry path.
    """
    n = len(base)
    keys = list(current)
    if keys[:n] != list(base):
        return {k: v for k, v in current.items() if not _unchanged(v, base.get(k, _MISSING))}
    values = list(current.values())
    held_values = list(base.values())
    held = map(operator.is_, values, held_values)
    changed: dict[str, object] = {}
    for i in itertools.compress(range(n), map(operator.not_, held)):
        if not _unchanged(values[i], held_values[i]):
            changed[keys[i]] = values[i]
    for i in range(n, len(keys)):
        changed[keys[i]] = values[i]
    return changed


def _unchanged(value: object, base: object) -> bool:
    """Whether `value` encodes as `base` (the object the base held; `_MISSING` for none)."""
    if base is _MISSING:
        return False
    kind = type(value)
    if kind in _SCALARS or value is None:
        # A str, int or bool (not a subclass) encodes and decodes to its own type and
        # value; floats are left to the bytes: -0.0 == 0.0.
        return type(base) is kind and base == value
    if value is base:
        return True
    return _entry_encoder.encode(value) == _entry_encoder.encode(base)


_entry_encoder = msgspec.json.Encoder(order="deterministic")


def decode_manifest(data: bytes) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)
