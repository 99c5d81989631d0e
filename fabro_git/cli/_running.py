"""What starting a run (`run.py`) and resuming one (`resume.py`) share: reading answers
from stdin, the progress display, a detached child to go on in the background, and the
report at the run's end (also `attach`'s)."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.errors import FabroError, disk_full_in

if TYPE_CHECKING:
    from fabro_git.config.run_config import RunSection
    from fabro_git.engine.checkpoint import TokenTotals
    from fabro_git.engine.finish import RunResult
    from fabro_git.engine.fixes import Fixes
    from fabro_git.engine.options import Options
    from fabro_git.events.render import ProgressRenderer
    from fabro_git.store.repo import GitRepo


@contextlib.contextmanager
def disk_full_names_the_run(run_id: str) -> Iterator[None]:
    """A full disk during a run ends with the run id and how to resume it."""
    try:
        yield
    except Exception as exc:
        disk_full = disk_full_in(exc)
        if disk_full is None:
            raise
        raise disk_full.for_run(run_id) from None


def stdin_answers() -> bool:
    """Whether human gates may read answers from stdin: a terminal, or a pipe or file
    (`printf 'R\\nA\\n' | git fabro run ...`, one answer a line). /dev/null and a
    closed stdin are not: their gates fail closed at once."""
    import stat

    try:
        if sys.stdin is None or sys.stdin.isatty():
            return sys.stdin is not None
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def use_run_author(repo: GitRepo, run: RunSection) -> None:
    """The run's commits carry `[run.git.author]` when its configuration names one."""
    author = run.git.author if run.git is not None else None
    if author is not None and (author.name is not None or author.email is not None):
        repo.override_author(author.name, author.email)


def progress_renderer(output: str) -> ProgressRenderer:
    from fabro_git.events.render import ProgressRenderer

    return ProgressRenderer(stream=sys.stderr, output=output)


def report(
    result: RunResult, json_output: bool, repo: GitRepo, base_sha: str, *, shown: bool
) -> int:
    """After the run: where its result is, or what to do about it. `shown` says the
    progress display already printed the failure, so it is not printed again."""
    from fabro_git.engine.session import write_json_result

    if json_output:
        write_json_result(result)
    run_id = result.run_id
    if result.status == "interrupted" and result.error:
        # Stopped at its spending cap: a plain resume would stop again at once.
        print(
            f"run {run_id} stopped: {result.error}; continue it with"
            f" `git fabro resume {run_id} --max-cost USD` (a higher cap)",
            file=sys.stderr,
        )
    elif result.status == "interrupted":
        if not shown:  # else the run's own notice said it, with the resume command
            print(
                f"run {run_id} interrupted; resume it with `git fabro resume {run_id}`",
                file=sys.stderr,
            )
    elif result.error:
        if not shown:
            from fabro_git import redact
            from fabro_git.terminal import printable

            error = printable(redact.for_process().mask_text(result.error))
            print(f"error: run {run_id} failed: {error}", file=sys.stderr)
        print(
            f"hint: see what happened with `git fabro logs {run_id} --pretty`;"
            f" {_fix_hint(repo, run_id)}",
            file=sys.stderr,
        )
    elif result.run_branch and result.final_git_commit_sha and not json_output:
        spent = model_use(result.tokens, result.total_cost)
        tip = result.final_git_commit_sha
        where_the_result_is(repo, run_id, result.run_branch, base_sha, tip, spent)
    code: int = result.exit_code
    return code


def _fix_hint(repo: GitRepo, run_id: str) -> str:
    """How to continue a failed run after fixing its cause: a stage that failed is
    fixed in the repository (`--rebase`), a walk that could not go on (no route, a
    visit limit) in the workflow (`--workflow`)."""
    from fabro_git.engine import outcome
    from fabro_git.engine.session import load_run

    plain = f"fix the cause and `git fabro resume {run_id}`"
    try:
        manifest, cp, _meta, _source = load_run(repo, run_id)
    except FabroError:
        return plain
    if manifest.in_place:
        return plain
    last = cp.node_outcomes.get(cp.next_node_id or "")
    failed = last is not None and last["status"] == outcome.FAILED
    if failed:
        base = manifest.base_branch or manifest.base_sha[:12]
        return (
            f"commit a fix and `{shlex.join(['git', 'fabro', 'resume', run_id, '--rebase', base])}`"
        )
    return f"correct the workflow and `git fabro resume {run_id} --workflow FILE`"


