"""Helpers the tests import (`from helpers import run_fabro, git, ...`): the real
`git fabro` command and real git, run against the repositories the fixtures make."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import forked_cli

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of the module at `path`, parsed once a test process: the scans of
    the package's code read each module many times over, and none changes a tree."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def fabro_exe() -> list[str]:
    """The real installed entry point, falling back to `python -m fabro_git`."""
    exe = shutil.which("git-fabro")
    return [exe] if exe else [sys.executable, "-m", "fabro_git"]


def start_fabro(
    args: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    start_new_session: bool = False,
) -> Any:
    """The installed `git-fabro ARGS` started as `subprocess.Popen([*fabro_exe(), *ARGS],
    ...)` starts it (`env`, as Popen's, is the whole environment), forked from a warm
    interpreter where that gives the same process (`forked_cli.start`). What it returns
    has Popen's `pid`, `stdin`/`stdout`/`stderr`, `returncode`, `poll`, `wait`,
    `communicate`, `send_signal`, `terminate` and `kill`."""
    full_env = dict(os.environ if env is None else env)
    streams = (stdin, stdout, stderr)
    warm = forked_cli.start(
        list(args), cwd, full_env, streams, text=text, new_session=start_new_session
    )
    if warm is not None:
        return warm
    return subprocess.Popen(
        [*fabro_exe(), *args],
        cwd=cwd,
        env=full_env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=text,
        start_new_session=start_new_session,
    )


def run_fabro(
    *args: str,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `git fabro ARGS` through the real git front end and the installed command,
    or, where that gives the same process, as the installed command's entry point forked
    from a warm interpreter (`forked_cli`)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    warm = forked_cli.run(list(args), cwd, full_env, input, timeout)
    if warm is not None:
        return warm
    # No input means no stdin at all, as in CI: a human gate must not wait on a pipe
    # the test runner happens to hold open.
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(
        ["git", "fabro", *args],
        cwd=cwd,
        **stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def trust_project(repo: Path) -> None:
    """Trust `repo`'s `.fabro/project.toml` as it is now, through the real command (its
    hooks, MCP servers, cli_command and pushes act only once trusted)."""
    proc = run_fabro("trust", "--yes", cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def write_workflow(directory: Path, text: str, name: str = "wf.fabro") -> Path:
    """Write a workflow file and commit it, so runs start from a clean checkout."""
    path = directory / name
    path.write_text(text)
    git(directory, "add", name)
    git(directory, "commit", "-q", "-m", f"add {name}")
    return path


def run_json(
    *args: str, cwd: Path, timeout: float = 120, input: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`git fabro ARGS --json`; returns the process and its final JSON object."""
    import json

    proc = run_fabro(*args, "--json", cwd=cwd, timeout=timeout, input=input)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no JSON on stdout\nstderr:\n{proc.stderr}"
    return proc, json.loads(lines[-1])


