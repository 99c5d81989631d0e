"""fork, rewind, dump and diff: a run's history, read back and branched from git.

Each test makes a real three-stage run, then drives the real CLI against it, here or
in a clone that fetched the run's refs from a bare remote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    assert_fsck_clean,
    bare_remote,
    copy_repo,
    fabro_exe,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)

THREE = """\
digraph Three {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    s1 [shape=parallelogram, script="echo one >> log.txt"]
    s2 [shape=parallelogram, script="echo two >> log.txt"]
    s3 [shape=parallelogram, script="echo three >> log.txt"]
    start -> s1 -> s2 -> s3 -> exit
}
"""


def _refs(repo: Path, run_id: str) -> dict[str, str]:
    out = git(
        repo,
        "for-each-ref",
        "--format=%(refname) %(objectname)",
        f"refs/fabro/meta/{run_id}",
        f"refs/heads/fabro/run/{run_id}",
    )
    return dict(line.split() for line in out.splitlines())


def _reflogs(repo: Path, run_id: str) -> bytes:
    return b"".join(
        (repo / ".git" / "logs" / ref).read_bytes()
        for ref in (f"refs/fabro/meta/{run_id}", f"refs/heads/fabro/run/{run_id}")
    )


@pytest.fixture(scope="module")
def finished_once(module_repo: Path) -> str:
    """The three-stage run, made once for the module."""
    write_workflow(module_repo, THREE)
    proc, result = run_json("run", "wf.fabro", cwd=module_repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    return str(result["run_id"])


@pytest.fixture
def finished(
    tmp_path: Path, module_repo: Path, module_env: Path, finished_once: str
) -> tuple[Path, str]:
    """The finished run in a copy of the module's repository, each test's to change."""
    return copy_repo(module_repo, tmp_path / "repo", module_env), finished_once


def _stage_starts(events: list[dict]) -> list[str]:
    return [e["node_id"] for e in events if e["event"] == "stage.started"]


def test_fork_at_a_stage_resumes_from_there_and_leaves_the_original_untouched(
    finished: tuple[Path, str],
) -> None:
    repo, run_id = finished
    before = _refs(repo, run_id), _reflogs(repo, run_id)
    s1_commit = git(
        repo, "log", "--format=%H", "--grep", r"): s1 (", f"fabro/run/{run_id}"
    ).split()[0]

    proc = run_fabro("fork", run_id, "s1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    fork_id = proc.stdout.strip()
    assert len(fork_id) == 26 and fork_id != run_id
    assert f"git fabro resume {fork_id}" in proc.stderr

    # The fork starts at the s1 checkpoint: its branch at the s1 commit, its checkpoint
    # as it stood then, its manifest naming where it came from.
    assert git(repo, "rev-parse", f"fabro/run/{fork_id}").strip() == s1_commit
    checkpoint = json.loads(meta_file(repo, fork_id, "checkpoint.json"))
    assert checkpoint["completed_nodes"] == ["start", "s1"]
    assert checkpoint["next_node_id"] == "s2"
    assert checkpoint["git_commit_sha"] == s1_commit and checkpoint["pending_commit"] is None
    assert checkpoint["context_values"]["internal.run_id"] == fork_id
    manifest = json.loads(meta_file(repo, fork_id, "manifest.json"))
    assert manifest["run_id"] == fork_id
    assert manifest["forked_from"]["run_id"] == run_id
    assert (manifest["forked_from"]["node"], manifest["forked_from"]["visit"]) == ("s1", 1)
    assert meta_file(repo, fork_id, "graph.fabro") == THREE

    # Its log is its own, from run.created on, and says where it came from.
    events = run_events(fork_id, repo)
    assert events[0]["event"] == "run.created" and events[0]["run_id"] == fork_id
    assert events[0]["properties"]["fork_source_ref"]["run_id"] == run_id
    assert {e["run_id"] for e in events} == {fork_id}
    assert _stage_starts(events) == []

    resumed = run_fabro("resume", fork_id, "--json", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "succeeded"
    events = run_events(fork_id, repo)
    assert _stage_starts(events) == ["s2", "s3", "exit"]
    phases = [
        e["properties"]["phase"] for e in events if e["event"] == "metadata.snapshot.completed"
    ]
    assert phases[0] == "init"  # written before the fork's first resume, kept by its tail
    assert git(repo, "show", f"fabro/run/{fork_id}:log.txt") == "one\ntwo\nthree\n"
    subjects = git(
        repo, "log", "--reverse", "--format=%s", f"main..fabro/run/{fork_id}"
    ).splitlines()
    assert subjects == [
        f"fabro({run_id}): start (succeeded)",
        f"fabro({run_id}): s1 (succeeded)",
        f"fabro({fork_id}): s2 (succeeded)",
        f"fabro({fork_id}): s3 (succeeded)",
        f"fabro({fork_id}): exit (succeeded)",
    ]
    assert (_refs(repo, run_id), _reflogs(repo, run_id)) == before
    ps = run_fabro("ps", "--json", cwd=repo)
    statuses = {r["run_id"]: r["status"] for r in map(json.loads, ps.stdout.splitlines())}
    assert statuses == {run_id: "succeeded", fork_id: "succeeded"}
    assert_fsck_clean(repo)


def test_fork_list_and_the_ways_to_name_a_checkpoint(finished: tuple[Path, str]) -> None:
    repo, run_id = finished
    listing = run_fabro("fork", run_id[:10], "--list", cwd=repo)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["#", "CHECKPOINT", "STATUS", "TIME", "COMMIT"]
    rows = [line.split() for line in lines[1:]]
    assert [r[:3] for r in rows] == [
        ["@1", "start@1", "succeeded"],
        ["@2", "s1@1", "succeeded"],
        ["@3", "s2@1", "succeeded"],
        ["@4", "s3@1", "succeeded"],
        ["@5", "exit@1", "succeeded"],
    ]
    s2_commit = git(
        repo, "log", "--format=%H", "--grep", r"): s2 (", f"fabro/run/{run_id}"
    ).split()[0]
    assert rows[2][4] == s2_commit[:12]

    by_ordinal = run_fabro("fork", run_id, "@3", cwd=repo)
    by_visit = run_fabro("fork", run_id, "s2@1", cwd=repo)
    for proc in (by_ordinal, by_visit):
        assert proc.returncode == 0, proc.stderr
        assert git(repo, "rev-parse", f"fabro/run/{proc.stdout.strip()}").strip() == s2_commit
    latest = run_fabro("fork", run_id, cwd=repo)
    assert latest.returncode == 0, latest.stderr
    assert (
        json.loads(meta_file(repo, latest.stdout.strip(), "checkpoint.json"))["current_node"]
        == "exit"
    )

    for bad in ("nope", "s2@7", "@9"):
        proc = run_fabro("fork", run_id, bad, cwd=repo)
        assert proc.returncode == 1, proc.stderr
        assert f"has no checkpoint '{bad}'" in proc.stderr and "start@1, s1@1" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_rewind_supersedes_the_source_run(finished: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = finished
    proc = run_fabro("rewind", run_id, "s2", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    new_id = proc.stdout.strip()
    assert json.loads(meta_file(repo, run_id, "manifest.json"))["superseded_by"] == new_id
    assert (
        git(
            repo,
            "log",
            "-1",
            "--format=%(trailers:key=Fabro-Superseded-By,valueonly)",
            f"refs/fabro/meta/{run_id}",
        ).strip()
        == new_id
    )
    notice = run_events(run_id, repo)[-1]
    assert notice["event"] == "run.notice" and notice["properties"]["code"] == "superseded"
    assert new_id in notice["properties"]["message"]

    ps = run_fabro("ps", "--json", cwd=repo)
    statuses = {r["run_id"]: r["status"] for r in map(json.loads, ps.stdout.splitlines())}
    assert statuses[run_id] == "superseded"
    assert "superseded" in run_fabro("ps", cwd=repo).stdout
    shown = run_fabro("inspect", run_id, cwd=repo).stdout
    assert "status     superseded" in shown and f"superseded by {new_id}" in shown
    assert f"forked     from {run_id} at s2@1" in run_fabro("inspect", new_id, cwd=repo).stdout
    assert run_fabro("dump", run_id, "-o", str(tmp_path / "old"), cwd=repo).returncode == 0
    assert json.loads((tmp_path / "old" / "run.json").read_text())["status"] == "superseded"

    refused = run_fabro("resume", run_id, cwd=repo)
    assert refused.returncode == 1 and new_id in refused.stderr, refused.stderr
    again = run_fabro("rewind", run_id, "s1", cwd=repo)
    assert again.returncode == 1 and "already rewound" in again.stderr, again.stderr
    no_target = run_fabro("rewind", run_id, cwd=repo)
    assert no_target.returncode == 1 and "--list" in no_target.stderr

    resumed = run_fabro("resume", new_id, "--json", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert _stage_starts(run_events(new_id, repo)) == ["s3", "exit"]
    assert_fsck_clean(repo)


def test_dump_writes_the_run_as_plain_files(finished: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = finished
    out = tmp_path / "dump"
    proc = run_fabro("dump", run_id, "-o", str(out), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_doc = json.loads((out / "run.json").read_text())
    assert run_doc["run_id"] == run_id and run_doc["status"] == "succeeded"
    assert (out / "graph.fabro").read_text() == THREE
    assert json.loads((out / "checkpoint.json").read_text())["status"] == "succeeded"
    assert (out / "events.jsonl").read_text() == run_fabro("logs", run_id, cwd=repo).stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "001-start@1.json",
        "002-s1@1.json",
        "003-s2@1.json",
        "004-s3@1.json",
        "005-exit@1.json",
    ]
    assert json.loads((out / "checkpoints" / "003-s2@1.json").read_text())["completed_nodes"] == [
        "start",
        "s1",
        "s2",
    ]
    assert (out / "nodes" / "s2" / "script.sh").read_text() == meta_file(
        repo, run_id, "nodes/s2/script.sh"
    )
    assert not (out / "events").exists() and not (out / "manifest.json").exists()

    again = run_fabro("dump", run_id, "-o", str(out), cwd=repo)
    assert again.returncode == 1 and "not empty" in again.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_fabro("dump", run_id, "--output", str(empty), cwd=repo).returncode == 0
    assert (empty / "run.json").exists()


def test_diff_of_a_run_and_of_one_stage(finished: tuple[Path, str]) -> None:
    repo, run_id = finished
    whole = run_fabro("diff", run_id, cwd=repo)
    assert whole.returncode == 0, whole.stderr
    assert "+one\n+two\n+three\n" in whole.stdout
    stage = run_fabro("diff", run_id, "s2", cwd=repo)
    assert stage.returncode == 0, stage.stderr
    assert "+two\n" in stage.stdout and "+one" not in stage.stdout and "+three" not in stage.stdout
    assert run_fabro("diff", run_id, "s2@1", cwd=repo).stdout == stage.stdout
    stat = run_fabro("diff", run_id, "--stat", cwd=repo)
    assert "log.txt | 3 +++" in stat.stdout and "1 file changed" in stat.stdout
    missing = run_fabro("diff", run_id, "s9", cwd=repo)
    assert missing.returncode == 1 and "s1, s2, s3" in missing.stderr
    no_visit = run_fabro("diff", run_id, "s2@4", cwd=repo)
    assert no_visit.returncode == 1 and "no visit 4" in no_visit.stderr


def test_history_tools_in_a_clone_that_fetched_the_runs(
    finished: tuple[Path, str], tmp_path: Path
) -> None:
    repo, run_id = finished
    origin = bare_remote(tmp_path, origin_of=repo)
    assert run_fabro("push", "origin", cwd=repo).returncode == 0
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    fetched = run_fabro("fetch", "origin", cwd=clone, env=env)
    assert fetched.returncode == 0, fetched.stderr

    out = tmp_path / "dump-b"
    dumped = run_fabro("dump", run_id, "-o", str(out), cwd=clone, env=env)
    assert dumped.returncode == 0, dumped.stderr
    assert len(list((out / "checkpoints").iterdir())) == 5
    assert (out / "events.jsonl").read_text() == run_fabro(
        "logs", run_id, cwd=clone, env=env
    ).stdout
    assert '"event":"run.created"' in (out / "events.jsonl").read_text()

    stage = run_fabro("diff", run_id, "s3", cwd=clone, env=env)
    assert stage.returncode == 0 and "+three\n" in stage.stdout and "+two" not in stage.stdout

    fork = run_fabro("fork", run_id, "s2", cwd=clone, env=env)
    assert fork.returncode == 0, fork.stderr
    fork_id = fork.stdout.strip()
    resumed = run_fabro("resume", fork_id, "--json", cwd=clone, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert _stage_starts(run_events(fork_id, clone)) == ["s3", "exit"]
    assert git(clone, "show", f"fabro/run/{fork_id}:log.txt") == "one\ntwo\nthree\n"
    assert_fsck_clean(clone)


def test_in_place_runs_cannot_be_forked_or_diffed(repo: Path) -> None:
    write_workflow(repo, THREE)
    proc, result = run_json("run", "wf.fabro", "--in-place", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    fork = run_fabro("fork", run_id, "s1", cwd=repo)
    assert fork.returncode == 1 and "in place" in fork.stderr, fork.stderr
    diff = run_fabro("diff", run_id, cwd=repo)
    assert diff.returncode == 1 and "in place" in diff.stderr, diff.stderr


def test_a_fork_after_a_fan_out_owns_its_branch_refs(repo: Path) -> None:
    """The fan-in merges the branch commits the checkpoint names: the fork keeps them
    reachable under its own refs, so it finishes even once the source's refs are gone."""
    proc, result = run_json("run", "parallel-review", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    source_refs = git(
        repo, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/fabro/parallel/{run_id}"
    )
    assert len(source_refs.splitlines()) == 3

    fork = run_fabro("fork", run_id, "fan_out", cwd=repo)
    assert fork.returncode == 0, fork.stderr
    fork_id = fork.stdout.strip()
    fork_refs = git(
        repo, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/fabro/parallel/{fork_id}"
    )
    assert fork_refs == source_refs.replace(run_id, fork_id)
    for line in source_refs.splitlines():
        git(repo, "update-ref", "-d", line.split()[0])
    git(repo, "update-ref", "-d", f"refs/fabro/meta/{run_id}")
    git(repo, "branch", "-q", "-D", f"fabro/run/{run_id}")
    git(repo, "gc", "-q", "--prune=now")  # what only the source's refs held is gone

    resumed = run_fabro("resume", fork_id, "--json", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert _stage_starts(run_events(fork_id, repo)) == ["merge", "report", "exit"]
    assert_fsck_clean(repo)


def test_diff_on_a_terminal_goes_through_the_users_pager(finished: tuple[Path, str]) -> None:
    """git itself runs the diff on our terminal, so its pager settings apply."""
    import os
    import pty
    import subprocess

    repo, run_id = finished
    git(repo, "config", "core.pager", "sed s/^/PAGED:/")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        ["git", "fabro", "diff", run_id, "s2"],
        cwd=repo,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "TERM": "dumb"},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    assert "PAGED:+two\n" in text, text


BIG = """\
digraph Big {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    big [shape=parallelogram, script="head -c 120000000 /dev/zero | tr '\\\\0' y; echo end"]
    start -> big -> exit
}
"""


def test_dump_streams_a_large_output_from_git(repo: Path, tmp_path: Path) -> None:
    """A command's whole output (here 120 MB) is copied to the dump byte for byte, with
    the dump's peak memory below the file's size (100 MB: the whole file read at once
    would pass it)."""
    write_workflow(repo, BIG)
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    out = tmp_path / "dump"
    measure = (
        "import resource, subprocess, sys\n"
        "proc = subprocess.run(sys.argv[1:])\n"
        "print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    wrapped = subprocess.run(
        [sys.executable, "-c", measure, *fabro_exe(), "dump", run_id, "-o", str(out)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rc, peak_kib = (int(x) for x in wrapped.stdout.split())
    assert rc == 0, wrapped.stderr
    assert peak_kib < 100_000, f"dump peaked at {peak_kib} KiB for a 120 MB file"
    dumped = out / "nodes" / "big" / "stdout.log"
    assert dumped.stat().st_size == 120_000_000 + len("end\n")
    blob = git(repo, "rev-parse", f"refs/fabro/meta/{run_id}:nodes/big/stdout.log").strip()
    assert git(repo, "hash-object", str(dumped)).strip() == blob
