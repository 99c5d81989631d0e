"""The files a workflow names (`@file` prompts, child workflows) and where they may be.

A workflow travels with its repository and is run by people who did not write it, and
every file it names is copied into the run's metadata, which `git fabro push` sends
away. So a named path must resolve, symlinks followed, inside the workflow's root:

- the work tree of the git repository that holds the workflow file;
- the shipped examples directory, for a shipped example (the tool's own files);
- the workflow file's own directory, when no repository holds it.

Absolute paths and `~` are refused, as is anything under `.git/`: they name one
machine's files (or git's private ones), and a clone has none of them.

Inside the root a file is known by its relative path (`prompts/plan.md`), which is also
where a run keeps it: `graphs/<path>` on the meta ref. A run reads the files its
workflow names once, before it starts; from then on, in the first process, a detached
one or a resume on another machine, they come from that snapshot and never from disk.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING

import msgspec

from fabro_git.errors import FabroError, WorkflowError
from fabro_git.workflow.model import MANAGER_LOOP

if TYPE_CHECKING:
    from fabro_git.workflow.lint_check import Diagnostic
    from fabro_git.workflow.model import Graph, Node

# How deep child workflows may nest: deeper is almost surely a mistake, and each level
# is a whole walk.
MAX_CHILD_DEPTH = 8

CHILD_WORKFLOW = "stack.child_workflow"
CHILD_SOURCE = "stack.child_dot_source"


class PathRefused(FabroError):
    """A path a workflow names that is outside its root, or that cannot be read."""


def examples_dir() -> Path:
    """The shipped example workflows (inside the installed package)."""
    return Path(__file__).resolve().parent.parent / "examples"


def _realpath(path: Path) -> Path:
    # Not Path.resolve: it raises RuntimeError on a symlink loop, which a repository
    # can hold; realpath returns a path that then fails to open, with ELOOP.
    return Path(os.path.realpath(path))


def workflow_root(workflow: Path) -> Path:
    """The directory the files `workflow` names must stay in (see the module docstring)."""
    real = _realpath(workflow)
    examples = examples_dir()
    if real.is_relative_to(examples):
        return examples
    for directory in real.parents:
        if (directory / ".git").exists():
            return directory
    return real.parent


def _in_git_dir(parts: tuple[str, ...]) -> bool:
    return any(part.lower() == ".git" for part in parts)


def is_file_ref(value: str) -> bool:
    stripped = value.strip()
    return len(stripped) > 1 and stripped.startswith("@") and not any(c.isspace() for c in stripped)


class Origin(msgspec.Struct, frozen=True, eq=False):
    """Where a workflow file sits among the files it may name.

    Files are read from disk under `root`, or, when `snapshot` is given, only from it
    (`root` then serves the messages). `chain` lists the workflows that include this
    one, outermost first, so a workflow that includes itself is caught.
    """

    relpath: str
    root: Path | None = None
    snapshot: Mapping[str, bytes] | None = None
    chain: tuple[str, ...] = ()
    # Shared by every origin derived from this one (same root), so each file is
    # checked and read once, and what validated is what the run records: paths that
    # passed the symlink check, file contents, and child workflows already validated
    # (a wide tree of includes is validated once per file, not once per path to it).
    # Origins therefore compare by identity (eq=False), not by these caches.
    checked: set[str] = msgspec.field(default_factory=set)
    contents: dict[str, bytes] = msgspec.field(default_factory=dict)
    memo: dict[str, list[Diagnostic]] = msgspec.field(default_factory=dict)

    def display(self, relpath: str) -> str:
        return str(self.root / relpath) if self.root is not None else relpath

    @property
    def root_name(self) -> str:
        return str(self.root) if self.root is not None else "the workflow's repository"

    def resolve(self, ref: str) -> str:
        """The root-relative path of `ref`, named by this workflow; `PathRefused` if it
        is absolute, leads outside the root (symlinks followed) or into `.git`."""
        text = ref.strip()
        if text.startswith("~"):
            raise PathRefused(
                f"names a home directory; name a file inside {self.root_name}, "
                "relative to the workflow file"
            )
        if posixpath.isabs(text) or PureWindowsPath(text).drive:
            raise PathRefused(
                f"is an absolute path; name a file inside {self.root_name}, "
                "relative to the workflow file"
            )
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(self.relpath), text))
        if joined == ".." or joined.startswith("../"):
            raise PathRefused(
                f"leads outside {self.root_name}; a workflow may name only files inside it"
            )
        if _in_git_dir(PurePosixPath(joined).parts):
            raise PathRefused("is inside .git, which is git's own and no workflow's")
        if self.snapshot is None and self.root is not None and joined not in self.checked:
            self._real(joined)
            self.checked.add(joined)
        return joined

    def _real(self, relpath: str) -> Path:
        assert self.root is not None
        real = _realpath(self.root / relpath)
        if not real.is_relative_to(self.root):
            raise PathRefused(
                f"resolves through a symlink to {real}, outside {self.root_name}; "
                "a workflow may name only files inside it"
            )
        if _in_git_dir(real.relative_to(self.root).parts):
            raise PathRefused(f"resolves through a symlink to {real}, inside .git")
        return real

    def read(self, relpath: str) -> bytes:
        """The content of a file `resolve` returned."""
        if self.snapshot is not None:
            data = self.snapshot.get(relpath)
            if data is None:
                raise PathRefused(f"is not among the files this run recorded ({relpath})")
            return data
        assert self.root is not None
        if relpath in self.contents:
            return self.contents[relpath]
        from fabro_git.files import UnreadableFile, read_input_file

        real = self._real(relpath)
        try:
            data = self.contents[relpath] = read_input_file(real)
            return data
        except UnreadableFile as err:
            if err.detail == "no such file":
                raise PathRefused(f"not found (looked for {self.display(relpath)})") from None
            raise PathRefused(f"{err.detail} ({self.display(relpath)})") from None

    def child(self, relpath: str) -> Origin:
        """The origin of a child workflow at `relpath`, included by this one."""
        return msgspec.structs.replace(self, relpath=relpath, chain=(*self.chain, self.relpath))


def origin_for(graph: Graph) -> Origin:
    """The graph's origin; for a graph loaded from a file, its place on disk, found
    once and kept on the graph."""
    if graph.origin is None:
        graph.origin = disk_origin(graph.path)
    return graph.origin


def disk_origin(path: Path | None) -> Origin:
    workflow = (path if path is not None else Path.cwd() / "<workflow>").absolute()
    real = _realpath(workflow)
    root = workflow_root(workflow)
    return Origin(relpath=real.relative_to(root).as_posix(), root=root)


class NamedPath(msgspec.Struct, frozen=True):
    """A path a node names: `@file` prompt or child workflow."""

    node: Node
    key: str
    ref: str


def named_paths(graph: Graph) -> Iterator[NamedPath]:
    """Every path `graph` names itself (not those of its children)."""
    for node in graph.nodes.values():
        prompt = node.prompt
        if prompt is not None and is_file_ref(prompt):
            yield NamedPath(node, "prompt", prompt.strip()[1:])
        child = (node.attrs.get(CHILD_WORKFLOW) or "").strip()
        if child:
            yield NamedPath(node, CHILD_WORKFLOW, child)


def node_error(graph: Graph, node: Node, key: str, message: str) -> WorkflowError:
    line, column = node.positions.get(key, (node.line, node.column))
    return WorkflowError(f"node {node.id!r}: {message}", path=graph.path, line=line, column=column)


def read_prompt(graph: Graph, node: Node) -> str | None:
    """The text of the node's `@file` prompt; None when its prompt is not one."""
    prompt = node.prompt
    if prompt is None or not is_file_ref(prompt):
        return None
    origin = origin_for(graph)
    try:
        relpath = origin.resolve(prompt.strip()[1:])
        return origin.read(relpath).decode("utf-8")
    except PathRefused as exc:
        raise node_error(
            graph, node, "prompt", f"prompt file {prompt.strip()!r} {exc.message}"
        ) from None
    except UnicodeDecodeError:
        raise node_error(
            graph, node, "prompt", f"prompt file {prompt.strip()!r} is not UTF-8 text"
        ) from None


