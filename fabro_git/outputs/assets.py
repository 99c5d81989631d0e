"""Test assets a command leaves in the worktree, copied out per stage attempt.

Playwright, Cypress and JUnit-style runners write screenshots, videos, traces and
reports into the tree, often into ignored directories that the checkpoint commit never
sees. Around each attempt of a stage that runs commands, the engine takes a baseline of
the known asset paths (`baseline`), lets the stage run, scans again and copies what is
new or changed (`capture`) to `assets/<node_slug>/retry_<n>/` in scratch and, through
the checkpoint, on the meta ref, so a clone reads them too.

What counts as an asset: any regular file under a directory named `playwright-report`
or `test-results`, or under `cypress/videos` or `cypress/screenshots`, and any file
named `junit*.xml` or `*.trace.zip`, wherever they sit (a monorepo keeps them per
package). The scan is one `os.scandir` walk that never enters dependency directories
and tool caches (SKIP_DIRS) nor follows symlinks; a symlinked file is never copied, so
a link cannot pull a file from outside the worktree into git. On a 100,000-file tree
(plus 5,000 files in `node_modules`) one scan costs about a quarter of
`git status --porcelain` on the same tree (`benchmarks/asset_scan.py`).

A file is new when the baseline lacks it, changed when its size or mtime differs. When
size and mtime match but the file was replaced or rewritten (its inode or ctime moved,
as `cp -p` or a runner that restores mtimes leaves it), the content decides: the
baseline keeps an xxhash of each candidate file it can afford to read (the capture's own
limits bound that), and a file whose hash is unchanged is skipped.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import mimetypes
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import msgspec

FILE_LIMIT = 10 * 1024 * 1024  # a file over this is skipped
TOTAL_LIMIT = 50 * 1024 * 1024  # a capture stops before going past this
ASSET_DIRS = ("playwright-report", "test-results")
ASSET_DIR_PAIRS = (("cypress", "videos"), ("cypress", "screenshots"))
ASSET_PATTERNS = ("junit*.xml", "*.trace.zip")
# Dependency directories and tool caches: never scanned (`.cache` holds
# `ms-playwright`'s browsers, `.yarn` its `cache`).
SKIP_DIRS = frozenset(
    {
        ".git",
        "node_modules",
        "bower_components",
        "jspm_packages",
        ".pnpm-store",
        ".npm",
        ".yarn",
        ".cache",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".gradle",
        ".m2",
        ".cargo",
    }
)
MANIFEST = "manifest.json"

# Types Python's built-in table lacks or that vary between systems; the rest come from
# its built-in table only (not /etc/mime.types), so every machine names a file alike.
_EXTRA_TYPES = {
    ".webm": "video/webm",
    ".mp4": "video/mp4",
    ".zip": "application/zip",
    ".xml": "application/xml",
    ".json": "application/json",
    ".png": "image/png",
}


class Fingerprint(msgspec.Struct, frozen=True):
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    digest: str | None = None  # xxhash of the content, when the baseline read it


Snapshot = dict[str, Fingerprint]


class Captured(msgspec.Struct):
    path: str  # relative to the worktree, '/'-separated
    data: bytes
    mime: str
    md5: str
    sha256: str


class Manifest(msgspec.Struct):
    files_copied: int = 0
    total_bytes: int = 0
    files_skipped: int = 0
    download_errors: int = 0
    copied_paths: list[str] = msgspec.field(default_factory=list)


class Capture(msgspec.Struct):
    manifest: Manifest = msgspec.field(default_factory=Manifest)
    files: list[Captured] = msgspec.field(default_factory=list)

    @property
    def empty(self) -> bool:
        m = self.manifest
        return not (m.files_copied or m.files_skipped or m.download_errors)


def is_asset(parts: tuple[str, ...]) -> bool:
    """Whether a worktree path (its components) is a known asset path."""
    return _in_asset_dir(parts[:-1]) or _asset_name(parts[-1])


def _asset_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in ASSET_PATTERNS)


def _in_asset_dir(dirs: tuple[str, ...]) -> bool:
    if any(d in ASSET_DIRS for d in dirs):
        return True
    return any(
        dirs[i] == first and dirs[i + 1] == second
        for i in range(len(dirs) - 1)
        for first, second in ASSET_DIR_PAIRS
    )


def included(path: str, include: Sequence[str]) -> bool:
    """Whether a worktree path matches one of `[run.artifacts] include`'s globs (`*`
    and `**` both cross directories: `screenshots/**`, `*.png`)."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in include)


