"""`git fabro trust`: allow this repository's `.fabro/project.toml` to act, revoke that,
or list what is trusted (the mechanism is `fabro_git.config.trust`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.config.trust import RunConfigActions, TrustStore, describe, read_project, shown
from fabro_git.errors import ConfigError

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo


def run(*, yes: bool, revoke: bool, list_only: bool, run_id: str | None = None) -> int:
    if sum((yes, revoke, list_only)) > 1:
        raise ConfigError("--yes, --revoke and --list do not go together; pass one")
    store = TrustStore()
    if list_only:
        return _list(store)
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    if run_id is not None:
        if revoke:
            raise ConfigError(
                "--revoke takes no --run: a run's configuration is trusted by content"
            )
        return _trust_run(store, repo, run_id, yes=yes)
    project = read_project(repo.root)
    if revoke:
        if store.revoke(project.path, project.repo_root):
            print(f"{project.path} and the run configurations approved here: no longer trusted")
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
    if not yes and not _confirmed("read the file, then pass --yes to trust it as it is"):
        return 1
    store.trust(project)
    print(f"trusted {shown(os.fspath(project.path))} (sha256 {project.digest[:12]})")
    return 0


def _confirmed(hint: str) -> bool:
    if not (sys.stdin is not None and sys.stdin.isatty()):
        raise ConfigError("not trusted: confirming needs a terminal", hint=hint)
    sys.stdout.write("Trust this exact content? [y/N] ")
    sys.stdout.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        print("not trusted")
        return False
    return True


def _trust_run(store: TrustStore, repo: GitRepo, run_id: str, *, yes: bool) -> int:
    """Trust the configuration a run recorded (a fetched run's hooks, servers, pushes),
    so `resume` lets it act."""
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.engine.stored_run import run_trust
    from fabro_git.store import runs as runrefs
    from fabro_git.terminal import printable

    if repo.read_ref(runrefs.batch_ref(run_id)) is not None:
        return _trust_batch(store, repo, run_id, yes=yes)
    full_id = resolve_run(repo, run_id)
    recorded = run_trust(repo, full_id, load_run(repo, full_id))
    if not recorded.actions:
        print(f"run {full_id}'s configuration and workflow do nothing that needs trust")
        return 0
    shown_id = printable(full_id, one_line=True)
    return _approve(
        store,
        repo,
        recorded,
        full_id,
        what=f"run {shown_id}'s recorded configuration",
        read=f"git fabro inspect {full_id}",
        yes=yes,
    )


def _trust_batch(store: TrustStore, repo: GitRepo, batch_id: str, *, yes: bool) -> int:
    """Trust what a batch record chooses (its workflow, its remote) and what the runs it
    would resume recorded, so that `batch --resume` lets them act."""
    from fabro_git.cli.batch import batch_trust, describe_batch
    from fabro_git.engine import batch as batches
    from fabro_git.terminal import printable

    record = batches.read_record(repo, batch_id)
    shown_id = printable(batch_id, one_line=True)
    untrusted = batch_trust(repo, record, store)
    if not untrusted:
        print(f"batch {shown_id} is already trusted")
        return 0
    print(describe_batch(record, untrusted))
    read = f"git fabro batch status {batch_id}"
    if not yes and not _confirmed(f"read it with `{read}`, then pass --yes to trust it"):
        return 1
    for who, recorded in untrusted:
        store.trust_config(recorded.digest, repository=repo.root, run_id=who)
    print(f"trusted batch {shown_id} and the {len(untrusted)} part(s) of it asked about")
    return 0


def _approve(
    store: TrustStore,
    repo: GitRepo,
    recorded: RunConfigActions,
    source_id: str,
    *,
    what: str,
    read: str,
    yes: bool,
) -> int:
    """Show what `what` (a run's recorded configuration, a batch record) would do and
    record the user's consent to its digest: on a terminal asked, else by `--yes`."""
    if store.trusts_config(recorded.digest):
        print(f"{what} is already trusted")
        return 0
    print(f"{what} would:\n{describe(recorded.actions)}")
    if not yes and not _confirmed(f"read it with `{read}`, then pass --yes to trust it"):
        return 1
    store.trust_config(recorded.digest, repository=repo.root, run_id=source_id)
    print(f"trusted {what} (sha256 {recorded.digest[:12]})")
    return 0


def _list(store: TrustStore) -> int:
    entries = store.entries()
    configs = store.configs()
    if not entries and not configs:
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
    for config in configs:
        print(f"{'run config':<10} {config.sha256[:12]}  {config.trusted_at}  run {config.run_id}")
    return 0
