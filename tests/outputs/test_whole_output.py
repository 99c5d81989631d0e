"""A command's whole output reaches the meta ref byte for byte, however large (it is
streamed into git from its file, never held in memory), with secrets masked on the way."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import git, run_fabro, run_json, write_workflow

# About 1.9 MB of numbered lines: nearly twice what the context keeps (META_LIMIT).
LINES = "for i in $(seq 1 40000); do echo 'output line '$i' of a long command stage here'; done"


def _blob_of(repo: Path, data: bytes) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "--stdin"], cwd=repo, input=data, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )


def _expected(count: int) -> bytes:
    return b"".join(
        b"output line %d of a long command stage here\n" % i for i in range(1, count + 1)
    )


def test_a_large_output_is_stored_whole_and_byte_identical(repo: Path) -> None:
    write_workflow(
        repo,
        f"""\
digraph Big {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    big   [shape=parallelogram, script="{LINES}; {LINES} >&2"]
    start -> big -> exit
}}
""",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    expected = _expected(40000)
    assert len(expected) > 1_500_000
    meta = f"refs/fabro/meta/{run_id}"
    for name in ("stdout.log", "stderr.log"):
        stored = git(repo, "rev-parse", f"{meta}:nodes/big/{name}").strip()
        assert stored == _blob_of(repo, expected), name
    # The context keeps its bounded excerpt, offloaded; the excerpt says what it left out.
    pointer = git(repo, "show", f"{meta}:artifacts/command.output.json")
    assert "bytes omitted" in pointer and "output line 40000 " in pointer
    subprocess.run(["git", "fsck", "--strict", "--no-dangling"], cwd=repo, check=True)
    # `show` prints so large a log as its head and tail, and says how to get it whole.
    shown = run_fabro("show", run_id, "big", cwd=repo)
    assert shown.returncode == 0, shown.stderr
    assert "output line 1 of a long" in shown.stdout and "output line 40000 of" in shown.stdout
    assert "output line 20000 of" not in shown.stdout
    assert f"the whole file: git show {git(repo, 'rev-parse', meta).strip()[:12]}:" in shown.stdout


def test_a_secret_in_a_large_output_is_masked_in_the_stored_blob(repo: Path) -> None:
    # Split in the script, so only the command's output holds the key whole.
    key = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    write_workflow(
        repo,
        f"""\
digraph Big {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    big   [shape=parallelogram, script="{LINES}; echo token=ghp_''{key[4:]}; {LINES}"]
    start -> big -> exit
}}
""",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    stored = subprocess.run(
        ["git", "show", f"refs/fabro/meta/{run_id}:nodes/big/stdout.log"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    assert key.encode() not in stored
    body = _expected(40000)
    assert stored.startswith(body) and stored.endswith(body)
    middle = stored[len(body) : -len(body)]
    assert middle.startswith(b"token=***") and middle.endswith(key[-4:].encode() + b"\n")
    everything = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=repo, capture_output=True
    ).stdout
    assert key.encode() not in everything
