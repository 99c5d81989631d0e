"""A reply of tens of megabytes streams to a file as it arrives and is stored in git
once: the run's memory does not grow with the reply, and `response.md` and the
offloaded `response.<node>` on the meta ref are one blob, from a prompt stage and from
an agent stage (where a huge reply that comes with tool calls is cut in the
conversation it is sent again with). A long reply of an agent CLI or of `--dry-run` is
stored once too. (`benchmarks/huge_reply.py` measures the same at 250 MB.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git, meta_bytes, run_events, run_fabro, run_json, write_workflow
from llm_server import LlmServer, LongText, Reply, ToolUse

MB = 1_000_000
SIZE = 24 * MB
UNIT = "streamed-reply-line-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJ\n"

# Runs `git fabro ARGS` and reports the peak RSS of its process tree (the largest one).
WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL).returncode
print("maxrss_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def _peak_run(repo: Path) -> tuple[str, int]:
    """The run id and the peak RSS (bytes) of one `git fabro run`."""
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, "git", "fabro", "run", "wf.fabro", "--json", "-q"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rss = next(int(s.split()[1]) for s in proc.stderr.splitlines() if s.startswith("maxrss_kib"))
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"], rss * 1024


def _blob_id(text: LongText) -> str:
    digest = hashlib.sha1(b"blob %d\0" % text.size)
    for chunk in text.chunks():
        digest.update(chunk)
    return digest.hexdigest()


def test_a_huge_reply_streams_to_a_file_and_is_stored_once(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(
        repo,
        """\
digraph H {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=tab, prompt="Write it all", model="claude-sonnet-4-6"]
    review [shape=tab, prompt="Review it", model="claude-sonnet-4-6"]
    start -> plan -> review -> exit
}
""",
    )
    # A small reply first: what a run costs anyway, on this machine, now.
    llm_server.script(Reply(text="short"))
    _, baseline = _peak_run(repo)
    text = LongText(UNIT, SIZE)
    llm_server.script(Reply(text=text))
    run_id, peak = _peak_run(repo)

    # Memory: the reply is never whole in the run's memory (before, the run held it
    # four times or more: its deltas joined, its bytes, its JSON form, the masked copy).
    # One copy would be SIZE over. What streaming buffers take does not grow with the
    # reply (`benchmarks/huge_reply.py`: a 100 MB reply's run peaked at 116 MB, where a
    # short one's takes about 110) and measured up to 12.8 MB over here: half a copy
    # was within a megabyte of that.
    assert peak - baseline < SIZE * 3 // 4, (peak // MB, baseline // MB)

    # Stored once: one blob as large as the reply, the reply's own bytes, which both
    # response.md and the offloaded value name.
    listing = git(repo, "cat-file", "--batch-all-objects", "--batch-check")
    big = [line.split() for line in listing.splitlines() if int(line.split()[2]) >= SIZE]
    assert [(sha, kind) for sha, kind, _ in big] == [(_blob_id(text), "blob")]
    meta = f"refs/fabro/meta/{run_id}"
    for path in ("nodes/plan/response.md", "artifacts/plan/response.plan.md"):
        assert git(repo, "rev-parse", f"{meta}:{path}").strip() == big[0][0]

    # Every reader still finds it: the scratch value the context points to is its
    # JSON form (what the next stage's preamble names), `show` prints its ends, and
    # `artifact list` names the value.
    events = [
        json.loads(line)
        for line in run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
        if line.strip()
    ]
    [completed] = [e for e in events if e["event"] == "stage.completed" and e["node_id"] == "plan"]
    pointer = completed["properties"]["response"]
    assert pointer.endswith("/artifacts/values/plan/response.plan.json")
    value = Path(pointer.removeprefix("file://")).read_bytes()
    assert len(value) == SIZE + 2 + UNIT.count("\n") * (SIZE // len(UNIT))
    assert value[:200] == json.dumps(UNIT * 3)[:200].encode()
    shown = run_fabro("show", run_id, "plan", cwd=repo)
    assert shown.returncode == 0, shown.stderr
    assert UNIT.strip() in shown.stdout and "bytes not shown" in shown.stdout
    listed = run_fabro("artifact", "list", run_id, cwd=repo)
    assert "plan/values/response.plan.md" in listed.stdout, listed.stdout
    review = llm_server.requests[-1].body["messages"][-1]["content"]
    assert f"See: {pointer.removeprefix('file://')}" in review


def _stored_once(repo: Path, run_id: str, node: str, size: int) -> str:
    """The one blob of `size` bytes or more: `response.md` and the offloaded value."""
    listing = git(repo, "cat-file", "--batch-all-objects", "--batch-check")
    big = [line.split()[0] for line in listing.splitlines() if int(line.split()[2]) >= size]
    assert len(big) == 1, big
    assert _reply_blobs(repo, run_id, node) == big[0]
    return big[0]


def _reply_blobs(repo: Path, run_id: str, node: str) -> str:
    """The blob `response.md` and the offloaded value both name; no value of the reply's
    JSON form is stored beside it."""
    meta = f"refs/fabro/meta/{run_id}"
    listed = git(repo, "ls-tree", "-r", "--name-only", meta, "artifacts").split()
    assert f"artifacts/{node}/response.{node}.md" in listed, listed
    named = {
        git(repo, "rev-parse", f"{meta}:{path}").strip()
        for path in (f"nodes/{node}/response.md", *listed)
    }
    assert len(named) == 1, (listed, named)
    return named.pop()


def test_an_agent_stage_streams_a_huge_reply_to_a_file_and_stores_it_once(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(
        repo,
        """\
