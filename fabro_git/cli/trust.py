"""`git fabro trust`: allow this repository's `.fabro/project.toml` to act, revoke that,
or list what is trusted (the mechanism is `fabro_git.config.trust`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fabro_git.config.trust import TrustStore, describe, read_project, shown
from fabro_git.errors import ConfigError


def run(*, yes: bool, revoke: bool, list_only: bool) -> int:
    if sum((yes, revoke, list_only)) > 1:
        raise ConfigError("--yes, --revoke and --list do not go together; pass one")
    store = TrustStore()
    if list_only:
        return _list(store)
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    project = read_project(repo.root)
    if revoke:
        if store.revoke(project.path):
            print(f"{project.path}: no longer trusted")
        else:
            print(f"{project.path}: was not trusted; nothing to revoke")
        return 0
    if project.digest is None:
        raise ConfigError(
            f"{project.path} does not exist: there is nothing to trust",
            hint="a repository's .fabro/project.toml holds defaults for its runs",
        )
    if not project.actions:
        print(
            f"{project.path} sets only keys that need no trust (model, labels, goal, ...):"
            " it applies as it is"
        )
        return 0
    status = store.status(project)
    if status == "trusted":
        print(f"{project.path} is already trusted as it is")
        return 0
    print(f"{project.path} would:\n{describe(project.actions)}")
    if not yes:
        if not (sys.stdin is not None and sys.stdin.isatty()):
            raise ConfigError(
                "not trusted: confirming needs a terminal",
                hint="read the file, then pass --yes to trust it as it is",
            )
        sys.stdout.write("Trust this exact content? [y/N] ")
        sys.stdout.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("not trusted")
            return 1
    store.trust(project)
    print(f"trusted {shown(os.fspath(project.path))} (sha256 {project.digest[:12]})")
    return 0


def _list(store: TrustStore) -> int:
    entries = store.entries()
    if not entries:
        print(f"no trusted files ({store.path})")
        return 0
    for entry in entries:
        path = Path(entry.path)
        try:
            project = read_project(Path(entry.repository))
            state = (
                "gone"
                if project.digest is None
                else "trusted"
                if project.digest == entry.sha256
                else "changed"
            )
        except ConfigError:
            state = "unreadable" if os.path.lexists(path) else "gone"
        print(f"{state:<10} {entry.sha256[:12]}  {entry.trusted_at}  {path}")
    return 0