def run_events(run_id: str, cwd: Path, env: dict[str, str] | None = None) -> list[dict]:
    """The run's events as `git fabro logs` prints them, each one checked against the
    events contract: every test that reads a run's events checks what it reads. The one
    way tests read a run's events.

    Read in process through the run reader `logs` prints from (its lines are the ones
    `logs` prints: tests/engine/test_reader.py holds the two to that), which spares
    each read the start of a process; with `env` (another machine's FABRO_HOME, say),
    through `git fabro logs` in that environment."""
    if env is not None:
        proc = run_fabro("logs", run_id, cwd=cwd, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
    else:
        from fabro_git.engine import reader
        from fabro_git.store.repo import GitRepo

        with GitRepo.discover(cwd) as repo:
            recorded = reader.read_events(repo, reader.resolve_run(repo, run_id))
        lines = [event.json_text for event in recorded]
    events = [json.loads(line) for line in lines]
    problems = [problem for event in events for problem in contract_problems(event)]
    assert problems == [], "events break the contract:\n" + "\n".join(problems[:20])
    return events


def events_named(events: list[dict], name: str, node: str | None = None) -> list[dict]:
    """The events called `name` (of node `node`, when given), in order."""
    return [e for e in events if e["event"] == name and (node is None or e.get("node_id") == node)]


def bare_remote(tmp_path: Path, name: str = "origin.git", *, origin_of: Path | None = None) -> Path:
    """A new bare repository under `tmp_path`: the remote a test pushes to and clones or
    fetches from. With `origin_of`, it is that repository's `origin`, holding its `main`."""
    remote = tmp_path / name
    git(tmp_path, "init", "-q", "--bare", str(remote))
    if origin_of is not None:
        git(origin_of, "remote", "add", "origin", str(remote))
        git(origin_of, "push", "-q", "origin", "main")
    return remote


@functools.cache
def _contract() -> Any:
    from event_contract.seed import load_contract

    return load_contract()


def contract_problems(event: dict) -> list[str]:
    """What is wrong with `event` by the events contract (nothing: an empty list)."""
    from event_contract.check import check_event

    return check_event(event, _contract())


def meta_file(cwd: Path, run_id: str, path: str) -> str:
    return git(cwd, "show", f"refs/fabro/meta/{run_id}:{path}")


# The checkpoint maps a delta carries entry by entry (fabro_git.engine.checkpoint).
_DELTA_MAPS = (
    "node_visits",
    "node_retries",
    "node_outcomes",
    "context_values",
    "loop_failure_signatures",
    "restart_failure_signatures",
    "stage_serials",
)


def read_checkpoint(cwd: Path, rev: str) -> dict:
    """The complete checkpoint of the meta commit `rev`, read with git alone: a stage
    checkpoint git holds as a delta is put back together with the one it names."""
    data = json.loads(git(cwd, "show", f"{rev}:checkpoint.json"))
    base_sha = data.pop("delta_of", None)
    removed = data.pop("removed", {})
    if base_sha is None:
        return data
    base = json.loads(git(cwd, "show", f"{base_sha}:checkpoint.json"))
    assert "delta_of" not in base, "a delta's base must be a complete checkpoint"
    for name in _DELTA_MAPS:
        merged = {k: v for k, v in base.get(name, {}).items() if k not in removed.get(name, [])}
        merged.update(data[name])
        data[name] = merged
    data["completed_nodes"] = base["completed_nodes"] + data["completed_nodes"]
    return data


def assert_fsck_clean(repo: Path) -> None:
    """`git fsck --strict` finds nothing wrong (dangling objects are not wrong: a killed
    or refused write leaves some, and git collects them in time)."""
    proc = subprocess.run(
        ["git", "fsck", "--strict", "--no-progress", "--no-dangling"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"git fsck --strict in {repo} reported:\n{proc.stdout}{proc.stderr}"
    )


def loosen_packs(repo: Path) -> None:
    """Make every object of the repository a loose file: each pack is moved out of
    the object store, then its objects are unpacked back loose."""
    import shutil
    import tempfile

    pack_dir = repo / ".git" / "objects" / "pack"
    with tempfile.TemporaryDirectory() as aside:
        for pack in sorted(pack_dir.glob("*.pack")):
            moved = Path(aside) / pack.name
            shutil.move(pack, moved)
            pack.with_suffix(".idx").unlink()
            pack.with_suffix(".rev").unlink(missing_ok=True)
            with moved.open("rb") as fh:
                subprocess.run(["git", "unpack-objects", "-q"], cwd=repo, stdin=fh, check=True)


def drop_object(repo: Path, sha: str) -> None:
    """Remove object `sha` from the repository, packed or loose (a `git gc
    --prune=now` at the wrong moment, or a damaged disk)."""
    loosen_packs(repo)
    path = repo / ".git" / "objects" / sha[:2] / sha[2:]
    assert path.is_file(), f"{sha} is not in {repo}"
    path.unlink()


def meta_bytes(repo: Path, run_id: str, path: str) -> bytes:
    """A file of the run's meta ref, as bytes."""
    return subprocess.run(
        ["git", "show", f"refs/fabro/meta/{run_id}:{path}"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout


def fresh_clone(repo: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone of `repo` through a bare remote that has fetched every run, and the
    environment of another machine (its own FABRO_HOME: no scratch dir of the run)."""
    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    fetched = run_fabro("fetch", "origin", cwd=clone, env=env)
    assert fetched.returncode == 0, fetched.stderr
    return clone, env


def pids_with_env(**variables: str) -> list[int]:
    """Live processes (not zombies) whose environment holds every `NAME=value` given:
    how a test finds what a run's stage or hook started."""
    wanted = {f"{name}={value}".encode() for name, value in variables.items()}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted <= env and state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_until(
    condition: Callable[[], T | None],
    *,
    process: subprocess.Popen[Any] | None = None,
    limit: float = 90,
    what: str = "the condition",
) -> T:
    """Look at `condition` until it gives something true, and return that: a failed
    assertion once `limit` seconds pass or `process` ends first. The one place tests
    wait for something another process does (a file, an event in a run's tail).

    It looks again after 20 ms, or after twice what the last look took when that is
    longer: a look that starts processes (git, `git fabro ps`) then takes at most a
    third of a core from the processes it waits for."""
    import time

    deadline = time.monotonic() + limit
    while True:
        looked = time.monotonic()
        if found := condition():
            return found
        if process is not None:
            assert process.poll() is None, (
                f"the process ended (exit {process.returncode}) before {what}"
            )
        now = time.monotonic()
        assert now < deadline, f"no {what} after {limit:g}s"
        time.sleep(max(0.02, 2 * (now - looked)))


def tail_has(run_id: str, event: str, node_id: str) -> bool:
    """Whether the run's live event tail (in `$FABRO_HOME`) holds `event` for `node_id`."""
    # The run's scratch dir is `runs/<run id>-<repository key>/`.
    for tail in (Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*/events.jsonl"):
        for line in tail.read_bytes().split(b"\n")[:-1]:
            found = json.loads(line)
            if found["event"] == event and found.get("node_id") == node_id:
                return True
    return False


# What a terminal program writes besides its text: CSI and OSC sequences.
TERMINAL_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def read_until(
    fd: int,
    marker: bytes,
    seen: bytes = b"",
    *,
    limit: float = 90,
    count: int = 1,
    plain: bool = False,
) -> bytes:
    """Read the pty `fd` onto `seen` until `marker` stands in it `count` times (with
    `plain`, in its text without escape sequences) or the program's side closes; a
    failed assertion showing what was seen after `limit` seconds."""
    import select
    import time

    def found() -> int:
        return (TERMINAL_ESCAPES.sub(b"", seen) if plain else seen).count(marker)

    deadline = time.monotonic() + limit
    while found() < count:
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def run_config_passing(repo: Path, *names: str, workflow: str = "wf.fabro") -> str:
    """A run config for `repo`'s committed `workflow` whose `[run.sandbox.env]` hands
    stages the host's `names`: secret-named variables reach a stage only that way."""
    config = repo.parent / f"pass-{'-'.join(names).lower()}.toml"
    lines = [f'[workflow]\ngraph = "{repo / workflow}"\n[run.sandbox.env]\n']
    lines += [f'{name} = "{{{{ env.{name} }}}}"\n' for name in names]
    config.write_text("".join(lines))
    return str(config)


def received_within(fd: int, seconds: float) -> bytes:
    """What the pty `fd` receives within `seconds`: nothing, when all is quiet (to show
    that nothing is drawn after a prompt)."""
    import select
    import time

    got = b""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    return got


class Terminal:
    """`git fabro ARGS` on a pty for its terminal (stdin too, unless `stdin` is off), as a
    person runs it: the one way tests read what a terminal receives. `env` adds to the
    environment; a None value removes a variable."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        *,
        env: dict[str, str | None] | None = None,
        stdin: bool = True,
    ) -> None:
        import pty

        full_env = dict(os.environ)
        for name, value in (env or {}).items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        self.leader, follower = pty.openpty()
        self.proc = start_fabro(
            args,
            cwd=cwd,
            stdin=follower if stdin else subprocess.DEVNULL,
            stdout=follower,
            stderr=follower,
            start_new_session=True,
            env=full_env,
        )
        os.close(follower)
        self.seen = b""
        self.closed = False

    def read_until(self, marker: bytes, count: int = 1, *, limit: float = 90) -> str:
        """Read until `marker` stands `count` times in the text seen (escape sequences
        left out); that text. A failed assertion if the program ends first."""
        self.seen = read_until(self.leader, marker, self.seen, limit=limit, count=count, plain=True)
        text = TERMINAL_ESCAPES.sub(b"", self.seen)
        assert text.count(marker) >= count, self.seen.decode(errors="replace")
        return text.decode(errors="replace")

    def type(self, text: str) -> None:
        os.write(self.leader, text.encode())

    def received_within(self, seconds: float) -> bytes:
        got = received_within(self.leader, seconds)
        self.seen += got
        return got

    def close(self, timeout: float = 90) -> int:
        """Wait for the program to end (killed if it has not after `timeout` seconds);
        its exit status. What it wrote meanwhile is added to `seen`."""
        if self.closed:
            return self.proc.wait()
        self.closed = True
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            with contextlib.suppress(OSError):
                while chunk := os.read(self.leader, 4096):
                    self.seen += chunk
            os.close(self.leader)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        # After a failure, the program is not waited for.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.close(timeout=0.1 if exc[0] is not None else 90)


def on_a_terminal(
    args: list[str], cwd: Path, *, env: dict[str, str | None] | None = None
) -> tuple[int, bytes]:
    """`git fabro ARGS` with a terminal for its output and nothing on stdin: its exit
    status and all the terminal received."""
    with Terminal(args, cwd, env=env, stdin=False) as terminal:
        # Read as it writes (a full pty would block it), to the end.
        terminal.seen = read_until(terminal.leader, b"\x00end", limit=60)
        code = terminal.close(timeout=60)
    return code, terminal.seen


def typed_at_a_terminal(
    args: list[str],
    cwd: Path,
    typed: tuple[bytes, ...] = (),
    *,
    prompt: bytes = b"> ",
    until: bytes = b"\x00end",
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, bytes]:
    """`git fabro ARGS` with a pty for its terminal, as a person runs it: each of
    `typed` is typed at the next `prompt`, then the output is read up to `until` (by
    default to its end). Its exit status and what the terminal received."""
    terminal = Terminal(args, cwd, env=dict(env or {}))
    try:
        for line in typed:
            terminal.seen = read_until(terminal.leader, prompt, terminal.seen)
            # This prompt is answered: the next line typed waits for the next one.
            terminal.seen = terminal.seen.replace(prompt, b"\x00answered", 1)
            terminal.type(line.decode() + "\n")
        terminal.seen = read_until(terminal.leader, until, terminal.seen, plain=True)
    except BaseException:
        with contextlib.suppress(subprocess.TimeoutExpired):
            terminal.close(timeout=0.1)
        raise
    code = terminal.close(timeout=timeout)
    return code, terminal.seen.replace(b"\x00answered", prompt)


def copy_repo(source: Path, dest: Path, source_home: Path) -> Path:
    """A copy of `source` and of its runs' scratch dirs, made under `source_home` (the
    HOME of `module_env`), now under the current FABRO_HOME as the copy's: the runs a
    module's fixture made once, for a test that changes them (rm, prune, fork, rewind)
    to have as if it had made them itself, for the cost of a copy. The user's trust in
    them (what they recorded as they started) comes along too."""
    from fabro_git.config.locations import repo_key, runs_dir
    from fabro_git.config.trust import TrustStore

    mine = TrustStore()
    made_by = TrustStore(source_home / ".config" / mine.path.relative_to(mine.path.parents[1]))
    if made_by.path.exists() and not mine.path.exists():
        mine.path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made_by.path, mine.path)
    if made_by.runs_dir.exists():
        shutil.copytree(made_by.runs_dir, mine.runs_dir, dirs_exist_ok=True)

    shutil.copytree(source, dest, symlinks=True)
    # The copies have new inodes and ctimes: the index learns them now.
    git(dest, "update-index", "-q", "--refresh")
    old, new = repo_key(source / ".git"), repo_key(dest / ".git")
    for scratch in (source_home / "fabro" / "runs").glob(f"*-{old}"):
        run_id = scratch.name.removesuffix(f"-{old}")
        shutil.copytree(scratch, runs_dir() / f"{run_id}-{new}", symlinks=True)
    return dest


def pasted(command: str, cwd: Path) -> list[str]:
    """What `command`, a line a message suggests, does pasted into bash: the arguments
    `git` gets, with `git` a function that prints them (one a line), run in `cwd`."""
    proc = subprocess.run(
        ["bash", "-c", 'git() { printf "%s\\n" "$@"; }\n' + command],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.splitlines()


@functools.cache
def _deflated_zeros(size: int, said: int) -> tuple[str, bytes]:
    """The id and the loose file of a blob of `size` zero bytes whose header says `said`."""
    import hashlib
    import zlib

    digest = hashlib.sha1(b"blob %d\0" % size)
    squeeze = zlib.compressobj(1)
    parts = [squeeze.compress(b"blob %d\0" % said)]
    chunk = bytes(1 << 20)
    for _ in range(size >> 20):
        digest.update(chunk)
        parts.append(squeeze.compress(chunk))
    parts.append(squeeze.flush())
    return digest.hexdigest(), b"".join(parts)


def loose_zeros(repo: Path, size: int, *, said: int | None = None) -> str:
    """A loose blob of `size` (a whole number of MiB) zero bytes written into `repo`
    as git writes one, without making the bytes: about 1 MB a GB. With `said`, its
    header says that size instead (a lying object, named by its true content)."""
    sha, data = _deflated_zeros(size, size if said is None else said)
    path = repo / ".git" / "objects" / sha[:2] / sha[2:]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return sha


def big_delta_segment(repo: Path, run_id: str, lines: int) -> tuple[str, str]:
    """An events segment of `lines` copies of one 100 kB `agent.text.delta` event, as a
    blob in `repo`: the event's line (no newline) and the blob's id, for a forged run
    whose history is big (`forge_meta_files`)."""
    event = {
        "id": "01900000-0000-7000-8000-000000000000",
        "ts": "2026-01-01T00:00:00.000Z",
        "run_id": run_id,
        "event": "agent.text.delta",
        "properties": {"delta": "x" * 100_000},
    }
    line = json.dumps(event, separators=(",", ":"))
    proc = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=repo,
        input=((line + "\n") * lines).encode(),
        capture_output=True,
        check=True,
    )
    return line, proc.stdout.decode().strip()


def forge_meta_files(
    repo: Path, ref: str, files: dict[str, str], *, drop: str | None = None
) -> None:
    """A new commit on `ref`, with its tip's message (trailers and all), whose tree has
    each path of `files` set to that blob, after `drop` (a directory) is taken out: a
    run's meta ref as a remote could forge it."""
    env = {**os.environ, "GIT_INDEX_FILE": str(repo / ".git" / "forged-index")}

    def plumbing(*args: str, data: str | None = None) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=repo, env=env, input=data, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    tip = plumbing("rev-parse", ref)
    plumbing("read-tree", tip)
    if drop:
        plumbing("rm", "-r", "-q", "--cached", drop)
    entries = "".join(f"100644 {sha}\t{path}\n" for path, sha in files.items())
    plumbing("update-index", "--index-info", data=entries)
    message = plumbing("log", "-1", "--format=%B", tip)
    commit = plumbing("commit-tree", plumbing("write-tree"), "-p", tip, data=message)
    plumbing("update-ref", ref, commit, tip)
    (repo / ".git" / "forged-index").unlink()