def where_the_result_is(
    repo: GitRepo, run_id: str, branch: str, base: str, tip: str, spent: str | None
) -> None:
    """The result line: the run's branch, what it changed, and `spent` (`model_use`)."""
    try:
        commits, files = repo.change_summary(base, tip)
    except FabroError:
        return
    changed = f"{files} file{'s' if files != 1 else ''} changed" if files else "no files changed"
    lines = [f"Result: branch {branch}, {commits} commit{'s' if commits != 1 else ''}, {changed}"]
    if files:
        lines.append(f"  review:   git fabro diff {run_id[:12]}")
        lines.append(f"  take it:  git merge --squash {branch}")
    if spent:
        lines.append(f"  model:    {spent}")
    lines.append(
        f"  details:  git fabro logs {run_id[:12]} --pretty   git fabro inspect {run_id[:12]}"
    )
    from fabro_git.terminal import printable

    # The branch name is the manifest's: a fetched run's, for `attach`.
    print(printable("\n".join(lines)), file=sys.stderr)


def model_use(tokens: TokenTotals, total_cost: float) -> str | None:
    """A run's tokens and cost, as its checkpoint counts them; None when it called no
    model."""
    from fabro_git.events.render import format_cost

    if not tokens.total_tokens:
        return None
    text = (
        f"{tokens.total_tokens:,} tokens ({tokens.input_tokens:,} in / "
        f"{tokens.output_tokens:,} out)"
    )
    return text + (f", about {format_cost(total_cost)}" if total_cost else "")


# The variable that hands a detached child the goal and inputs its run holds only
# masked. Its name looks secret, so no stage is given it and its value is masked too.
CARRIED_SECRETS = "FABRO_DETACHED_SECRETS"


def carried_secrets(goal: str, inputs: Mapping[str, str]) -> str | None:
    """The goal and inputs, as JSON, that the stored run holds only masked (a goal with
    a key in it, an input whose name looks secret); None when there are none. A
    detached child reads the run from git: without them it would run on the masks."""
    import json

    from fabro_git import redact

    kept = {name: value for name, value in inputs.items() if redact.masked(value) != value}
    whole = goal if redact.masked(goal) != goal else None
    if whole is None and not kept:
        return None
    return json.dumps({"goal": whole, "inputs": kept})


def take_carried_secrets() -> tuple[str | None, dict[str, str]]:
    """What the command that started this detached child carried (`carried_secrets`),
    taken out of the environment so that nothing this process starts inherits it."""
    import json

    text = os.environ.pop(CARRIED_SECRETS, None)
    if not text:
        return None, {}
    try:
        data = json.loads(text)
    except ValueError:
        return None, {}
    goal = data.get("goal") if isinstance(data, dict) else None
    inputs = data.get("inputs") if isinstance(data, dict) else None
    return (
        goal if isinstance(goal, str) else None,
        {
            str(name): value
            for name, value in (inputs.items() if isinstance(inputs, dict) else ())
            if isinstance(value, str)
        },
    )


def spawn_detached(
    repo: GitRepo,
    run_id: str,
    options: Options,
    fixes: Fixes | None = None,
    *,
    carried: str | None = None,
) -> None:
    """Go on with the run in a child in the background (`resume --detached-child`).
    `carried`: the goal and inputs its run holds only masked (`carried_secrets`)."""
    from fabro_git.config.locations import make_private_dir, open_private, run_scratch_dir
    from fabro_git.engine.lock import mark_starting

    argv = [sys.executable, "-m", "fabro_git", "resume", run_id, "--detached-child"]
    if options.auto_approve:
        argv.append("--auto-approve")
    for answer in options.answers:
        argv += ["--answer", answer]
    if options.push_remote:
        argv += ["--push", options.push_remote]
    if not options.retro:
        argv.append("--no-retro")
    if options.max_cost is not None:
        argv += ["--max-cost", repr(options.max_cost)]
    if fixes is not None and fixes.rebase is not None:
        argv += ["--rebase", fixes.rebase.sha]
    if fixes is not None and fixes.workflow is not None:
        argv += ["--workflow", str(fixes.workflow.path.resolve())]
    # Marked first with this process's pid (alive while it starts the child): a git dir
    # that cannot take the mark refuses before any child starts.
    mark_starting(Path(repo.git_dir), run_id, os.getpid())
    log = make_private_dir(run_scratch_dir(Path(repo.git_dir), run_id)) / "detached.log"
    with open(open_private(log, os.O_WRONLY | os.O_APPEND), "ab") as out:
        child = subprocess.Popen(
            argv,
            cwd=repo.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(os.environ, **({CARRIED_SECRETS: carried} if carried else {})),
        )
    mark_starting(Path(repo.git_dir), run_id, child.pid)


def remember_config_secrets(run: RunSection) -> None:
    """Mask the credentials the run's configuration holds or hands its stages, on a
    resume as on the run's start."""
    from fabro_git import redact
    from fabro_git.config.run_config import config_secrets

    redact.remember_values(config_secrets(run))
