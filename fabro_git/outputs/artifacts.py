"""Large context values live in files: the context keeps a `file://` pointer to them.

A value whose JSON form is over OFFLOAD_THRESHOLD bytes would be copied into every
checkpoint that follows, every `stage.completed` event and every preamble; instead it is
written once to the run's artifact store and a pointer takes its place. The scratch copy
is the live one that stages and people read; the durable copy is on the meta ref,
written by the checkpoint after the stage. A resume (in this clone or another) writes
the meta ref's copies back into its own scratch dir and points the context at them.

Two files per offloaded value, one blob in git (same bytes, and a hard link in scratch):
- `artifacts/values/<node_slug>/<key>.json` (meta ref: `artifacts/<node_slug>/<key>.json`)
  is the value one stage visit set. The stage's record (`status.json`, `stage.completed`,
  the preamble's "See:" line) points here. Nothing overwrites it: a later stage setting
  the same key (every command sets `command.output`) writes its own, so no earlier
  value is lost. `artifact_count` counts these.
- `artifacts/values/<key>.json` (meta ref: `artifacts/<key>.json`) is the key's current
  value, the one the context points to: the layout the outputs spec shows. A later
  stage setting the key replaces it, and one nothing points to any more is removed at
  the next checkpoint.
Parallel branches may set the same key at once: their file names carry the branch
(`<key>@<branch>`).

A long model reply is text in a file from the start (`TextFile`: the provider's stream
goes to the stage's `response.md` in scratch), and is offloaded without being read into
memory: the scratch files get its JSON form, streamed a megabyte at a time, and git
keeps the reply once. On the meta ref the value is the raw text, `artifacts/<name>.md`
(the `.md` says so), the very blob of the stage's `response.md`; a resume turns it
back into the JSON file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO
from urllib.parse import quote

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue

# Bytes of a value's JSON form above which it is offloaded: 100 KiB, the seed's "100KB"
# as Fabro's engine reads it, so a value stays inline or not alike under both.
OFFLOAD_THRESHOLD = 100 * 1024

POINTER_PREFIX = "file://"
# The meta ref's suffix of an offloaded value kept as its raw text (`TextFile`).
TEXT_SUFFIX = ".md"
_TEXT_CHUNK = 1 << 20
_VALUES = ("artifacts", "values")


def artifact_name(key: str, tag: str | None = None) -> str:
    """A file name for `key`, safe on every file system and in a git tree: characters
    other than letters, digits and `-_.` are %-escaped, and a leading dot too. `tag`
    tells apart the same key set by parallel branches."""
    name = quote(key, safe="-_.")
    if tag:
        name = f"{name}@{quote(tag, safe='-_.')}"
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def encode_value(value: object) -> bytes:
    """A context value's serialised JSON form (anything else becomes its string form)."""
    return msgspec.json.encode(value, enc_hook=str)


class TextFile(msgspec.Struct, frozen=True):
    """A text context value held in a file rather than in memory: a model reply that
    streamed to disk. Offloading writes its JSON form from the file, and git keeps the
    file's bytes once (see the module docstring)."""

    path: str
    chars: int

    def __str__(self) -> str:
        return f"[{self.chars} characters in {self.path}]"


def offloads(value: object) -> bool:
    """Whether `value` is over the threshold, so `plan_stage` offloads it."""
    return isinstance(value, TextFile) or _large(value) is not None


def _large(value: object) -> bytes | None:
    """A value's JSON form when it is over the threshold (to offload), else None."""
    data = encode_value(value)
    return data if len(data) > OFFLOAD_THRESHOLD else None


