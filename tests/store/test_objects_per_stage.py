"""How many new loose objects a stage's checkpoint writes, so a regression shows.

Two runs of the same shape, one with more stages than the other, in one repository:
the difference in new objects, divided by the difference in stages, is the cost of one
stage. A first, shorter run writes the objects every run shares. Every stage's script and output differ by a tag, so nothing is shared between
the runs or the stages by accident.

Per stage, on the run branch: the commit, and for a stage that writes a file its blob
and the new root tree. On the meta ref: `checkpoint.json`, the event segment, the
node's `status.json` and `script.sh`; the trees on the way to them (root, `events/`,
`events/<shard>/`, `nodes/`, `nodes/<node>/`); and the snapshot commit.
"""

from __future__ import annotations

from pathlib import Path

from helpers import git, run_fabro

NOOP_STAGE = 1 + (4 + 5 + 1)
ONE_FILE_STAGE = 3 + (4 + 5 + 1)


def _workflow(path: Path, stages: int, script: str) -> Path:
    lines = ["digraph Count {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    prev = "start"
    for i in range(stages):
        lines.append(f'  s{i} [shape=parallelogram, script="{script.format(i=i, n=stages)}"]')
        lines.append(f"  {prev} -> s{i}")
        prev = f"s{i}"
    lines += [f"  {prev} -> exit", "}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _loose_objects(repo: Path) -> int:
    out = git(repo, "count-objects", "-v")
    return int(out.split("count: ")[1].split()[0])


def _objects_per_stage(repo: Path, tmp_path: Path, script: str) -> float:
    added = []
    # A first run writes what every run shares (the empty blob of a quiet stage's log).
    for stages in (1, 2, 6):
        workflow = _workflow(tmp_path / f"count{stages}.fabro", stages, script)
        before = _loose_objects(repo)
        proc = run_fabro("run", str(workflow), cwd=repo)
        assert proc.returncode == 0, proc.stderr
        added.append(_loose_objects(repo) - before)
    return (added[2] - added[1]) / 4


def test_a_stage_that_changes_nothing(repo: Path, tmp_path: Path) -> None:
    assert _objects_per_stage(repo, tmp_path, "true {n}-{i}") == NOOP_STAGE


def test_a_stage_that_writes_one_file(repo: Path, tmp_path: Path) -> None:
    assert _objects_per_stage(repo, tmp_path, "echo {n}-{i} > f_{i}.txt") == ONE_FILE_STAGE


def _git_commands(repo: Path, tmp_path: Path, stages: int) -> list[str]:
    """The git commands a run of `stages` file-writing stages starts, outer one aside."""
    trace = tmp_path / f"trace{stages}.log"
    workflow = _workflow(tmp_path / f"traced{stages}.fabro", stages, "echo {n}-{i} > g_{i}.txt")
    proc = run_fabro("run", str(workflow), cwd=repo, env={"GIT_TRACE": str(trace)})
    assert proc.returncode == 0, proc.stderr
    commands = []
    for line in trace.read_text().splitlines():
        _, marker, command = line.partition("trace: built-in: git ")
        if marker and not command.startswith("fabro"):
            commands.append(command.split(" ")[0])
    return commands


def test_stages_start_no_git_process(repo: Path, tmp_path: Path) -> None:
    """A stage's tree is staged in process, the first one's too (from the index git
    wrote when it checked the worktree out): a run starts as many git processes
    whatever its number of stages, and none of them stages files."""
    one, four = _git_commands(repo, tmp_path, 1), _git_commands(repo, tmp_path, 4)
    assert sorted(one) == sorted(four)
    assert "add" not in four and "write-tree" not in four, four
