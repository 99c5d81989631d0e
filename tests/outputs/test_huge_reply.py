"""A reply of tens of megabytes streams to a file as it arrives and is stored in git
once: the run's memory does not grow with the reply, and `response.md` and the
offloaded `response.<node>` on the meta ref are one blob. (`benchmarks/huge_reply.py`
measures the same at 250 MB.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from helpers import git, run_fabro, write_workflow
from llm_server import LlmServer, LongText, Reply

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
    assert peak - baseline < SIZE // 2, (peak // MB, baseline // MB)

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
