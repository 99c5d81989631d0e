"""`git fabro` started warm: the real entry point in a fresh process forked from one that
has already imported the package, instead of a new interpreter importing it again.

Most of a short `git fabro` command's time is the interpreter importing trio, typer,
msgspec, dulwich and the package (a quarter of a second for `run`, against 50 ms for a
one-stage run itself). The suite starts that command about 1,500 times through
`helpers.run_fabro`, so each test worker keeps one warm server (`python
tests/forked_cli.py`) that imported all of it once, and `run_fabro` asks it to fork a
child for each command. The child is what
`git fabro ARGS` would have started: its own process, with the caller's working
directory, environment (as git passes it to a dashed external: `GIT_EXEC_PATH` set and
git's exec path first in `PATH`), umask and standard streams, whose pid the caller can
signal, running `fabro_git.cli.entry` with `sys.argv` as the console script sets it. It
exits as that command exits (`entry` ends the process with `os._exit`).

A command is started the ordinary way (git, then the console script in a new
interpreter) whenever the warm one could differ from it:
- the `git` or `git-fabro` that `PATH` finds is not the suite's own, or `GIT_EXEC_PATH`
  is already set;
- a variable the interpreter reads as it starts (`PYTHON*`, `LC_*`, `LANG`) differs
  from the server's;
- the working directory is missing, the platform has no `os.pidfd_open`, or the server
  could not start single-threaded (forking a process with other threads is unsafe);
- `FABRO_TEST_EXEC=1` is set in the suite's environment, which starts every command the
  ordinary way (the whole suite passes either way).
Tests that start the command themselves (`subprocess.Popen`, a pty, `fabro_exe()`) are
not affected: those cover the interpreter's own start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# What the interpreter reads as it starts: a child forked from the server has the
# server's, so a command whose environment says otherwise starts the ordinary way.
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_NAMES = frozenset({"LANG"})

# Read once, as the suite starts: each test's hermetic environment drops FABRO_* names.
ORDINARY_ONLY = os.environ.get("FABRO_TEST_EXEC") == "1"


def _startup_vars(env: dict[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in env.items()
        if name.startswith(_STARTUP_PREFIXES) or name in _STARTUP_NAMES
    }


# --- the server ---------------------------------------------------------------------


def _preload() -> None:
    """Import every module of the package a command could need, and the SDKs its
    stages load lazily, so a forked child imports (almost) nothing."""
    import importlib
    import pkgutil

    import fabro_git

    names = [
        info.name
        for info in pkgutil.walk_packages(fabro_git.__path__, "fabro_git.")
        if not info.name.endswith("__main__")
    ]
    # The SDKs, and what the package's own modules import from inside a function.
    lazy = ["anthropic", "openai", "mcp", "httpx2", "starlette", "hypercorn", "platformdirs"]
    lazy += ["re2", "dulwich.index", "dulwich.worktree", "dulwich.trailers"]
    lazy += ["typer._click.decorators", "typer._click._textwrap"]
    for name in [*names, *lazy]:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _threads() -> int:
    """The process's threads, as the kernel counts them (C libraries start their own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _serve(address: str) -> None:
    _preload()
    import gc

    gc.collect()
    gc.freeze()  # the children's collector leaves the imported objects' pages shared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(64)
    if not hasattr(os, "pidfd_open") or _threads() != 1:
        print("unsafe", flush=True)  # the client starts every command the ordinary way
        return
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    # Stdin is a pipe the test worker holds: its end is the worker's end.
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    while True:
        for key, _ in selector.select():
            if key.data == "listen":
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ, "conn")
            elif key.data == "parent":
                return
            elif key.data == "conn":
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                except OSError:
                    message, fds = b"", []
                if not message:
                    selector.unregister(conn)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(message), fds)  # never returns
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, (conn, pid))
                conn.send(json.dumps({"pid": pid}).encode())
            else:
                conn, pid = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict[str, object], fds: list[int]) -> None:
    try:
        if request.get("session"):
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        # Nothing of the server's survives into the command: its sockets and pipes.
        os.closerange(3, 65536)
        # A fresh interpreter line-buffers a standard output that is a terminal; the
        # server's was a pipe.
        if os.isatty(1):
            sys.stdout.reconfigure(line_buffering=True)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        umask = request["umask"]
        assert isinstance(umask, int)
        os.umask(umask)
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = [str(arg) for arg in argv]
        # The console script's own directory leads the path, as it would for the script.
        sys.path[0] = os.path.dirname(sys.argv[0])
        import fabro_git.cli

        fabro_git.cli.entry()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    else:
        code = 0
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# --- the client ---------------------------------------------------------------------


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="fabro-warm-")
        self.address = os.path.join(self.dir, "s")
        self.startup = _startup_vars(env)
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=self.dir,
        )
        assert self.process.stdout is not None
        self.ready = self.process.stdout.readline().strip() == b"ready"
        atexit.register(self.close)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[int, _Server] = {}