def _json_text(source: Path, out: IO[bytes]) -> None:
    """Write the JSON string of the UTF-8 text in `source` to `out`, a chunk at a time:
    the bytes `encode_value` gives for the whole text (escaping is per character)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    out.write(b'"')
    with source.open("rb") as fh:
        while True:
            chunk = fh.read(_TEXT_CHUNK)
            text = decoder.decode(chunk, final=not chunk)
            if text:
                out.write(msgspec.json.encode(text)[1:-1])
            if not chunk:
                break
    out.write(b'"')


def pointer_name(value: object) -> str | None:
    """The artifact name a `file://` pointer names (`<key>` or `<node_slug>/<key>`),
    whichever scratch dir it points into; None for any other value."""
    if not isinstance(value, str) or not value.startswith(POINTER_PREFIX):
        return None
    path = Path(value[len(POINTER_PREFIX) :])
    if path.suffix != ".json":
        return None
    parts = path.parts
    for depth in (1, 2):  # the values dir, then maybe a stage's dir, then the file
        if parts[-depth - 2 : -depth] == _VALUES:
            return "/".join((*parts[-depth:-1], path.stem))
    return None


def pointer_path(value: object) -> Path | None:
    """The file a `file://` pointer names; None for any other value."""
    if pointer_name(value) is None:
        return None
    return Path(str(value)[len(POINTER_PREFIX) :])


class Offloaded(msgspec.Struct):
    """One stage visit's updates after offloading: as its record keeps them, as the
    context takes them, the values to write (`pending`: visit file, current file, the
    value, its JSON bytes or its `TextFile`) and the files written, by artifact name."""

    record: JsonObject
    context: JsonObject
    # A `TextFile`'s files map to its file: git keeps them as that raw text.
    written: dict[str, bytes | Path]
    # A `TextFile` is its own entry in place of the bytes: its JSON form is streamed
    # from its file.
    pending: list[tuple[str, str, JsonValue, bytes | TextFile]] = msgspec.field(
        default_factory=list
    )


def resolved(value: JsonValue) -> JsonValue:
    """What a context value stands for: an offloaded value read back from the file its
    `file://` pointer names, any other value as it is. None when that file cannot be
    read (a pointer from another machine's scratch dir, say)."""
    path = pointer_path(value)
    if path is None:
        return value
    try:
        return msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


class ArtifactStore:
    """One run's offloaded values in its scratch dir: writes, reads and clean-up."""

    def __init__(self, scratch: Path) -> None:
        self.root = scratch.joinpath(*_VALUES)

    def path(self, name: str) -> Path:
        """The file of the artifact `name`; `UnsafeEntry` for a name that would leave the
        store (one read from a meta ref or a pointer can say anything)."""
        from fabro_git.confine import checked_parts

        return self.root.joinpath(*checked_parts(f"{name}.json"))

    def pointer(self, name: str) -> str:
        return f"{POINTER_PREFIX}{self.path(name)}"

    def offload(
        self, updates: Mapping[str, JsonValue], *, tag: str | None = None
    ) -> tuple[JsonObject, dict[str, bytes]]:
        """`updates` with every value over the threshold replaced by a pointer to
        `<key>.json`, and the files written for them, by name (a file whose bytes did
        not change is left alone and not returned)."""
        kept: JsonObject = {}
        written: dict[str, bytes] = {}
        for key, value in updates.items():
            data = _large(value)
            if data is None:
                kept[key] = value
                continue
            name = artifact_name(key, tag)
            if self._write(name, data):
                written[name] = data
            kept[key] = self.pointer(name)
        return kept, written

    def offload_stage(
        self, updates: Mapping[str, JsonValue], slug: str, *, tag: str | None = None
    ) -> Offloaded:
        """Offload one stage visit's updates: the record points to the visit's own file,
        the context to the key's current one (see the module docstring)."""
        result = self.plan_stage(updates, slug, tag=tag)
        self.write_stage(result)
        return result

    def plan_stage(
        self, updates: Mapping[str, JsonValue], slug: str, *, tag: str | None = None
    ) -> Offloaded:
        """`offload_stage` without writing anything yet: `write_stage` does."""
        result = Offloaded({}, {}, {})
        for key, value in updates.items():
            # A long reply is a `TextFile` until here (see `outcome_from_response`).
            data: bytes | TextFile | None = value if isinstance(value, TextFile) else _large(value)
            if data is None:
                result.record[key] = result.context[key] = value
                continue
            current = artifact_name(key, tag)
            visit = f"{slug}/{current}"
            result.pending.append((visit, current, value, data))
            result.record[key] = self.pointer(visit)
            result.context[key] = self.pointer(current)
        return result

    def write_stage(
        self,
        offloaded: Offloaded,
        meanwhile: Callable[[list[tuple[object, bytes]]], object] | None = None,
    ) -> None:
        """Write the files `plan_stage` planned. `meanwhile` is called with the values
        and their bytes while a thread writes them: a 50 MB file costs the kernel a
        while, time the caller can use (the checkpoint's secret scan of those bytes)."""

        def write() -> None:
            for visit, current, _, data in offloaded.pending:
                if isinstance(data, TextFile):
                    source = Path(data.path)
                    self._write_json_text(visit, source)
                    self._link(visit, current, None)
                    offloaded.written[visit] = offloaded.written[current] = source
                    continue
                if self._write(visit, data):
                    offloaded.written[visit] = data
                if self._link(visit, current, data):
                    offloaded.written[current] = data

        if not offloaded.pending or meanwhile is None:
            write()
        else:
            values: list[tuple[object, bytes]] = [
                (v, data) for _, _, v, data in offloaded.pending if isinstance(data, bytes)
            ]
            _alongside(write, lambda: meanwhile(values))
        offloaded.pending = []

    def read(self, pointer: str) -> JsonValue:
        """The value a pointer stands for. FileNotFoundError when it is gone."""
        path = pointer_path(pointer)
        if path is None:
            raise ValueError(f"not an artifact pointer: {pointer[:80]!r}")
        return msgspec.json.decode(path.read_bytes())

    def names(self) -> set[str]:
        """Every artifact held: `<key>` names and `<node_slug>/<key>` ones."""
        if not self.root.is_dir():
            return set()
        return {
            p.relative_to(self.root).with_suffix("").as_posix()
            for p in self.root.glob("**/*.json")
            if not p.name.startswith(".")
        }

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def prune(self, keep: Iterable[str]) -> list[str]:
        """Remove the current-value files not named in `keep`; returns the names removed.
        A stage visit's own files stay: they are its record, as its status.json is."""
        gone = sorted(n for n in self.names() - set(keep) if "/" not in n)
        for name in gone:
            self.remove(name)
        return gone

    def materialise(self, files: Mapping[str, bytes]) -> None:
        """Make the store hold exactly `files` (name -> JSON bytes), the meta ref's copies
        on resume: what git holds is the truth, whatever a cut-off stage left here.
        Every name is checked before anything is written."""
        for name in files:
            self.path(name)
        for name, data in files.items():
            self._write(name, data)
        for name in self.names() - set(files):
            self.remove(name)

    def repoint(self, values: JsonObject) -> None:
        """Point every pointer in `values`, nested ones too, into this store (a resume in
        another clone, or another scratch dir, finds pointers into the old one)."""
        for key, value in values.items():
            values[key] = self._repointed(value)

    def _repointed(self, value: JsonValue) -> JsonValue:
        if isinstance(value, dict):
            return {k: self._repointed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._repointed(v) for v in value]
        name = pointer_name(value)
        return value if name is None else self.pointer(name)

    def _link(self, source: str, name: str, data: bytes | None) -> bool:
        """Make `name` hold `source`'s bytes (`data`, None when they are not in memory),
        as a hard link where it can."""
        path = self.path(name)
        try:
            if data is not None and path.read_bytes() == data:
                return False
        except FileNotFoundError:
            pass
        temp = path.with_name(f".{path.name}.tmp")
        try:
            temp.unlink(missing_ok=True)
            os.link(self.path(source), temp)
        except OSError:
            if data is None:
                import shutil

                shutil.copyfile(self.path(source), temp)
            else:
                return self._write(name, data)
        os.replace(temp, path)
        return True

    def _write(self, name: str, data: bytes) -> bool:
        path = self.path(name)
        try:
            if path.read_bytes() == data:
                return False
        except OSError:
            pass  # not there, or not a file: the write says what is wrong
        from fabro_git.confine import write_confined

        write_confined(self.root, f"{name}.json", data, private=True)
        return True

    def _write_json_text(self, name: str, source: Path) -> None:
        """Write the JSON form of the text in the file `source` as `name`, streamed."""
        from fabro_git.confine import write_confined

        self.path(name)
        write_confined(self.root, f"{name}.json", lambda out: _json_text(source, out), private=True)


def _alongside(first: Callable[[], None], second: Callable[[], object]) -> None:
    """Run `first` on a thread of its own while `second` runs here; `first`'s error, if
    any, is raised once both are done."""
    import threading

    failure: list[BaseException] = []

    def run() -> None:
        try:
            first()
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=run, name="fabro-artifact-write")
    thread.start()
    try:
        second()
    finally:
        thread.join()
    if failure:
        raise failure[0]


def referenced_names(
    context_values: Mapping[str, JsonValue], records: Iterable[Mapping[str, object]]
) -> set[str]:
    """The artifacts a checkpoint points to, from its context and its stage records,
    nested values included (a fan-in's `parallel.results` holds its branches' updates)."""
    names: set[str] = set()
    pending: list[object] = [dict(context_values), *(r.get("context_updates") for r in records)]
    while pending:
        value = pending.pop()
        if isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        else:
            name = pointer_name(value)
            if name is not None:
                names.add(name)
    return names


class ResolvedContext(Mapping[str, JsonValue]):
    """A read-only view of the context in which a pointer reads as the value it stands
    for, so an edge condition on an offloaded key compares the real value. A value is
    read from its file only when a condition asks for its key."""

    def __init__(self, values: Mapping[str, JsonValue]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> JsonValue:
        value = self._values[key]
        path = pointer_path(value)
        if path is None:
            return value
        try:
            return msgspec.json.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError):
            return value  # a file gone missing: the pointer is all there is

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)
