"""`git fabro doctor`: what in this machine or repository would get in a run's way.

Each check reads state and reports; none changes anything, and none calls a provider
(`git fabro model test` does that). A `problem` is something that breaks runs and
makes the exit status 1; a `warn` limits what works (no Graphviz, no provider key) or
is debris worth removing. Every line that is not ok says how to fix it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo

MIN_GIT = (2, 31)


@dataclass
class Check:
    name: str
    status: str  # ok, warn or problem
    message: str
    fix: str | None = None


def run(*, json_output: bool) -> int:
    checks = [
        _git_version(),
        _graphviz(),
        *_providers(os.environ),
        _agent_clis(),
        _stage_environment(os.environ),
        _stage_python(os.environ.get("PATH", "")),
        _scratch(),
        _scratch_of_gone_repositories(),
    ]
    repo = _repo()
    if repo is None:
        checks.append(Check("repository", "ok", "not inside a git repository: run checks skipped"))
    else:
        checks += [_locks(repo), _worktrees(repo), _project_trust(repo), _objects(repo)]
    problems = sum(c.status == "problem" for c in checks)
    if json_output:
        doc = {"ok": problems == 0, "checks": [asdict(c) for c in checks]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        from fabro_git.cli import _colour as colour
        from fabro_git.terminal import printable

        on = colour.wanted(sys.stdout)
        styles = {"ok": "green", "warn": "yellow", "problem": "red"}
        for c in checks:
            # A check quotes what it found: run ids, worktree paths, a tool's own words.
            status = colour.paint(c.status.ljust(7), styles[c.status], on)
            sys.stdout.write(f"{status}  {printable(f'{c.name}: {c.message}')}\n")
            if c.fix and c.status != "ok":
                sys.stdout.write(f"         fix: {printable(c.fix)}\n")
        warns = sum(c.status == "warn" for c in checks)
        sys.stdout.write(f"{problems} problem(s), {warns} warning(s)\n")
    return 1 if problems else 0


def _git_version() -> Check:
    try:
        text = subprocess.run(
            ["git", "--version"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return Check("git", "problem", "git is not on PATH", "install git 2.31 or newer")
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return Check("git", "warn", f"cannot read git's version from {text.strip()!r}")
    version = (int(match.group(1)), int(match.group(2)))
    shown = match.group(0)
    if version < MIN_GIT:
        return Check(
            "git", "problem", f"git {shown} is older than 2.31", "install git 2.31 or newer"
        )
    return Check("git", "ok", f"git {shown}")


def _graphviz() -> Check:
    dot = shutil.which("dot")
    if dot is None:
        return Check(
            "graphviz",
            "warn",
            "`dot` is not on PATH: `git fabro graph` can only print --format dot",
            "install Graphviz (apt-get install graphviz, brew install graphviz)",
        )
    return Check("graphviz", "ok", f"dot at {dot}")


def _providers(env: Mapping[str, str]) -> list[Check]:
    """Keys are looked for, never shown and never tried."""
    from fabro_git.llm import catalogue

    checks = []
    ready = []
    for info in catalogue.PROVIDERS.values():
        key_set = catalogue.api_key(info, env) is not None
        url_set = bool(env.get(info.base_url_env, "").strip())
        blank = [var for var in info.key_env if var in env and not env[var].strip()]
        if info.key_required and url_set and not key_set:
            checks.append(
                Check(
                    f"provider {info.name}",
                    "problem",
                    f"{info.base_url_env} is set but no key is ({' or '.join(info.key_env)})",
                    f"export {info.key_env[0]}=..., or unset {info.base_url_env}",
                )
            )
        elif blank and not key_set:
            checks.append(
                Check(
                    f"provider {info.name}",
                    "warn",
                    f"{blank[0]} is set but empty",
                    f"put the key in {blank[0]}, or unset it",
                )
            )
        if catalogue.configured(info, env):
            where = next((v for v in info.key_env if env.get(v, "").strip()), info.base_url_env)
            ready.append(f"{info.name} ({where})")
    if ready:
        checks.append(Check("providers", "ok", "configured: " + ", ".join(ready)))
    else:
        names = ", ".join(
            info.key_env[0] for info in catalogue.PROVIDERS.values() if info.key_required
        )
        checks.append(
            Check(
                "providers",
                "warn",
                "no provider is configured: LLM stages can only run with --dry-run",
                f"export one of {names} (or a local server's URL)",
            )
        )
    return checks


def _agent_clis() -> Check:
    """The agent CLIs `backend="cli"` stages can run; none is needed otherwise."""
    from fabro_git.llm.cli import PROFILES

    found = [(p.program, shutil.which(p.program)) for p in PROFILES.values()]
    there = [f"{program} ({path})" for program, path in found if path]
    if there:
        return Check("agent CLIs", "ok", "on PATH: " + ", ".join(there))
    names = ", ".join(program for program, _ in found)
    return Check(
        "agent CLIs",
        "ok",
        f"none of {names} is on PATH: backend=cli stages need one, or [run.agent] cli_command",
    )


def _stage_environment(environ: dict[str, str] | os._Environ[str]) -> Check:
    """Which variables of this environment stages will not get (names only: a value
    is never shown)."""
    from fabro_git.engine.stage_env import stripped_names

    names = stripped_names(environ)
    if not names:
        return Check("stage environment", "ok", "no secret-named variable to keep from stages")
    return Check(
        "stage environment",
        "ok",
        f"kept from stages (secret-named): {', '.join(names)}; "
        'pass one on with [run.sandbox.env] NAME = "{{ env.NAME }}" '
        "(an agent CLI gets its own provider's key)",
    )


# What a stage that runs Python tools finds first on PATH.
_PYTHON_TOOLS = ("python3", "python", "pip", "pytest")


def _stage_python(path: str) -> Check:
    """Whether stages, which get this PATH, would find git fabro's own interpreter first:
    a venv's bin put on PATH to reach `git-fabro` makes a stage's `python3 -m pytest`
    run without the project's packages."""
    own_bin = Path(sys.executable).parent
    if sys.prefix == sys.base_prefix:
        return Check("stage python", "ok", "git fabro runs on the system's Python")
    shadowed = []
    for tool in _PYTHON_TOOLS:
        found = shutil.which(tool, path=path)
        try:
            if found is not None and os.path.samefile(Path(found).parent, own_bin):
                shadowed.append(tool)
        except OSError:
            continue
    if not shadowed:
        return Check(
            "stage python", "ok", f"git fabro's own environment ({sys.prefix}) is not on PATH"
        )
    return Check(
        "stage python",
        "warn",
        f"{', '.join(shadowed)} on PATH come from git fabro's own environment ({own_bin}): "
        "command stages would run them instead of your project's",
        "take that directory off PATH and put only the command there "
        f"(ln -s {own_bin / 'git-fabro'} ~/.local/bin/), or install with `pipx install .`",
    )


