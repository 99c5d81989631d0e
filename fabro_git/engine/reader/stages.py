"""A run's stages read back from its meta ref: records, files, transcripts, artifacts.

Every stage leaves `nodes/<node>[-<visit>]/` on the metadata ref: its `status.json`
and, by kind, the prompt and reply of an LLM stage or the script and output of a
command. A child workflow's stages sit under their parent's directory
(`nodes/<parent>/nodes/…`). Offloaded context values live under
`artifacts/<node_slug>/<key>.json` and captured assets under
`assets/<node_slug>/retry_<n>/`; an agent's tool calls are in the run's events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import msgspec

from fabro_git.engine.reader.events import RunEvent
from fabro_git.errors import ConfigError
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as layout
from fabro_git.store.repo import GitRepo

# What a stage's directory may hold, in the order a person reads it: (file, title).
STAGE_FILES = (
    ("prompt.md", "prompt"),
    ("response.md", "response"),
    ("script.sh", "script"),
    ("script.py", "script"),
    ("stdout.log", "stdout"),
    ("stderr.log", "stderr"),
)

# A file larger than this is read as its head and tail: the meta ref keeps a command's
# whole output, which can be hundreds of megabytes.
READ_LIMIT = 1_000_000


class Stage(msgspec.Struct, frozen=True):
    """One visit of one node, as its `status.json` recorded it."""

    path: str  # its directory on the meta ref, e.g. nodes/fix-2
    name: str  # node id, with the parent's for a child stage: review/check
    visit: int
    record: JsonObject

    @property
    def label(self) -> str:
        return f"{self.name}@{self.visit}"

    @property
    def status(self) -> str:
        return str(self.record.get("status", "?"))

    @property
    def duration_ms(self) -> int | None:
        value = self.record.get("duration_ms")
        return value if isinstance(value, int) else None

    @property
    def files_touched(self) -> list[str]:
        files = self.record.get("files_touched") or []
        return [str(f) for f in files] if isinstance(files, list) else []

    @property
    def usage(self) -> JsonObject:
        """Tokens and cost of its model calls ({} for a stage that made none)."""
        usage = self.record.get("usage")
        return usage if isinstance(usage, dict) else {}

    def to_json(self) -> dict[str, object]:
        """The stage as a JSON object (for `--json` output and the web view)."""
        return {
            "stage": self.label,
            "node": self.name,
            "visit": self.visit,
            "status": self.status,
            "error": self.record.get("error"),
            "started_at": self.record.get("started_at"),
            "duration_ms": self.duration_ms,
            "attempt": self.record.get("attempt"),
            "files_touched": self.files_touched,
            "usage": self.usage,
        }

    @property
    def slug(self) -> str:
        """Its directory as one path component, as artifacts and assets name it."""
        return layout.node_slug(self.path.removeprefix(f"{layout.NODES_DIR}/"))


def list_stages(
    repo: GitRepo, meta: str, directory: str = layout.NODES_DIR, prefix: str = ""
) -> list[Stage]:
    """Every stage recorded under `directory`, child workflows' stages included, in
    the order they started."""
    found: list[Stage] = []
    for entry in repo.list_dir(meta, directory) or []:
        path = f"{directory}/{entry}"
        data = repo.read_file(meta, f"{path}/{layout.NODE_STATUS}")
        if data is None:
            continue
        try:
            record = json.loads(data)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        node = str(record.get("node_id") or entry)
        name = prefix + node.rsplit("/", 1)[-1]
        found.append(Stage(path, name, int(record.get("visit") or 1), record))
        found += list_stages(repo, meta, f"{path}/{layout.NODES_DIR}", prefix=f"{name}/")
    found.sort(key=lambda s: str(s.record.get("started_at") or ""))
    return found


def select_stage(found: list[Stage], wanted: str) -> Stage:
    """The stage `wanted` names: NODE (its latest visit) or NODE@VISIT."""
    name, _, visit = wanted.partition("@")
    matching = [s for s in found if s.name == name]
    if visit:
        matching = [s for s in matching if str(s.visit) == visit]
    if not matching:
        known = ", ".join(dict.fromkeys(s.label for s in found)) or "none"
        raise ConfigError(f"no stage {wanted!r} in this run", hint=f"its stages: {known}")
    return matching[-1]


def read_stage_file(
    repo: GitRepo, meta: str, stage: Stage, name: str, *, limit: int = READ_LIMIT
) -> bytes | None:
    """A file of the stage's directory (`prompt.md`, `stdout.log`, …); one larger than
    `limit` is its head and tail around a note saying how to get all of it. None when
    the stage has no such file or it is empty."""
    path = f"{stage.path}/{name}"
    size = repo.file_size(meta, path)
    if size is None or size <= limit:
        return repo.read_file(meta, path) if size else None
    ends = repo.read_file_ends(meta, path, limit // 2)
    if ends is None:
        return None
    head, tail = ends
    left = size - len(head) - len(tail)
    note = f"\n[... {left} bytes not shown; the whole file: git show {meta[:12]}:{path}]\n"
    return head + note.encode() + tail


# -- what an agent did -----------------------------------------------------------------


class TranscriptEntry(msgspec.Struct, frozen=True):
    """One line of an agent's transcript: a reply, a tool call, its result, a
    sub-agent, an error or a warning; `depth` is how deep its agent session nests."""

    kind: str  # "said", "tool", "result", "sub-agent", "error" or "warning"
    depth: int
    text: str = ""  # the reply, the task, the error or warning
    tool_name: str = ""
    arguments: str = ""  # as JSON unless the tool took a string
    is_error: bool = False


def transcript(events: Iterable[RunEvent], stage: Stage) -> list[TranscriptEntry]:
    """What the stage's agent did, from the run's events, in order. Empty for a stage
    with no agent. A result's `text` is its whole output."""
    from fabro_git.events.render import SessionDepth

    depth = SessionDepth()
    out: list[TranscriptEntry] = []
    for event in events:
        level = depth.of(event.envelope)
        if event.envelope.get("stage_id") != stage.label:
            continue
        name = event.name
        props = event.properties
        if name == "agent.message" and str(props.get("text") or "").strip():
            out.append(TranscriptEntry("said", level, text=str(props["text"])))
        elif name == "agent.tool.started":
            arguments = props.get("arguments")
            shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
            tool = str(props.get("tool_name", "?"))
            out.append(TranscriptEntry("tool", level, tool_name=tool, arguments=shown))
        elif name == "agent.tool.completed":
            output = props.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            error = bool(props.get("is_error"))
            out.append(TranscriptEntry("result", level, text=text, is_error=error))
        elif name == "agent.sub.spawned":
            out.append(TranscriptEntry("sub-agent", level, text=str(props.get("task") or "")))
        elif name in ("agent.error", "agent.warning"):
            detail = props.get("error") or props.get("message") or ""
            shown = detail if isinstance(detail, str) else json.dumps(detail)
            out.append(TranscriptEntry(name.split(".")[1], level, text=shown))
    return out