def child_graph(graph: Graph, node: Node) -> Graph:
    """The child workflow a sub-workflow node names, parsed, not yet validated.

    An inline `stack.child_dot_source` names its files relative to the parent's file.
    """
    from fabro_git.workflow.parser import parse

    origin = origin_for(graph)
    inline = node.attrs.get(CHILD_SOURCE)
    if inline:
        child = parse(inline, graph.path)
        child.origin = msgspec.structs.replace(origin, chain=(*origin.chain, origin.relpath))
        return child
    ref = (node.attrs.get(CHILD_WORKFLOW) or "").strip()
    if not ref:
        raise node_error(
            graph,
            node,
            CHILD_WORKFLOW,
            f'a sub-workflow needs {CHILD_WORKFLOW}="path.fabro" or {CHILD_SOURCE}',
        )
    try:
        relpath = origin.resolve(ref)
        if relpath == origin.relpath:
            raise PathRefused("includes itself")
        if relpath in origin.chain:
            loop = " -> ".join([*origin.chain, origin.relpath, relpath])
            raise PathRefused(f"includes a workflow that includes it ({loop})")
        if len(origin.chain) + 1 > MAX_CHILD_DEPTH:
            chain = " -> ".join([*origin.chain, origin.relpath, relpath])
            raise PathRefused(
                f"nests child workflows deeper than {MAX_CHILD_DEPTH} levels ({chain})"
            )
        data = origin.read(relpath)
    except PathRefused as exc:
        raise node_error(
            graph, node, CHILD_WORKFLOW, f"child workflow {ref!r} {exc.message}"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise node_error(
            graph, node, CHILD_WORKFLOW, f"child workflow {relpath} is not UTF-8 text"
        ) from None
    display = Path(origin.display(relpath))
    child = parse(text, display)
    child.origin = origin.child(relpath)
    return child


def descendants(graph: Graph) -> Iterator[Graph]:
    """Every child workflow of `graph`, at any depth, loaded through its parent's
    origin. The graph must have validated (so no child includes itself)."""
    for node in graph.nodes.values():
        if node.handler_type == MANAGER_LOOP:
            child = child_graph(graph, node)
            yield child
            yield from descendants(child)


def collect_files(graph: Graph) -> dict[str, bytes]:
    """Every file `graph` and its children name, by root-relative path: what a run
    records under `graphs/`."""
    out: dict[str, bytes] = {}
    for current in (graph, *descendants(graph)):
        origin = origin_for(current)
        if origin.chain and origin.relpath != origin.chain[-1]:
            out[origin.relpath] = origin.read(origin.relpath)  # a child from a file
        for named in named_paths(current):
            if named.key == "prompt":
                text = read_prompt(current, named.node)
                assert text is not None
                out[origin.resolve(named.ref)] = text.encode("utf-8")
    return out
