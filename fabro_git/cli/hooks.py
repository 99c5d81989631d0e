"""`git fabro hooks install|uninstall`: the opt-in git hooks that carry a run's metadata.

A plain `git push origin fabro/run/<id>` moves the run's branch but not its metadata
ref, so a clone cannot resume or inspect the run. The `pre-push` hook closes that gap:
it pushes `refs/fabro/meta/<id>` (and the run's parallel refs) along with the branch.

The scripts ship inside the package (`fabro_git/hooks/`; the top-level `hooks/` of the
source tree links to them), and are POSIX sh calling `git push`, so they keep working
without Python on the path. Installation is careful about what was there before: our
scripts carry a marker line; a foreign hook is moved to `<name>.legacy` and chained
(ours runs it first and honours its veto); installing twice changes nothing; and
uninstalling puts the foreign hook back as it was. When `core.hooksPath` is set the
hooks directory is the user's own, shared machinery, and we refuse to write into it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from fabro_git.cli._typer import GROUP_SETTINGS

MARKER = "git-fabro-hook:"
HOOKS = ("pre-push",)
LEGACY_SUFFIX = ".legacy"

app = typer.Typer(
    name="hooks",
    help="Install or remove the git hooks that push a run's metadata with its branch.",
    add_completion=False,
    **GROUP_SETTINGS,
)


@app.command("install")
def _install_command() -> None:
    """Install the pre-push hook; an existing hook is kept and runs first."""
    raise typer.Exit(install(Path.cwd()))


@app.command("uninstall")
def _uninstall_command() -> None:
    """Remove the hook and put back the one it replaced."""
    raise typer.Exit(uninstall(Path.cwd()))


def script(name: str) -> bytes:
    from importlib.resources import files

    return (files("fabro_git") / "hooks" / name).read_bytes()


def is_ours(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return MARKER.encode() in head


def hooks_dir(cwd: Path) -> Path:
    """The repository's hooks dir, or a ConfigError saying why it is not ours to use."""
    from fabro_git.errors import ConfigError, RepositoryError, StoreError
    from fabro_git.store._gitcli import out, run_git

    try:
        path = out(run_git(["rev-parse", "--path-format=absolute", "--git-path", "hooks"], cwd=cwd))
    except StoreError as exc:
        raise RepositoryError(
            f"{cwd} is not inside a git repository",
            hint="run `git fabro hooks install` in the repository whose pushes should carry run metadata",
        ) from exc
    configured = run_git(["config", "--get", "core.hooksPath"], cwd=cwd, check=False)
    if configured.returncode == 0 and configured.stdout.strip():
        where = configured.stdout.decode("utf-8", "replace").strip()
        raise ConfigError(
            f"core.hooksPath is set ({where}); git fabro will not write into a hooks dir that is managed elsewhere",
            hint="add the script `git fabro` ships (fabro_git/hooks/pre-push) to your hook manager,"
            " or unset core.hooksPath and install again",
        )
    return Path(path.strip())


def install(cwd: Path) -> int:
    from fabro_git.errors import ConfigError

    directory = hooks_dir(cwd)
    directory.mkdir(parents=True, exist_ok=True)
    for name in HOOKS:
        target = directory / name
        legacy = directory / (name + LEGACY_SUFFIX)
        body = script(name)
        if target.is_symlink() or target.exists():
            if is_ours(target):
                if target.read_bytes() == body:
                    print(f"{name}: already installed in {directory}", file=sys.stderr)
                    continue
            elif legacy.is_symlink() or legacy.exists():
                raise ConfigError(
                    f"{target} and {legacy} both exist; git fabro keeps the existing hook as"
                    f" {legacy.name} and will not overwrite either",
                    hint="merge or remove one of them, then run `git fabro hooks install` again",
                )
            else:
                os.replace(target, legacy)
                print(
                    f"{name}: kept the existing hook as {legacy.name}; it runs first",
                    file=sys.stderr,
                )
        _write_executable(target, body)
        print(f"{name}: installed in {directory}", file=sys.stderr)
    return 0


def uninstall(cwd: Path) -> int:
    directory = hooks_dir(cwd)
    for name in HOOKS:
        target = directory / name
        legacy = directory / (name + LEGACY_SUFFIX)
        if not (target.is_symlink() or target.exists()):
            if legacy.is_symlink() or legacy.exists():
                os.replace(legacy, target)
                print(f"{name}: restored {legacy.name}", file=sys.stderr)
            else:
                print(f"{name}: not installed", file=sys.stderr)
            continue
        if not is_ours(target):
            print(f"{name}: {target} is not git fabro's; left as it is", file=sys.stderr)
            continue
        target.unlink()
        if legacy.is_symlink() or legacy.exists():
            os.replace(legacy, target)
            print(f"{name}: removed; the hook it replaced is back", file=sys.stderr)
        else:
            print(f"{name}: removed", file=sys.stderr)
    return 0


def _write_executable(path: Path, body: bytes) -> None:
    """Write through a temp file and a rename, so a push never runs half a hook."""
    tmp = path.with_name(f".{path.name}.fabro-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(body)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
