"""Model calls over HTTPS: the provider's certificate is checked against the trust store
the environment names (`SSL_CERT_FILE`), read once a process and shared by every call,
through the real SDKs and a local HTTPS server."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from llm_server import LlmServer, Reply, provider_env

from fabro_git.llm.client import NO_RETRIES, complete
from fabro_git.llm.errors import ConnectionFailed
from fabro_git.llm.providers import _tls_settings, tls_settings
from fabro_git.llm.types import Message, Request, Target

TARGETS = {
    "anthropic": Target("anthropic", "claude-sonnet-4-6"),
    "openai": Target("openai", "gpt-5.4"),
    "ollama": Target("ollama", "llama3.2"),
}


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian: apt-get install openssl)")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
    subject = ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        ["openssl", *request, "-keyout", str(key), "-out", str(cert), *subject],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[LlmServer, Path]]:
    cert, key = _certificate(tmp_path, "provider")
    settings = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    settings.load_cert_chain(cert, key)
    server = LlmServer(tls=settings).start()
    try:
        yield server, cert
    finally:
        server.stop()


def _ask(server: LlmServer, target: Target, text: str) -> str:
    request = Request(messages=(Message.user(text),))

    async def main() -> str:
        response = await complete(request, target, env=provider_env(server), policy=NO_RETRIES)
        return response.text

    return trio.run(main)


@pytest.mark.parametrize("name", list(TARGETS))
def test_calls_trust_the_store_the_environment_names_and_nothing_else(
    https_server: tuple[LlmServer, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    server, cert = https_server
    assert server.url.startswith("https://")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server.script(Reply(text="first"), Reply(text="second"))
    assert _ask(server, TARGETS[name], "one") == "first"
    read = _tls_settings.cache_info()
    assert _ask(server, TARGETS[name], "two") == "second"
    # The second call took the trust store the first one read.
    again = _tls_settings.cache_info()
    assert (again.hits, again.misses) == (read.hits + 1, read.misses)
    shared = tls_settings()
    assert shared is tls_settings()
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert shared.cert_store_stats()["x509_ca"] == 1

    # Another store, which does not hold the server's certificate: refused.
    other, _ = _certificate(tmp_path, "someone-else")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    assert tls_settings() is not shared
    with pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
        _ask(server, TARGETS[name], "three")
    assert len(server.requests) == 2