# -- offloaded values and captured assets ----------------------------------------------

_RETRY_RE = re.compile(r"retry_(\d+)\Z")


class Artifact(msgspec.Struct, frozen=True):
    """An asset a stage captured or a context value offloaded from it, named by its
    path in one tree: `<node_slug>/retry_<n>/<path in the worktree>` for an asset,
    `<node_slug>/values/<key>.json` for a value."""

    kind: str  # "asset" or "value"
    stage: str  # NODE@VISIT, with the parent's id for a child workflow's stage
    node: str
    slug: str
    retry: int | None  # the attempt, for an asset
    name: str  # the path in the worktree (asset) or `<key>.json` (value)
    meta_path: str  # where the bytes are on the metadata ref
    size: int

    @property
    def tree_path(self) -> str:
        if self.kind == "asset":
            return f"{self.slug}/retry_{self.retry}/{self.name}"
        return f"{self.slug}/values/{self.name}"

    def to_json(self) -> JsonObject:
        return {
            "kind": self.kind,
            "stage": self.stage,
            "node": self.node,
            "retry": self.retry,
            "path": self.tree_path,
            "name": self.name,
            "bytes": self.size,
        }


def list_artifacts(repo: GitRepo, meta: str, stages: list[Stage] | None = None) -> list[Artifact]:
    """Every asset and offloaded value of the snapshot `meta`, in the order the stages
    ran (then by retry and path); `manifest.json` files aside."""
    order: dict[str, tuple[int, str, str]] = {}
    for index, stage in enumerate(list_stages(repo, meta) if stages is None else stages):
        order[stage.slug] = (index, stage.label, stage.name)
    items: list[Artifact] = []
    for relpath, size in repo.list_files(meta, layout.ASSETS_DIR):
        slug, _, rest = relpath.partition("/")
        retry_dir, _, name = rest.partition("/")
        match = _RETRY_RE.match(retry_dir)
        if not match or not name or name == "manifest.json":
            continue
        where = f"{layout.ASSETS_DIR}/{relpath}"
        items.append(_artifact(order, "asset", slug, int(match.group(1)), name, where, size))
    for relpath, size in repo.list_files(meta, layout.ARTIFACTS_DIR):
        slug, _, name = relpath.partition("/")
        if not name or "/" in name:
            continue  # a key's current value: the same bytes as a stage visit's file
        where = f"{layout.ARTIFACTS_DIR}/{relpath}"
        items.append(_artifact(order, "value", slug, None, name, where, size))
    items.sort(key=lambda i: (order.get(i.slug, (len(order), "", ""))[0], i.retry or 0, i.name))
    return items


def _artifact(
    order: dict[str, tuple[int, str, str]],
    kind: str,
    slug: str,
    retry: int | None,
    name: str,
    meta_path: str,
    size: int,
) -> Artifact:
    _, stage, node = order.get(slug, (0, slug, slug))
    return Artifact(kind, stage, node, slug, retry, name, meta_path, size)


def stage_artifacts(items: list[Artifact], stage: Stage) -> list[Artifact]:
    """The artifacts of one stage visit."""
    return [i for i in items if i.stage == stage.label and i.node == stage.name]
