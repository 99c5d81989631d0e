"""Skills: reusable instructions in `SKILL.md` files, loaded by `/name` or the `use_skill` tool.

A skill is a directory holding `SKILL.md`: an optional front matter block (`name:` and
`description:` lines between `---` fences) and the instructions. They are gathered from
the user's skills dir, then the worktree's `.fabro/skills` and `skills` dirs; a later
dir's skill replaces an earlier one of the same name, so a project can adapt a personal
skill. A prompt that starts a word with `/name` of a known skill is replaced by the
skill's text, with the rest of the prompt in place of `{{user_input}}`.

A skill of the worktree is a file the repository holds (a cloned one's, or one an
agent wrote), so it is read only where it lies inside the worktree, symlinks followed:
a `SKILL.md` linked to `~/.ssh/id_ed25519` would hand an agent, and its provider, what
its tools may not read. Only regular files of at most 256 KiB are skills; a device or
FIFO is never read.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from fabro_git.events.catalogue import SkillSummary
from fabro_git.files import read_inside

_SLASH = re.compile(r"(?:(?<=\s)|^)/([a-z][a-z0-9_-]*)(?=\s|$)")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
PLACEHOLDER = "{{user_input}}"
SKILL_LIMIT = 256 * 1024


class Skill(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    template: str
    path: str


def user_skills_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("git-fabro", appauthor=False)) / "skills"


def default_skill_dirs(worktree: Path) -> list[Path]:
    return [user_skills_dir(), worktree / ".fabro" / "skills", worktree / "skills"]


def discover_skills(directories: list[Path], *, worktree: Path | None = None) -> dict[str, Skill]:
    """Skills by name; later directories override earlier ones. A directory under
    `worktree` gives only skills whose files lie inside it."""
    found: dict[str, Skill] = {}
    for directory in directories:
        if not directory.is_dir():
            continue
        inside = worktree if worktree is not None and directory.is_relative_to(worktree) else None
        for path in sorted(directory.glob("*/SKILL.md")):
            skill = parse_skill(path, inside)
            if skill is not None:
                found[skill.name] = skill
    return dict(sorted(found.items()))


def parse_skill(path: Path, root: Path | None = None) -> Skill | None:
    """The skill of `path`; None when it is none, or not a regular file inside `root`
    (see above)."""
    read = read_inside(path, root, limit=SKILL_LIMIT + 1)
    if read is None or len(read[0]) > SKILL_LIMIT:
        return None
    text = read[0].decode("utf-8", errors="replace")
    fields: dict[str, str] = {}
    body = text
    if text.startswith("---"):
        head, fence, rest = text[3:].partition("\n---")
        if fence:
            body = rest.partition("\n")[2]
            for line in head.splitlines():
                key, colon, value = line.partition(":")
                if colon:
                    fields[key.strip()] = value.strip().strip("\"'")
    name = fields.get("name") or path.parent.name
    if not _NAME.match(name):
        return None
    return Skill(
        name=name,
        description=fields.get("description", ""),
        template=body.strip(),
        path=str(path),
    )


def summaries(skills: dict[str, Skill]) -> list[SkillSummary]:
    return [SkillSummary(name=s.name, description=s.description) for s in skills.values()]


def expand_slash(prompt: str, skills: dict[str, Skill]) -> tuple[str, Skill | None]:
    """The prompt with its first `/skill-name` replaced by the skill, and the skill used."""
    for match in _SLASH.finditer(prompt):
        skill = skills.get(match.group(1))
        if skill is None:
            continue
        rest = (prompt[: match.start()] + prompt[match.end() :]).strip()
        return render(skill, rest), skill
    return prompt, None


def render(skill: Skill, user_input: str) -> str:
    if PLACEHOLDER in skill.template:
        return skill.template.replace(PLACEHOLDER, user_input)
    return f"{skill.template}\n\n{user_input}" if user_input else skill.template


def prompt_section(skills: dict[str, Skill]) -> str:
    if not skills:
        return ""
    lines = [
        "# Available skills",
        "When the task matches a skill below, call `use_skill` with its name to load its "
        "instructions, then follow them.",
    ]
    lines += [f"- `{s.name}`: {s.description}" for s in skills.values()]
    return "\n".join(lines)