def _scratch() -> Check:
    from fabro_git.config.locations import runs_dir

    root = runs_dir()
    if not root.exists():
        return Check("scratch", "ok", f"{root} does not exist yet (made private on first run)")
    loose = []
    for path in [root, *(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())]:
        info = path.lstat()
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            loose.append(path)
        elif info.st_uid != os.getuid():
            return Check(
                "scratch",
                "problem",
                f"{path} belongs to another user (uid {info.st_uid})",
                f"set FABRO_HOME to a directory of your own, or remove {path}",
            )
    if loose:
        shown = ", ".join(str(p) for p in loose[:3]) + (" …" if len(loose) > 3 else "")
        return Check(
            "scratch",
            "problem",
            f"{len(loose)} scratch dir(s) readable by others: {shown}",
            "chmod 700 " + " ".join(str(p) for p in loose[:3]) + (" …" if len(loose) > 3 else ""),
        )
    return Check("scratch", "ok", f"{root} is private")


def _scratch_of_gone_repositories() -> Check:
    from fabro_git.cli._housekeeping import scratch_of_gone_repositories

    found = scratch_of_gone_repositories()
    if not found:
        return Check("abandoned scratch", "ok", "every scratch dir's repository still exists")
    shown = ", ".join(str(p) for p in found[:3]) + (" …" if len(found) > 3 else "")
    return Check(
        "abandoned scratch",
        "warn",
        f"{len(found)} scratch dir(s) of repositories that no longer exist: {shown}",
        "git fabro prune (in any repository) removes them",
    )


