"""A model's profile: the tool set and the opening of the system prompt its session
gets, chosen by the wire protocol its provider speaks (so every Chat Completions server,
Gemini's endpoint and local models, gets the edit_file tools). `tools.PROFILE_TOOLS`
names each profile's tools.
"""

from __future__ import annotations

from typing import Literal

from fabro_git.llm import catalogue
from fabro_git.llm.types import Target

Profile = Literal["anthropic", "openai", "gemini"]

PROFILE_BASE: dict[str, str] = {
    "anthropic": (
        "You are a coding agent working in a git worktree. Read files before you change "
        "them, prefer edit_file (its old_string must be unique in the file) over "
        "rewriting a whole file, and keep changes to what the task needs."
    ),
    "openai": (
        "You are a coding agent working in a git worktree. Make file changes with "
        "apply_patch (the v4a patch format) and new files with write_file; read files "
        "before you patch them, and keep changes to what the task needs."
    ),
    "gemini": (
        "You are a coding agent working in a git worktree. Read files before you change "
        "them, use edit_file for focused changes and write_file for new files, and keep "
        "changes to what the task needs."
    ),
}


def profile_of(target: Target) -> Profile:
    """The tool and prompt profile: by wire protocol, so every Chat Completions server
    (Gemini's endpoint, local models) gets the edit_file tool set."""
    api = catalogue.PROVIDERS[target.provider].api
    if api == "anthropic":
        return "anthropic"
    if api == "openai-responses":
        return "openai"
    return "gemini"
