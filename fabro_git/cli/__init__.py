"""Entry point and the one error boundary.

`main()` answers `--version` before importing anything heavy, so the common probe stays
fast. Every other invocation goes through `boundary()`, which turns a `FabroError` into
a message and exit 1, Ctrl-C into exit 130, a write refused for lack of space into a
"disk full" message and exit 1, and anything else into a bug report (exit 3) with a crash
log the user can attach to an issue.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_BUG = 3
EXIT_INTERRUPTED = 130


def entry() -> None:
    """The console script: run, flush, and leave without tearing the interpreter down.

    By the time `main` returns every durable write is done (refs, objects, the event
    tail are written with explicit flushes), so the process skips the module teardown
    and garbage collection of a normal exit, which costs ~0.1 s after a run.
    """
    import gc
    import os

    import fabro_git

    # This process may adopt what its stages leave behind (`fabro_git.engine.reaper`);
    # a flag, not an import of the reaper, so `--version` stays fast.
    fabro_git.running_as_command = True
    # Off while the process starts, on again as the command's work begins
    # (`fabro_git.cli._collector`).
    gc.disable()
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"], ["version"]):
        from fabro_git import __version__

        print(f"git-fabro {__version__}")
        return EXIT_OK
    if args[:1] == ["__complete"]:
        # At every Tab of the completion scripts: before the app is built.
        from fabro_git.cli import complete_words

        return complete_words.main(args[1:])

    def invoke() -> int:
        from fabro_git.cli.app import run_app

        return run_app(args)

    return boundary(invoke)


def boundary(fn: Callable[[], int]) -> int:
    from fabro_git.errors import FabroError, disk_full_in
    from fabro_git.terminal import printable

    try:
        return fn()
    except FabroError as err:
        # A message may quote run data (a stage's error, a manifest field, a file name).
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("Interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`git fabro logs | head`); that is not our failure.
        with contextlib.suppress(Exception):
            sys.stdout.close()
        return EXIT_OK
    except Exception as exc:
        # A full disk is the machine's state, not a bug, wherever the write was.
        disk_full = disk_full_in(exc)
        if disk_full is not None:
            print(f"error: {disk_full}", file=sys.stderr)
            return disk_full.exit_code
        log_path = write_crash_log(exc)
        print(
            f"error: unexpected error: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr
        )
        print(
            f"This is a bug in git-fabro. A crash log was written to {log_path};"
            " please attach it to a bug report.",
            file=sys.stderr,
        )
        return EXIT_BUG


def write_crash_log(exc: BaseException) -> str:
    import os
    import platform
    import tempfile
    import traceback
    from datetime import UTC, datetime

    from fabro_git import __version__, redact
    from fabro_git.config.locations import crash_log_dir, make_private_dir, open_private
    from fabro_git.errors import FabroError

    lines = [
        "### version information",
        f"git-fabro: {__version__}",
        f"python: {sys.version.split()[0]} ({sys.executable})",
        f"platform: {platform.platform()}",
        f"argv: {sys.argv!r}",
    ]
    for mod in ("dulwich", "typer", "msgspec", "trio"):
        try:
            from importlib.metadata import version

            lines.append(f"{mod}: {version(mod)}")
        except Exception:
            lines.append(f"{mod}: unknown")
    lines += ["", "### traceback", "".join(traceback.format_exception(exc))]
    # A crash log is meant to be attached to a bug report: mask what looks secret.
    text = redact.for_process().mask_text("\n".join(lines))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    try:
        directory = make_private_dir(crash_log_dir())
        path = directory / f"crash-{stamp}.log"
        with open(open_private(path, os.O_WRONLY | os.O_TRUNC), "w") as out:
            out.write(text)
        return str(path)
    except (OSError, FabroError):
        pass
    # FABRO_HOME is unusable (what may have caused the crash): the system's temporary
    # directory holds the log instead (mkstemp makes it 0600).
    try:
        fd, name = tempfile.mkstemp(prefix=f"git-fabro-crash-{stamp}-", suffix=".log")
        with open(fd, "w") as out:
            out.write(text)
        return name
    except OSError:
        sys.stderr.write(text)
        return "<stderr>"