_servers_lock = threading.Lock()


def _server(env: dict[str, str]) -> _Server | None:
    with _servers_lock:
        server = _servers.get(os.getpid())
        if server is None:
            server = _servers[os.getpid()] = _Server(env)
    return server if server.ready else None


def _git_environment(env: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """What git hands the `git-fabro` it runs, or None where it is not the suite's own."""
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    git = shutil.which("git", path=path)
    script = shutil.which("git-fabro", path=path)
    if git is None or script != os.path.join(bindir, "git-fabro") or "GIT_EXEC_PATH" in env:
        return None
    exec_path = _exec_path(git)
    if shutil.which("git-fabro", path=exec_path) is not None:
        return None
    return script, dict(env, GIT_EXEC_PATH=exec_path, PATH=exec_path + os.pathsep + path)


_exec_paths: dict[str, str] = {}


def _exec_path(git: str) -> str:
    if git not in _exec_paths:
        found = subprocess.run([git, "--exec-path"], capture_output=True, text=True, check=True)
        _exec_paths[git] = found.stdout.strip()
    return _exec_paths[git]


def run(
    args: list[str], cwd: Path | None, env: dict[str, str], input: str | None, timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """`git fabro ARGS` forked warm, as `subprocess.run(..., capture_output=True,
    text=True)` would give it; None where it must start the ordinary way."""
    if ORDINARY_ONLY:
        return None
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    passed = _git_environment(env)
    if passed is None or not os.path.isdir(where):
        return None
    script, child_env = passed
    server = _server(env)
    if server is None or _startup_vars(env) != server.startup:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {"argv": [script, *args], "cwd": where, "env": child_env, "umask": umask}
    stdin_read, stdin_write = (
        os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    )
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        try:
            conn.connect(server.address)
        except OSError:  # the server is gone (killed from outside): start it ordinarily
            server.ready = False
            for fd in (stdin_read, stdin_write, out_read, out_write, err_read, err_write):
                if fd >= 0:
                    os.close(fd)
            return None
        socket.send_fds(conn, [json.dumps(request).encode()], [stdin_read, out_write, err_write])
        for fd in (stdin_read, out_write, err_write):
            os.close(fd)
        pid = json.loads(conn.recv(1 << 16))["pid"]
        deadline = time.monotonic() + timeout
        out, err = _communicate(stdin_write, input, out_read, err_read, deadline)
        if out is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        conn.settimeout(None if out is None else max(deadline - time.monotonic(), 0.001))
        try:
            reply = conn.recv(1 << 16)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            reply, out = conn.recv(1 << 16), None
        code = json.loads(reply)["code"]
    command = ["git", "fabro", *args]
    if out is None or err is None:
        raise subprocess.TimeoutExpired(command, timeout)
    return subprocess.CompletedProcess(command, code, _text(out), _text(err))


# --- a started command: `subprocess.Popen` of the installed script, warm -------------


def start(
    args: list[str],
    cwd: Path | None,
    env: dict[str, str],
    streams: tuple[object, object, object],
    *,
    text: bool,
    new_session: bool,
) -> Process | None:
    """The installed `git-fabro ARGS` (not through git) forked warm, as
    `subprocess.Popen([git-fabro, *ARGS], env=env, stdin=, stdout=, stderr=,
    start_new_session=)` would start it; None where it must start the ordinary way.
    `streams` are what Popen takes: None, `subprocess.DEVNULL`, `subprocess.PIPE`, a
    file descriptor or a file."""
    if ORDINARY_ONLY:
        return None
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    script = shutil.which("git-fabro", path=env.get("PATH", os.defpath))
    if script != os.path.join(os.path.dirname(sys.executable), "git-fabro"):
        return None
    if not os.path.isdir(where):
        return None
    server = _server(env)
    if server is None or _startup_vars(env) != server.startup:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {
        "argv": [script, *args],
        "cwd": where,
        "env": env,
        "umask": umask,
        "session": new_session,
    }
    passed: list[int] = []  # the child's ends, closed here once sent
    ours: list[int | None] = []  # the pipes' other ends, kept
    for target, stream in enumerate(streams):
        if stream is subprocess.PIPE:
            read, write = os.pipe()
            passed.append(read if target == 0 else write)
            ours.append(write if target == 0 else read)
        elif stream is subprocess.DEVNULL:
            passed.append(os.open(os.devnull, os.O_RDWR))
            ours.append(None)
        else:
            fd = target if stream is None else stream if isinstance(stream, int) else None
            if fd is None:
                fileno = getattr(stream, "fileno", None)
                assert fileno is not None, f"not a stream Popen takes: {stream!r}"
                fd = fileno()
            passed.append(os.dup(fd))
            ours.append(None)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(server.address)
        socket.send_fds(conn, [json.dumps(request).encode()], passed)
        pid = json.loads(conn.recv(1 << 16))["pid"]
    except OSError:  # the server is gone (killed from outside): start it ordinarily
        server.ready = False
        conn.close()
        for fd in ours:
            if fd is not None:
                os.close(fd)
        return None
    finally:
        for fd in passed:
            os.close(fd)
    return Process(["git-fabro", *args], pid, conn, ours, text=text)


class Process:
    """A warm command as the test sees a `subprocess.Popen`: its pid (its own session's
    leader when started in one), `stdin`/`stdout`/`stderr` for the streams asked as
    pipes, and `poll`, `wait`, `communicate`, `send_signal`, `terminate`, `kill`. Its
    exit status comes from the server, which reaps it: negative for a signal, as
    Popen's."""

    def __init__(
        self, args: list[str], pid: int, conn: socket.socket, ours: list[int | None], *, text: bool
    ) -> None:
        import io
        import locale

        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        encoding = locale.getpreferredencoding(False)

        def wrap(fd: int | None, mode: str) -> Any:
            if fd is None:
                return None
            raw = open(fd, mode + "b", buffering=0 if mode == "w" else -1)  # noqa: SIM115
            if not text:
                return raw
            return io.TextIOWrapper(raw, encoding=encoding, write_through=True)  # type: ignore[arg-type]

        self.stdin = wrap(ours[0], "w")
        self.stdout = wrap(ours[1], "r")
        self.stderr = wrap(ours[2], "r")

    def _reply(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                reply = self._conn.recv(1 << 16)
            except (TimeoutError, BlockingIOError):
                return None
            self._conn.close()
            if not reply:  # the server went away first: the status is not known
                raise RuntimeError(f"the warm server ended before {self.args} did")
            self.returncode = json.loads(reply)["code"]
        return self.returncode

    def poll(self) -> int | None:
        return self._reply(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._reply(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> tuple[Any, Any]:
        """As Popen's: `input` to stdin, then both pipes read to their end."""
        results: dict[str, Any] = {}

        def drain(name: str, stream: Any) -> None:
            results[name] = stream.read()
            stream.close()

        readers = [
            threading.Thread(target=drain, args=(name, stream), daemon=True)
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        return results.get("out"), results.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()


def _text(data: bytes) -> str:
    # As `subprocess.run(text=True)` decodes: the locale's encoding, universal newlines.
    import locale

    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _communicate(
    stdin_write: int, input: str | None, out_read: int, err_read: int, deadline: float
) -> tuple[bytes | None, bytes | None]:
    """Feed stdin and read both streams to their end, or (None, None) at the deadline."""
    import locale

    pending = input.encode(locale.getpreferredencoding(False)) if input is not None else b""
    chunks: dict[int, list[bytes]] = {out_read: [], err_read: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        if stdin_write >= 0:
            if pending:
                os.set_blocking(stdin_write, False)
                selector.register(stdin_write, selectors.EVENT_WRITE)
            else:
                os.close(stdin_write)
        try:
            while len(selector.get_map()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, None
                for key, _ in selector.select(remaining):
                    fd = key.fd
                    if fd == stdin_write:
                        try:
                            sent = os.write(fd, pending[:65536])
                        except BrokenPipeError:
                            sent = len(pending)
                        pending = pending[sent:]
                        if not pending:
                            selector.unregister(fd)
                            os.close(fd)
                        continue
                    data = os.read(fd, 65536)
                    if data:
                        chunks[fd].append(data)
                    else:
                        selector.unregister(fd)
        finally:
            for key in list(selector.get_map().values()):
                selector.unregister(key.fd)
                if key.fd == stdin_write:
                    os.close(key.fd)
            os.close(out_read)
            os.close(err_read)
    return b"".join(chunks[out_read]), b"".join(chunks[err_read])


if __name__ == "__main__":
    # The suite's own directory must not shadow anything a command imports.
    sys.path[0] = os.path.dirname(sys.executable)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _serve(sys.argv[1])