def _repo() -> GitRepo | None:
    from fabro_git.errors import FabroError
    from fabro_git.store.repo import GitRepo

    try:
        return GitRepo.discover(Path.cwd())
    except FabroError:
        return None


def _project_trust(repo: GitRepo) -> Check:
    """A `.fabro/project.toml` whose hooks, servers or pushes wait for `git fabro trust`."""
    from fabro_git.config.trust import TRUST_HINT, TrustStore, read_project, untrusted_words
    from fabro_git.errors import FabroError

    name = "project config"
    try:
        project = read_project(repo.root)
        status = TrustStore().status(project) if project.actions else "trusted"
    except FabroError as err:
        return Check(name, "problem", err.message, "fix the file; runs refuse it as it is")
    if project.digest is None:
        return Check(name, "ok", "no .fabro/project.toml")
    if not project.actions:
        return Check(name, "ok", f"{project.path} sets only keys that need no trust")
    if status == "trusted":
        return Check(name, "ok", f"{project.path} is trusted")
    return Check(name, "warn", untrusted_words(project, status), TRUST_HINT)


def _locks(repo: GitRepo) -> Check:
    """Run locks of runs that no longer exist, and ref locks a killed process left."""
    from fabro_git.engine.lock import is_live
    from fabro_git.store import runs as runrefs

    git_dir = Path(repo.git_dir)
    runs = set(runrefs.list_run_ids(repo))
    orphans = [
        p
        for p in sorted((git_dir / "fabro" / "locks").glob("*.lock"))
        if p.stem not in runs and not is_live(git_dir, p.stem)
    ]
    stale_refs = []
    for namespace in ("refs/fabro", "refs/heads/fabro"):
        for path in sorted((git_dir / namespace).rglob("*.lock")):
            run_id = _run_of_ref(path.relative_to(git_dir).as_posix())
            if run_id is None or not is_live(git_dir, run_id):
                stale_refs.append(path)
    if stale_refs:
        shown = " ".join(str(p) for p in stale_refs[:3]) + (" …" if len(stale_refs) > 3 else "")
        return Check(
            "locks",
            "problem",
            f"{len(stale_refs)} ref lock(s) left by a killed process block updates of their ref: {shown}",
            f"rm {shown}  (or `git fabro resume` the run, which clears its own)",
        )
    if orphans:
        shown = " ".join(str(p) for p in orphans[:3]) + (" …" if len(orphans) > 3 else "")
        return Check(
            "locks",
            "warn",
            f"{len(orphans)} lock file(s) of runs that no longer exist",
            f"rm {shown}",
        )
    return Check("locks", "ok", "no stale locks")


def _objects(repo: GitRepo) -> Check:
    """Runs whose refs lead to objects git no longer has (a `git gc --prune=now` while a
    run was writing). One walk of every run's objects (less what the user's branches
    and tags hold) answers for all; only when it finds something is each run walked."""
    from fabro_git.store import runs as runrefs

    runs = runrefs.list_run_ids(repo)
    if not runs:
        return Check("objects", "ok", "no runs to check")
    if not _missing_objects(repo, ["--glob=refs/fabro/meta", "--glob=refs/heads/fabro/run"]):
        return Check("objects", "ok", f"every object of {len(runs)} run(s) is present")
    broken: list[str] = []
    for run_id in runs:
        tips = [runrefs.meta_ref(run_id)]
        if repo.read_ref(runrefs.run_branch_ref(run_id)) is not None:
            tips.append(runrefs.run_branch_ref(run_id))
        missing = _missing_objects(repo, tips)
        if missing:
            broken.append(f"{run_id} ({missing[0]}{' …' if len(missing) > 1 else ''})")
    if not broken:
        return Check("objects", "ok", f"every object of {len(runs)} run(s) is present")
    return Check(
        "objects",
        "problem",
        f"{len(broken)} run(s) lead to objects git no longer has: " + ", ".join(broken),
        "fetch those runs again from a remote that has them (`git fabro fetch`), or go back "
        "to an earlier checkpoint (`git fabro rewind RUN --list`)",
    )


