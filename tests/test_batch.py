"""`git fabro batch`: a run per row of an inputs file, on this machine, with the batch
stored in git so `batch status` reads it from any clone that fetched it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import git, run_fabro, start_fabro, typed_at_a_terminal, write_workflow

from fabro_git.engine.batch import read_inputs
from fabro_git.errors import SourceError

# One command stage: it writes the row's input, and fails when the row says so.
WORKFLOW = """\
digraph Rows {
    graph [goal="one row"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    work  [shape=parallelogram, script="printf '%s\\\\n' \\"$FABRO_INPUT_N\\" > row.txt; test \\"$FABRO_INPUT_FAIL\\" != yes"]
    start -> work -> exit
}
"""

# Its stage says it started, then holds until $HOME/go exists: Ctrl-C finds it there.
HOLDING = """\
digraph Hold {
    graph [goal="be interrupted"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="touch \\"$HOME/started-$FABRO_INPUT_N\\"; while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done"]
    start -> hold -> exit
}
"""


def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _objects(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _statuses(objects: list[dict]) -> list[tuple[int, str, str]]:
    return [(o["row"], o["run_id"], o["status"]) for o in objects]


def test_a_batch_runs_every_row_replicates_and_status_agrees_in_a_fresh_clone(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    write_workflow(repo, WORKFLOW)
    git(repo, "push", "-q", "origin", "main")
    rows = _rows(tmp_path / "rows.jsonl", [{"goal": f"row {n}", "n": n} for n in range(1, 7)])
    proc = run_fabro(
        "batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin",
        "--max-parallel", "3", "--label", "team=core", "--json", cwd=repo,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    running = [int(m) for m in re.findall(r"(\d+) running", proc.stderr)]
    assert max(running) == 3, proc.stderr  # never more than --max-parallel at once
    ran = _objects(proc.stdout)
    assert [o["row"] for o in ran] == [1, 2, 3, 4, 5, 6]
    assert {o["status"] for o in ran} == {"succeeded"}, ran
    assert all(o["stages"] >= 1 and o["failure"] == "" for o in ran), ran
    batch_id = ran[0]["batch_id"]
    assert len({o["run_id"] for o in ran}) == 6

    status = run_fabro("batch", "status", batch_id, "--json", cwd=repo)
    assert status.returncode == 0, status.stderr
    assert _statuses(_objects(status.stdout)) == _statuses(ran)
    listed = run_fabro("ps", "--filter", f"label=batch={batch_id}", "--json", cwd=repo)
    assert sorted(o["run_id"] for o in _objects(listed.stdout)) == sorted(o["run_id"] for o in ran)
    # The row's inputs reached its run, labelled with its row.
    third = ran[2]["run_id"]
    assert git(repo, "show", f"fabro/run/{third}:row.txt") == "3\n"
    labelled = run_fabro(
        "ps", "--filter", "label=row=3", "--filter", "label=team=core", "--json", cwd=repo
    )
    assert [o["run_id"] for o in _objects(labelled.stdout)] == [third]

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    fetched = run_fabro("fetch", "origin", cwd=clone, env=env)
    assert fetched.returncode == 0, fetched.stderr
    there = run_fabro("batch", "status", batch_id, "--json", cwd=clone, env=env)
    assert there.returncode == 0, there.stderr
    assert _objects(there.stdout) == _objects(status.stdout)
    table = run_fabro("batch", "status", batch_id, cwd=clone, env=env)
    assert f"batch {batch_id}: 6 runs of wf.fabro: 6 succeeded" in table.stdout


def test_a_failing_row_does_not_stop_the_others(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, WORKFLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("goal,n,fail\nfirst,1,yes\nsecond,2,no\nthird,3,no\n")
    (repo / "sub").mkdir()  # started from a subdirectory: the workflow is found for each run
    proc = run_fabro(
        "batch", "../wf.fabro", "--inputs", str(rows), "--max-parallel", "1", cwd=repo / "sub"
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["ROW", "RUN", "STATUS", "STAGES", "COST", "FAILURE"]
    assert [line.split()[2] for line in lines[1:]] == ["failed", "succeeded", "succeeded"]
    assert lines[1].endswith("stage work failed: command exited with status 1"), lines[1]
    # Not a terminal: plain progress lines, the last one counting every row.
    assert "0 queued, 0 running, 2 succeeded, 1 failed" in proc.stderr


def test_a_bad_inputs_file_is_refused_naming_its_line_before_any_run(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, WORKFLOW)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"n": 1}\n{"n": 2}\n{"n": [3]}\n')
    proc = run_fabro("batch", "wf.fabro", "--inputs", str(rows), cwd=repo)
    assert proc.returncode != 0
    assert f"{rows}:3" in proc.stderr, proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""
    # A FIFO is refused, never opened for a read that would wait for a writer forever.
    fifo = tmp_path / "rows-pipe.jsonl"
    os.mkfifo(fifo)
    proc = run_fabro("batch", "wf.fabro", "--inputs", str(fifo), cwd=repo, timeout=60)
    assert proc.returncode == 1 and f"{fifo}: is a named pipe" in proc.stderr, proc.stderr
    # A workflow with errors is refused once, before any run, as `run` refuses it.
    write_workflow(repo, "digraph Broken { a -> b }\n", name="broken.fabro")
    rows.write_text('{"n": 1}\n')
    proc = run_fabro("batch", "broken.fabro", "--inputs", str(rows), cwd=repo)
    assert proc.returncode != 0 and "cannot run" in proc.stderr, proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("rows.jsonl", '{"n": 1}\nnot json\n', 2),
        ("rows.jsonl", '{"n": 1}\n\n[1, 2]\n', 3),
        ("rows.jsonl", '{"goal": 7}\n', 1),
        ("rows.jsonl", '{"bad name!": "x"}\n', 1),
        ("rows.jsonl", "\n\n", 1),
        ("rows.csv", "goal,n\na,1\nb,2,extra\n", 3),
        ("rows.csv", "", 1),
    ],
)
def test_inputs_rows_that_cannot_be_runs_name_their_line(
    tmp_path: Path, name: str, text: str, line: int
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SourceError) as caught:
        read_inputs(path)
    assert (caught.value.path, caught.value.line) == (str(path), line)


def test_inputs_rows_give_a_goal_and_string_inputs(tmp_path: Path) -> None:
    jsonl = _rows(tmp_path / "rows.jsonl", [{"goal": "g", "n": 1, "ok": True}, {"x": "y"}])
    assert read_inputs(jsonl) == [("g", {"n": "1", "ok": "true"}), (None, {"x": "y"})]
    # JSON holds U+2028 and U+0085 raw in a string: still one row each.
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"goal": "a\u2028b", "n": "c\x85d"}\r\n{"x": "y"}\n', encoding="utf-8")
    assert read_inputs(raw) == [("a\u2028b", {"n": "c\x85d"}), (None, {"x": "y"})]
    csv = tmp_path / "rows.csv"
    csv.write_text('n,goal\n1,"a, b"\n\n2,c\n')
    assert read_inputs(csv) == [("a, b", {"n": "1"}), ("c", {"n": "2"})]


def _cut_short(repo: Path, tmp_path: Path, *extra: str) -> tuple[list[dict], str]:
    """A batch of HOLDING over three rows, two at a time, Ctrl-C'd once two rows hold:
    its `--json` rows and its stderr (the workflow written here unless it is already)."""
    if not (repo / "wf.fabro").exists():
        write_workflow(repo, HOLDING)
    rows = _rows(tmp_path / "rows.jsonl", [{"n": n} for n in range(1, 4)])
    home = Path(os.environ["HOME"])
    proc = start_fabro(
        ["batch", "wf.fabro", "--inputs", str(rows), "--max-parallel", "2", "--json", *extra],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(list(home.glob("started-*"))) < 2:  # two rows hold, the third is queued
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the rows never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    return _objects(out), err


def test_ctrl_c_interrupts_every_run_and_resume_finishes_the_batch(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    cut, err = _cut_short(repo, tmp_path)
    home = Path(os.environ["HOME"])
    assert sorted(o["status"] for o in cut) == ["interrupted", "interrupted", "queued"], cut
    batch_id = cut[0]["batch_id"]
    assert f"git fabro batch --resume {batch_id}" in err

    (home / "go").touch()
    resumed = run_fabro("batch", "--resume", batch_id, "--json", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    # The progress counts every row of the batch, none of them run again.
    assert "0 queued, 0 running, 3 succeeded, 0 failed" in resumed.stderr, resumed.stderr
    done = _objects(resumed.stdout)
    assert [(o["run_id"], o["status"]) for o in done] == [(o["run_id"], "succeeded") for o in cut]
    again = run_fabro("batch", "--resume", batch_id, cwd=repo)
    assert again.returncode == 0 and "every run has finished" in again.stderr


def test_on_a_terminal_the_progress_line_is_redrawn_in_place(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, WORKFLOW)
    rows = _rows(tmp_path / "rows.jsonl", [{"n": 1}, {"n": 2}])
    code, seen = typed_at_a_terminal(["batch", "wf.fabro", "--inputs", str(rows)], repo)
    assert code == 0, seen.decode(errors="replace")
    progress = [line for line in seen.split(b"\n") if b"queued," in line]
    assert len(progress) == 1, progress  # one line, redrawn: \r and erase-line each time
    assert progress[0].count(b"\r\x1b[K") >= 3, progress
    assert (
        progress[0]
        .rstrip()
        .endswith(b"0 queued, 0 running, 2 succeeded, 0 failed, cost $0.0000, about 0s left")
    )


def test_run_with_an_allocated_id_takes_it_once(repo: Path, hermetic_env: Path) -> None:
    write_workflow(repo, WORKFLOW)
    from fabro_git.store.runs import new_ulid

    run_id = new_ulid()
    first = run_fabro("run", "wf.fabro", "--run-id", run_id, "-V", "n=1", cwd=repo)
    assert first.returncode == 0, first.stderr
    assert git(repo, "rev-parse", "--verify", "-q", f"refs/fabro/meta/{run_id}").strip()
    again = run_fabro("run", "wf.fabro", "--run-id", run_id, "-V", "n=1", cwd=repo)
    assert again.returncode != 0 and f"run {run_id} exists already" in again.stderr
    bad = run_fabro("run", "wf.fabro", "--run-id", "../x", cwd=repo)
    assert bad.returncode != 0 and "is not a run id" in bad.stderr


def _another_users_clone(origin: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone of `origin` that has fetched its runs, and the environment of another
    user on another machine: their own FABRO_HOME and trust store."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {
        "FABRO_HOME": str(tmp_path / "machine-b"),
        "XDG_CONFIG_HOME": str(tmp_path / "machine-b-config"),
    }
    assert run_fabro("fetch", "origin", cwd=clone, env=env).returncode == 0
    return clone, env


def test_a_fetched_batch_resumes_only_once_its_choices_are_trusted(
    repo: Path, tmp_path: Path
) -> None:
    """A batch record comes with `git fabro fetch`; resumed, it chooses the workflow its
    rows run and the remote they push to. Made here, it resumes without a question;
    fetched, only once `git fabro trust --run BATCH` has approved those choices."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    write_workflow(repo, WORKFLOW)
    git(repo, "push", "-q", "origin", "main")
    rows = _rows(tmp_path / "rows.jsonl", [{"n": 1}])
    made = run_fabro(
        "batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin", "--json", cwd=repo
    )
    assert made.returncode == 0, made.stderr
    batch_id = _objects(made.stdout)[0]["batch_id"]
    again = run_fabro("batch", "--resume", batch_id, cwd=repo)
    assert again.returncode == 0, again.stderr

    clone, env = _another_users_clone(origin, tmp_path)
    refused = run_fabro("batch", "--resume", batch_id, cwd=clone, env=env)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"batch {batch_id} was not made here" in refused.stderr
    assert "runs the workflow `wf.fabro`" in refused.stderr
    assert "pushes each run's branch and metadata to `origin`" in refused.stderr
    assert f"git fabro trust --run {batch_id}" in refused.stderr
    trusted = run_fabro("trust", "--run", batch_id, "--yes", cwd=clone, env=env)
    assert trusted.returncode == 0, trusted.stderr
    resumed = run_fabro("batch", "--resume", batch_id, cwd=clone, env=env)
    assert resumed.returncode == 0, resumed.stderr


def test_a_fetched_batch_asks_for_the_runs_it_would_resume_too(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """Resumed on another machine, a batch goes on with the runs its rows began there:
    each runs what it recorded, which trusting the record alone does not approve. One
    question names both, and `git fabro trust --run BATCH` approves both."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    write_workflow(repo, HOLDING)
    git(repo, "push", "-q", "origin", "main")
    cut, _err = _cut_short(repo, tmp_path, "--remote", "origin")
    home = Path(os.environ["HOME"])
    batch_id = cut[0]["batch_id"]
    begun = sorted(o["run_id"] for o in cut if o["status"] == "interrupted")
    assert len(begun) == 2, cut
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr

    clone, env = _another_users_clone(origin, tmp_path)
    (home / "go").touch()
    refused = run_fabro("batch", "--resume", batch_id, cwd=clone, env=env)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"batch {batch_id} was not made here" in refused.stderr
    assert f"resume its runs {', '.join(begun)}, which would:" in refused.stderr, refused.stderr
    assert "[stage hold]" in refused.stderr
    assert f"git fabro trust --run {batch_id}" in refused.stderr

    trusted = run_fabro("trust", "--run", batch_id, "--yes", cwd=clone, env=env)
    assert trusted.returncode == 0, trusted.stderr
    assert "[stage hold]" in trusted.stdout
    resumed = run_fabro("batch", "--resume", batch_id, "--json", cwd=clone, env=env)
    assert resumed.returncode == 0, resumed.stderr
    done = _objects(resumed.stdout)
    assert sorted(o["status"] for o in done) == ["succeeded"] * 3, done