def _walk(root: Path, include: Sequence[str] = ()) -> list[tuple[str, os.stat_result]]:
    """Every asset file under `root`: its relative path and lstat. Whether a directory
    is inside an asset directory is decided once per directory, and a file name outside
    one is checked by its ends before any pattern matching: the walk stays close to
    the speed of listing the tree. Files matching `include` (the run's own globs) count
    too."""
    found: list[tuple[str, os.stat_result]] = []
    pending: list[tuple[str, tuple[str, ...], bool]] = [(str(root), (), False)]
    while pending:
        directory, prefix, inside = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if name not in SKIP_DIRS:
                        parts = (*prefix, name)
                        pending.append((entry.path, parts, inside or _in_asset_dir(parts[-2:])))
                    continue
            except OSError:
                continue
            if not (
                inside
                or (name.endswith((".xml", ".zip")) and _asset_name(name))
                or (include and included("/".join((*prefix, name)), include))
            ):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(("/".join((*prefix, name)), info))
    return found


def _xxhash(path: Path) -> str | None:
    import xxhash

    digest = xxhash.xxh3_128()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def baseline(worktree: Path, include: Sequence[str] = ()) -> Snapshot:
    """The asset files in `worktree` before a command runs. Files the capture could
    copy (within its limits) are hashed, so a rewrite that keeps size and mtime is told
    apart by content."""
    snapshot: Snapshot = {}
    budget = TOTAL_LIMIT
    for path, info in sorted(_walk(worktree, include)):
        digest = None
        if info.st_size <= FILE_LIMIT and info.st_size <= budget:
            digest = _xxhash(worktree / path)
            budget -= info.st_size
        snapshot[path] = Fingerprint(
            info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, digest
        )
    return snapshot


def _changed(path: Path, info: os.stat_result, before: Fingerprint | None) -> bool:
    if before is None:
        return True
    if info.st_size != before.size or info.st_mtime_ns != before.mtime_ns:
        return True
    if info.st_ctime_ns == before.ctime_ns and info.st_ino == before.inode:
        return False
    # Same size and mtime, yet written or replaced: only the content can tell.
    return before.digest is None or _xxhash(path) != before.digest


def _utf8(path: str) -> bool:
    """Whether a path can be named in git and JSON (a file name that is not UTF-8 is
    skipped)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def mime_type(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in _EXTRA_TYPES:
        return _EXTRA_TYPES[suffix]
    guessed, _ = _mime_table().guess_type(path, strict=False)
    return guessed or "application/octet-stream"


@functools.cache
def _mime_table() -> mimetypes.MimeTypes:
    """Python's built-in table, built on the first capture (~3 ms) rather than by every
    run that imports this module."""
    return mimetypes.MimeTypes()


def capture(worktree: Path, before: Snapshot, include: Sequence[str] = ()) -> Capture:
    """What changed among the asset files since `before`: each file's bytes and
    digests, within the size limits, and the manifest counting what was copied, skipped
    or could not be read."""
    result = Capture()
    manifest = result.manifest
    stopped = False
    for path, info in sorted(_walk(worktree, include)):
        source = worktree / path
        if not _changed(source, info, before.get(path)):
            continue
        if stopped or info.st_size > FILE_LIMIT or not _utf8(path):
            manifest.files_skipped += 1
            continue
        if manifest.total_bytes + info.st_size > TOTAL_LIMIT:
            stopped = True
            manifest.files_skipped += 1
            continue
        try:
            with source.open("rb") as handle:
                data = handle.read(FILE_LIMIT + 1)
        except OSError:
            manifest.download_errors += 1
            continue
        if len(data) > FILE_LIMIT or manifest.total_bytes + len(data) > TOTAL_LIMIT:
            manifest.files_skipped += 1  # it grew between the scan and the read
            continue
        result.files.append(
            Captured(
                path=path,
                data=data,
                mime=mime_type(path),
                md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
        manifest.files_copied += 1
        manifest.total_bytes += len(data)
        manifest.copied_paths.append(path)
    return result


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def keep(scratch: Path, directory: str, result: Capture) -> dict[str, bytes]:
    """Write a capture to `<scratch>/<directory>/` (its files and `manifest.json`), and
    return the same files by their path on the meta ref."""
    from fabro_git.config.locations import make_private_dir, open_private

    files = {f"{directory}/{item.path}": item.data for item in result.files}
    files[f"{directory}/{MANIFEST}"] = encode_manifest(result.manifest)
    for relative, data in files.items():
        target = scratch / relative
        make_private_dir(target.parent)
        fd = open_private(target, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return files