def _missing_objects(repo: GitRepo, tips: list[str]) -> list[str]:
    """The objects reachable from `tips` (and not from the user's branches and tags)
    that git does not have, as `missing <sha>`; a walk git cannot finish is one too."""
    args = [
        "git",
        "rev-list",
        "--objects",
        "--missing=print",
        *tips,
        "--not",
        "--exclude=refs/heads/fabro/*",
        "--branches",
        "--tags",
    ]
    proc = subprocess.run(args, cwd=repo.root, capture_output=True, text=True, check=False)
    missing = [
        f"missing {line[1:].strip()}" for line in proc.stdout.splitlines() if line[:1] == "?"
    ]
    if proc.returncode != 0 and not missing:
        lines = proc.stderr.strip().splitlines()
        missing.append(lines[-1] if lines else f"git rev-list exited {proc.returncode}")
    return missing


def _run_of_ref(relpath: str) -> str | None:
    """The run a ref lock file belongs to: `refs/fabro/meta/<id>.lock` and the like."""
    parts = relpath.removesuffix(".lock").split("/")
    for prefix in (
        ["refs", "fabro", "meta"],
        ["refs", "heads", "fabro", "run"],
        ["refs", "fabro", "parallel"],
    ):
        if parts[: len(prefix)] == prefix and len(parts) > len(prefix):
            return parts[len(prefix)]
    return None


def _worktrees(repo: GitRepo) -> Check:
    """Run worktrees under the scratch dir whose run is gone, or finished but kept."""
    from fabro_git.config.locations import runs_dir
    from fabro_git.engine.lock import is_live
    from fabro_git.errors import FabroError
    from fabro_git.store import runs as runrefs
    from fabro_git.store.worktree import all_worktrees

    try:
        entries = all_worktrees(repo)
    except FabroError as err:
        return Check("worktrees", "warn", f"cannot list worktrees: {err.message}")
    root = runs_dir().resolve()
    git_dir = Path(repo.git_dir)
    gone, prunable, finished, kept = [], [], [], 0
    for entry in entries:
        path = Path(entry["worktree"])
        resolved = Path(os.path.realpath(path))
        if not resolved.is_relative_to(root) or resolved == root:
            continue
        if "prunable" in entry:
            prunable.append(path)
            continue
        # runs/<run id>-<repo key>/worktree, or .../parallel/<node>-<visit>/<n>
        run_id = resolved.relative_to(root).parts[0].split("-", 1)[0]
        meta = repo.read_ref(runrefs.meta_ref(run_id))
        if meta is None:
            gone.append(path)
        elif not is_live(git_dir, run_id):
            status = repo.commit_info(meta).trailers.get("Fabro-Status")
            if status in ("succeeded", "partially_succeeded"):
                finished.append(path)
            else:
                kept += 1
    if gone or finished:
        paths = [*gone, *finished]
        cmd = "; ".join(f"git worktree remove --force {p}" for p in paths[:3]) + (
            " …" if len(paths) > 3 else ""
        )
        what = []
        if gone:
            what.append(f"{len(gone)} of runs that no longer exist")
        if finished:
            what.append(f"{len(finished)} of finished runs")
        return Check("worktrees", "warn", "leftover run worktrees: " + ", ".join(what), cmd)
    if prunable:
        return Check(
            "worktrees",
            "warn",
            f"{len(prunable)} run worktree(s) whose directory is gone",
            "git worktree prune",
        )
    note = f"; {kept} kept for resumable runs" if kept else ""
    return Check("worktrees", "ok", "no leftover run worktrees" + note)