digraph H {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=box, prompt="Write it all", model="claude-sonnet-4-6"]
    start -> plan -> exit
}
""",
    )
    llm_server.script(
        Reply(text="Looking.", tool_calls=(ToolUse("shell", {"command": "true"}),)),
        Reply(text="short"),
    )
    _, baseline = _peak_run(repo)
    # A hostile endpoint: a huge reply with a tool call (sent again with the next call),
    # then a huge final one.
    text = LongText(UNIT, SIZE)
    llm_server.script(
        Reply(text=text, tool_calls=(ToolUse("shell", {"command": "true"}),)),
        Reply(text=text),
    )
    run_id, peak = _peak_run(repo)

    # Never the reply whole: a run holding one copy of it would be SIZE over (it was
    # 110 MB over before the reply streamed to a file). Streaming buffers and the cut
    # copies measure about 10-12 MB, and vary by a megabyte from run to run.
    assert peak - baseline < SIZE * 3 // 4, (peak // MB, baseline // MB)
    assert _stored_once(repo, run_id, "plan", SIZE) == _blob_id(text)
    # The intermediate reply went back to the model cut, and the run said so.
    resent = llm_server.requests[-1].body["messages"][1]
    assert resent["role"] == "assistant"
    assert len(json.dumps(resent)) < 200_000
    [warning] = [e for e in run_events(run_id, repo) if e["event"] == "agent.warning"]
    assert warning["properties"]["kind"] == "reply_cut"
    assert warning["properties"]["details"] == {"characters": SIZE, "kept": 100 * 1024}


LONG = "a line of the reply\n" * 15_000  # 300 KB: offloaded

FAKE_CLAUDE = """\
import json, sys
sys.stdin.read()
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": "a line of the reply\\n" * 15_000,
                  "usage": {"input_tokens": 1, "output_tokens": 1}}))
"""


def test_an_agent_cli_s_long_reply_is_stored_once(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "cli-bin"
    bindir.mkdir()
    claude = bindir / "claude"
    claude.write_text(f"#!{sys.executable}\n{FAKE_CLAUDE}")
    claude.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")
    write_workflow(
        repo,
        """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=box, backend="cli", provider="anthropic", prompt="Plan"]
    start -> plan -> exit
}
""",
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    _reply_blobs(repo, result["run_id"], "plan")
    assert meta_bytes(repo, result["run_id"], "nodes/plan/response.md") == LONG.encode()


def test_a_dry_run_s_long_reply_is_stored_once(repo: Path) -> None:
    write_workflow(
        repo,
        """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=box, prompt="Plan", dry_run.response="RESPONSE"]
    start -> plan -> exit
}
""".replace("RESPONSE", LONG.replace("\n", "\\n")),
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    _reply_blobs(repo, result["run_id"], "plan")
    assert meta_bytes(repo, result["run_id"], "nodes/plan/response.md") == LONG.encode()
