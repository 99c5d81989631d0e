"""A large reply is written twice (`response.md`, and the offloaded value's JSON under
two paths), and is scanned for secrets on the way: no key it holds reaches any git
object, in either file, whatever characters the key has or sits after."""

from __future__ import annotations

import json
import secrets
import string
import subprocess
from pathlib import Path

import pytest
from helpers import meta_file, run_fabro, write_workflow
from llm_server import LlmServer, Reply

ALNUM = string.ascii_letters + string.digits

WORKFLOW = """\
digraph S {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=tab, prompt="Write it all", model="claude-sonnet-4-6"]
    start -> plan -> exit
}
"""


def _token(n: int) -> str:
    return "".join(secrets.choice(ALNUM) for _ in range(n))


def _forms(key: str) -> list[bytes]:
    """The key as raw bytes and as it appears inside a JSON string."""
    return [key.encode(), json.dumps(key)[1:-1].encode()]


def _cuts(reply: str, held: str, keys: list[str]) -> tuple[int, ...]:
    """Where the reply's deltas end: a word at a time through the part holding the keys,
    and through the middle of each key, so a key arrives in two deltas; the filler in
    pieces of 4,000 characters (a word at a time, the reply would be 27,000 deltas)."""
    start = reply.index(held)
    cuts = {start, start + len(held)}
    cuts.update(start + i + 1 for i, char in enumerate(held) if char == " ")
    cuts.update(reply.index(key) + len(key) // 2 for key in keys)
    cuts.update(range(0, len(reply), 4_000))
    return tuple(sorted(cuts))


def _all_objects(repo: Path) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("where", ["early", "late"])
@pytest.mark.parametrize("quoted", [True, False])
def test_no_key_in_an_offloaded_reply_reaches_git(
    repo: Path, llm_server: LlmServer, where: str, quoted: bool
) -> None:
    """With a secret value JSON escapes, both files are scanned; without one, the scan
    of the value's JSON form answers for the text too (and must find these keys)."""
    keys = {
        # Environment values whose names mark them as secret: a plain one, and one
        # with a quote and a backslash (JSON escapes both).
        "plain": "svc" + _token(20),
        "quoted": "pw" + _token(10) + '"q\\' + _token(8),
        # Credential shapes right after characters JSON escapes: a newline, a form
        # feed, a backspace, a control character written as \u00XX.
        "newline": "ghp_" + _token(36),
        "formfeed": "ghp_" + _token(36),
        "backspace": "sk-proj-" + _token(32),
        "control": "AKIA" + "".join(secrets.choice(string.ascii_uppercase) for _ in range(16)),
    }
    held = (
        f"token {keys['plain']} and password {keys['quoted']} (as JSON:"
        f" {json.dumps(keys['quoted'])})\n{keys['newline']}\n\f{keys['formfeed']}"
        f"\b{keys['backspace']} \x1b{keys['control']}\n"
    )
    filler = "".join(f"filler line {i:06d} of a long reply\n" for i in range(4_500))
    # Early: within the first 100,000 characters, which the events carry too.
    reply = held + filler if where == "early" else filler + held
    assert len(reply) > 150_000
    llm_server.script(Reply(text=reply, cuts=_cuts(reply, held, list(keys.values()))))
    write_workflow(repo, WORKFLOW)
    env = {"MY_SERVICE_TOKEN": keys["plain"]}
    if quoted:
        env["MY_DB_PASSWORD"] = keys["quoted"]
    else:
        del keys["quoted"]  # in the reply, but no secret of this run
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]

    objects = _all_objects(repo)
    leaked = [name for name, key in keys.items() if any(f in objects for f in _forms(key))]
    assert leaked == []

    # Both files are there, whole but for the masks.
    response = meta_file(repo, run_id, "nodes/plan/response.md")
    # The offloaded reply is kept as its raw text, the blob of response.md.
    value = meta_file(repo, run_id, "artifacts/response.plan.md")
    assert meta_file(repo, run_id, "artifacts/plan/response.plan.md") == value == response
    for text in (response, value):
        assert text.count("filler line") == 4_500
        for key in keys.values():
            assert f"***{key[-4:]}" in text
        assert f"\f***{keys['formfeed'][-4:]}" in text
        assert f"\x1b***{keys['control'][-4:]}" in text
