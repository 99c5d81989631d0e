"""`git fabro serve`: the web view of this repository's runs (`fabro_git.web`).

This module starts it: one listening socket (loopback unless `--host` says otherwise),
one random token printed in the address, Hypercorn's trio worker until Ctrl-C or
SIGTERM. The server reads runs through `RepositoryRuns`, for the repository it
was started in (`web.source`, over the run reader), and nothing else.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.errors import ConfigError, FabroError

if TYPE_CHECKING:
    from fabro_git.web.source import RepositoryRuns


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, or an error that says what to do."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, _type, _proto, _name, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise FabroError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose another port with --port N (--port 0 picks a free one)",
        ) from None
    sock.listen(128)
    return sock


def run(*, host: str, port: int, open_browser: bool) -> int:
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: a port is a number from 0 to 65535")
    from fabro_git.web.source import RepositoryRuns

    runs = RepositoryRuns(Path.cwd())
    sock = listen(host, port)
    # From the moment it can be reached, Ctrl-C and SIGTERM ask it to stop, and it
    # stops the same way whenever they come: in the middle of its start too, before the
    # server's own receiver is in place, and with the page `--open` writes removed.
    stopping: list[int] = []

    def note(signum: int, frame: object) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _serve_on(sock, runs, host, open_browser, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_on(
    sock: socket.socket, runs: RepositoryRuns, host: str, open_browser: bool, stopping: list[int]
) -> int:
    import trio

    bound = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/#token={token}"
    opener = None
    try:
        if not is_loopback(host):
            print(
                f"warning: listening on {host}, not loopback: anyone who can reach this"
                " address and has the token can read every run here and answer, steer or"
                " interrupt live ones",
                file=sys.stderr,
            )
        print(f"git fabro serve: {url}", flush=True)
        print("(Ctrl-C stops the server; runs go on)", file=sys.stderr, flush=True)
        if open_browser:
            import threading
            import webbrowser

            # The browser's command line is every local user's to read (`ps`): it gets a
            # private file that sends it on to the address, not the address and its token.
            opener = _opening_page(url)
            threading.Thread(target=webbrowser.open, args=(opener.as_uri(),), daemon=True).start()
        if not stopping:
            # Hypercorn takes the socket over by its descriptor, and closes it.
            trio.run(_serve, runs, sock.detach(), token, host, stopping)
    finally:
        sock.close()
        if opener is not None:
            shutil.rmtree(opener.parent, ignore_errors=True)
    print("git fabro serve: stopped", file=sys.stderr)
    return 0


def _opening_page(url: str) -> Path:
    """A page, readable by this user alone, that sends a browser on to `url`."""
    import html
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="git-fabro-serve-"))  # 0700
    page = directory / "open.html"
    shown = html.escape(url, quote=True)
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8") as out:
        out.write(
            f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={shown}">'
            f'<title>git fabro serve</title><a href="{shown}">git fabro serve</a>\n'
        )
    return page


async def _serve(runs: RepositoryRuns, fd: int, token: str, host: str, stopping: list[int]) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from fabro_git.web.app import build

    config = Config()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    config.errorlog = "-"
    config.loglevel = "WARNING"
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 30
    app, start = build(runs, token, loopback=is_loopback(host), host=host)

    async def stopped() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            if stopping:  # asked before the receiver was in place
                return
            async for _signal in signals:
                return

    async with trio.open_nursery() as nursery:
        start(nursery)
        await serve(app, config, shutdown_trigger=stopped)
        nursery.cancel_scope.cancel()
