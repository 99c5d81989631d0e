"""`git fabro demo`: a first run with nothing to set up.

It makes a scratch repository with one commit (and a local identity, for a machine
where git has none yet), runs the shipped `hello` example in it for real, and says
what to look at. Nothing outside the new directory is touched.

A temporary repository (no DIR) is removed when the run is done, with its runs' scratch
dirs: a newcomer trying the tool wants nothing left behind. `--keep` keeps it to look
around; a DIR the user named is always kept.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from fabro_git.errors import ConfigError


def run(directory: Path | None, *, keep: bool = False) -> int:
    temporary = directory is None
    if directory is None:
        target = Path(tempfile.mkdtemp(prefix="git-fabro-demo-"))
    else:
        target = directory.expanduser().resolve()
        if target.exists() and not target.is_dir():
            raise ConfigError(
                f"{target} is a file, not a directory",
                hint="name a new or empty directory, or leave it out",
            )
        if target.exists() and any(target.iterdir()):
            raise ConfigError(
                f"{target} is not an empty directory", hint="name a new directory, or leave it out"
            )
        target.mkdir(parents=True, exist_ok=True)
    _git(target, "init", "-q", "-b", "main")
    for key, value in (("user.name", "git fabro demo"), ("user.email", "demo@localhost")):
        if not _git(target, "config", key, check=False).strip():
            _git(target, "config", key, value)
    (target / "README.md").write_text("A scratch repository made by `git fabro demo`.\n")
    _git(target, "add", "README.md")
    _git(target, "commit", "-q", "-m", "demo: initial commit")
    print(f"demo repository: {target}", file=sys.stderr)
    code = subprocess.call([sys.executable, "-m", "fabro_git", "run", "hello"], cwd=target)
    if temporary and not keep:
        _remove(target)
        print(
            f"\nremoved the demo repository {target}, so the commands above have nothing"
            " to look at: `git fabro demo --keep` keeps it, or name a directory:"
            " `git fabro demo DIR`",
            file=sys.stderr,
        )
    elif code == 0:
        print(
            "\nLook around:\n"
            f"  cd {target}\n"
            "  git log --oneline --branches     # the run branch: one commit per stage\n"
            "  git fabro show hello             # its stages; `git fabro show hello show` for one\n"
            "  git fabro logs hello --pretty    # what the run did, event by event",
            file=sys.stderr,
        )
    return code


def _remove(target: Path) -> None:
    """The scratch repository and the scratch dirs of its runs."""
    import shutil

    from fabro_git.config.locations import repo_key, runs_dir

    key = f"-{repo_key(target / '.git')}"
    root = runs_dir()
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.endswith(key) and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    from fabro_git.store._gitcli import git_env

    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=git_env(), check=False
    )
    if check and proc.returncode != 0:
        raise ConfigError(f"git {args[0]} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout
