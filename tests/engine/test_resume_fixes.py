"""Continuing a failed run after a fix: `resume --rebase REV` brings a commit of the
repository into the run branch, `resume --workflow FILE` a corrected workflow; and what
a run may spend (`--max-cost`), which stops it resumable at a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import fresh_clone, git, meta_file, run_events, run_fabro, run_json
from llm_server import LlmServer, Reply

# `check` fails until fixed.txt is in the run's worktree: the fix is a file in the repo.
NEEDS_FIX = """\
digraph NeedsFix {
    graph [goal="needs a fix"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="printf 'made\\\\n' > made.txt"]
    check [shape=parallelogram, script="test -f fixed.txt"]
    start -> make -> check -> exit
}
"""


def _failed_run(repo: Path, tmp_path: Path, workflow: str = NEEDS_FIX) -> tuple[Path, str, str]:
    """A run failed at `check`: the workflow's path, the run id and its stderr."""
    path = tmp_path / "needs-fix.fabro"
    path.write_text(workflow)
    proc, result = run_json("run", str(path), cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert result["status"] == "failed"
    return path, result["run_id"], proc.stderr


def _commit_fix(repo: Path, name: str = "fixed.txt", text: str = "fixed\n") -> str:
    git(repo, "switch", "-q", "main")
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", f"add {name}")
    return git(repo, "rev-parse", "HEAD").strip()


def _notices(repo: Path, run_id: str, code: str) -> list[dict]:
    return [
        e["properties"]
        for e in run_events(run_id, repo)
        if e["event"] == "run.notice" and e["properties"]["code"] == code
    ]


def _ref(repo: Path, name: str) -> str:
    return git(repo, "rev-parse", name).strip()


def test_resume_rebase_brings_a_fix_committed_on_main_into_the_run(
    repo: Path, tmp_path: Path
) -> None:
    _path, run_id, stderr = _failed_run(repo, tmp_path)
    # The failure says which way in applies: a command failed, so a fix in the repository.
    assert f"git fabro resume {run_id} --rebase main" in stderr
    branch = f"fabro/run/{run_id}"
    made_at = _ref(repo, branch)
    fix = _commit_fix(repo)

    # Without --rebase the fix on main changes nothing.
    again = run_fabro("resume", run_id, cwd=repo)
    assert again.returncode == 1, again.stderr
    made_at = _ref(repo, branch)

    proc = run_fabro("resume", run_id, "--rebase", "main", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"{branch}:fixed.txt") == "fixed\n"
    assert git(repo, "show", f"{branch}:made.txt") == "made\n"
    # The stage commits stay: the fix is merged on top of them, in one commit.
    git(repo, "merge-base", "--is-ancestor", made_at, branch)  # fails unless an ancestor
    merges = git(repo, "log", "--format=%H %P%n%B%x00", "--merges", branch).split("\0")
    [merge] = [m for m in merges if "Fabro-Rebased-Onto:" in m]
    assert f"Fabro-Rebased-Onto: {fix}" in merge
    assert merge.split()[1:3] == [made_at, fix]
    [notice] = _notices(repo, run_id, "rebased")
    assert fix[:12] in notice["message"] and "main" in notice["message"]
    assert _notices(repo, run_id, "stage_commits_set_aside") == []
    # Resumed again, it is finished: the merge is part of the run, not set aside.
    done = run_fabro("resume", run_id, cwd=repo)
    assert done.returncode == 0 and "already finished" in done.stderr


def test_resume_rebase_with_a_conflict_names_the_files_and_changes_nothing(
    repo: Path, tmp_path: Path
) -> None:
    _path, run_id, _ = _failed_run(repo, tmp_path)
    _commit_fix(repo, "made.txt", "main's own\n")
    before = (_ref(repo, f"fabro/run/{run_id}"), _ref(repo, f"refs/fabro/meta/{run_id}"))
    proc = run_fabro("resume", run_id, "--rebase", "main", cwd=repo)
    assert proc.returncode != 0
    assert "conflict" in proc.stderr and "made.txt" in proc.stderr
    assert "Traceback" not in proc.stderr
    after = (_ref(repo, f"fabro/run/{run_id}"), _ref(repo, f"refs/fabro/meta/{run_id}"))
    assert after == before


def test_resume_rebase_of_an_unknown_revision_is_refused(repo: Path, tmp_path: Path) -> None:
    _path, run_id, _ = _failed_run(repo, tmp_path)
    proc = run_fabro("resume", run_id, "--rebase", "no-such-branch", cwd=repo)
    assert proc.returncode != 0
    assert "no-such-branch" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_rebase_in_a_fresh_clone(repo: Path, tmp_path: Path) -> None:
    _path, run_id, _ = _failed_run(repo, tmp_path)
    clone, env = fresh_clone(repo, tmp_path)
    fix = _commit_fix(clone)
    proc = run_fabro("resume", run_id, "--rebase", "main", cwd=clone, env=env)
    assert proc.returncode == 0, proc.stderr
    branch = f"fabro/run/{run_id}"
    assert git(clone, "show", f"{branch}:fixed.txt") == "fixed\n"
    assert f"Fabro-Rebased-Onto: {fix}" in git(clone, "log", "--format=%B", branch)


# `check`'s script was wrong in the workflow itself.
WRONG_SCRIPT = NEEDS_FIX.replace("test -f fixed.txt", "test -f made.text")
FIXED_SCRIPT = NEEDS_FIX.replace("test -f fixed.txt", "test -f made.txt")


def test_resume_workflow_takes_a_corrected_workflow_from_the_failed_stage_on(
    repo: Path, tmp_path: Path
) -> None:
    _path, run_id, _stderr = _failed_run(repo, tmp_path, WRONG_SCRIPT)
    fixed = tmp_path / "fixed.fabro"
    fixed.write_text(FIXED_SCRIPT)
    meta_before = _ref(repo, f"refs/fabro/meta/{run_id}")
    proc = run_fabro("resume", run_id, "--workflow", str(fixed), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert meta_file(repo, run_id, "graph.fabro") == FIXED_SCRIPT
    # The graph the run started with stays in the meta ref's history.
    assert git(repo, "show", f"{meta_before}:graph.fabro") == WRONG_SCRIPT
    [notice] = _notices(repo, run_id, "workflow_replaced")
    assert str(fixed) in notice["message"]
    # `make` ran once: the completed stage was not run again.
    starts = [e["node_id"] for e in run_events(run_id, repo) if e["event"] == "stage.started"]
    assert starts.count("make") == 1 and starts.count("check") == 2


def test_resume_workflow_that_drops_a_completed_node_is_refused(repo: Path, tmp_path: Path) -> None:
    _path, run_id, _ = _failed_run(repo, tmp_path, WRONG_SCRIPT)
    dropped = tmp_path / "dropped.fabro"
    dropped.write_text(
        FIXED_SCRIPT.replace("start -> make -> check", "start -> check").replace(
            "    make  [shape=parallelogram, script=\"printf 'made\\\\n' > made.txt\"]\n", ""
        )
    )
    meta_before = _ref(repo, f"refs/fabro/meta/{run_id}")
    proc = run_fabro("resume", run_id, "--workflow", str(dropped), cwd=repo)
    assert proc.returncode != 0
    assert "make" in proc.stderr and "Traceback" not in proc.stderr
    assert _ref(repo, f"refs/fabro/meta/{run_id}") == meta_before


def test_resume_workflow_with_errors_is_refused(repo: Path, tmp_path: Path) -> None:
    _path, run_id, _ = _failed_run(repo, tmp_path, WRONG_SCRIPT)
    broken = tmp_path / "broken.fabro"
    broken.write_text(FIXED_SCRIPT.replace("check -> exit", "check -> nowhere"))
    meta_before = _ref(repo, f"refs/fabro/meta/{run_id}")
    proc = run_fabro("resume", run_id, "--workflow", str(broken), cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "nowhere" in proc.stderr and "Traceback" not in proc.stderr
    assert _ref(repo, f"refs/fabro/meta/{run_id}") == meta_before  # the run is as it was


# Three LLM stages on Sonnet ($3 in / $15 out per million tokens): 1000 tokens in and
# 100 out cost $0.0045 a stage.
SPENDY = """\
digraph Spendy {
    graph [goal="spend"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one   [shape=tab, model="claude-sonnet-4-6", prompt="One"]
    two   [shape=tab, model="claude-sonnet-4-6", prompt="Two"]
    three [shape=tab, model="claude-sonnet-4-6", prompt="Three"]
    start -> one -> two -> three -> exit
}
"""


def _reply() -> Reply:
    return Reply(text="done", input_tokens=1000, output_tokens=100)


def test_max_cost_stops_the_run_at_a_checkpoint_and_resume_with_more_finishes(
    repo: Path, tmp_path: Path, llm_server: LlmServer
) -> None:
    path = tmp_path / "spendy.fabro"
    path.write_text(SPENDY)
    llm_server.script(_reply(), _reply(), _reply())
    proc, result = run_json("run", str(path), "--max-cost", "0.001", cwd=repo)
    assert proc.returncode == 130, proc.stderr
    assert result["status"] == "interrupted"
    run_id = result["run_id"]
    assert len(llm_server.requests) == 1
    [notice] = _notices(repo, run_id, "max_cost_reached")
    assert "$0.0045" in notice["message"] and "$0.001" in notice["message"]
    assert "--max-cost" in proc.stderr

    # ps shows what each run spent, and the total.
    table = run_fabro("ps", cwd=repo).stdout.splitlines()
    assert "COST" in table[0].split()
    assert "$0.0045" in table[1].split()
    assert table[-1].split()[:2] == ["total", "$0.0045"]
    row = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])
    assert row["total_cost"] == 0.0045

    # The cap holds on a plain resume: it is refused before any stage runs.
    held = run_fabro("resume", run_id, cwd=repo)
    assert held.returncode != 0 and "--max-cost" in held.stderr
    assert len(llm_server.requests) == 1

    done = run_fabro("resume", run_id, "--max-cost", "10", cwd=repo)
    assert done.returncode == 0, done.stderr
    assert len(llm_server.requests) == 3
    assert "$0.0135" in run_fabro("ps", cwd=repo).stdout


def test_run_config_max_cost_caps_the_run(
    repo: Path, tmp_path: Path, llm_server: LlmServer
) -> None:
    (tmp_path / "spendy.fabro").write_text(SPENDY)
    config = tmp_path / "run.toml"
    config.write_text('[workflow]\ngraph = "spendy.fabro"\n\n[run]\nmax_cost = 0.005\n')
    llm_server.script(_reply(), _reply(), _reply())
    proc, result = run_json("run", str(config), cwd=repo)
    assert proc.returncode == 130, proc.stderr
    # Past the cap after the second stage ($0.009), not the first ($0.0045).
    assert len(llm_server.requests) == 2
    [notice] = _notices(repo, result["run_id"], "max_cost_reached")
    assert "$0.005" in notice["message"]
