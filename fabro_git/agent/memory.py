"""Project instructions the agent reads before it starts: `AGENTS.md` and its provider's own.

Every provider reads `AGENTS.md`; Anthropic models also read `CLAUDE.md`, Gemini models
`GEMINI.md` and OpenAI models `.codex/instructions.md`, each the file their own agent
reads. Files are looked for from the worktree root down to the agent's working
directory (deeper files come later, so they weigh more), only inside the worktree, and
together they get 32 KiB of the system prompt: what does not fit is cut with a marker.
The event names the files and sizes, never their text.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from fabro_git.events.catalogue import MemoryFile
from fabro_git.files import read_inside

BUDGET_BYTES = 32 * 1024
TRUNCATION_MARKER = "\n[Project instructions truncated at 32 KiB]"
PROFILE_FILES = {
    "anthropic": "CLAUDE.md",
    "gemini": "GEMINI.md",
    "openai": ".codex/instructions.md",
}


class Memory(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    files: list[MemoryFile]
    total_loaded_bytes: int


def load_memory(worktree: Path, profile: str, start: Path | None = None) -> Memory:
    root = Path(os.path.realpath(worktree))
    here = Path(os.path.realpath(start)) if start is not None else root
    if here != root and not here.is_relative_to(root):
        here = root
    parts = here.relative_to(root).parts
    directories = [root.joinpath(*parts[:depth]) for depth in range(len(parts) + 1)]
    names = ["AGENTS.md"] + ([PROFILE_FILES[profile]] if profile in PROFILE_FILES else [])
    remaining = BUDGET_BYTES
    sections: list[str] = []
    files: list[MemoryFile] = []
    for directory in directories:
        for name in names:
            path = directory / name
            read = read_inside(path, root, limit=remaining)
            if read is None:
                continue
            loaded, size = read
            truncated = len(loaded) < size
            remaining -= len(loaded)
            files.append(
                MemoryFile(
                    path=str(path),
                    byte_count=size,
                    loaded_bytes=len(loaded),
                    truncated=truncated,
                )
            )
            text = loaded.decode("utf-8", errors="ignore")
            if text:
                sections.append(f"## {path.relative_to(root).as_posix()}\n\n{text}")
            if truncated:
                sections.append(TRUNCATION_MARKER)
    return Memory(
        text="\n\n".join(sections),
        files=files,
        total_loaded_bytes=sum(file.loaded_bytes for file in files),
    )
