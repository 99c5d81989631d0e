"""A stage cannot plant configuration that the user's next run obeys.

In an `--in-place` run the stage works in the user's checkout: a command stage that
changes `.fabro/` fails and the change is put back, and an agent's file tools and shell
are refused it. In a run's own worktree a stage may write `.fabro/` as any other file,
but nothing it wrote there is loaded: not by a later stage, nor by `resume`, nor by the
user's next run."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import git, run_events, run_fabro, run_json, trust_project, write_workflow
from llm_server import LlmServer, Reply, ToolUse

ORIGINAL = "# the project's own settings\n"


def _planted(marker: Path) -> str:
    """A project config whose hooks touch `marker` when a run or a stage starts."""
    return "".join(
        f'[[run.hooks]]\nevent = "{event}"\ncommand = {json.dumps(f"touch {marker}")}\n'
        for event in ("run_start", "stage_start")
    )


def _with_config(repo: Path) -> Path:
    config = repo / ".fabro" / "project.toml"
    config.parent.mkdir()
    config.write_text(ORIGINAL)
    git(repo, "add", ".fabro")
    git(repo, "commit", "-q", "-m", "project config")
    return config


def _next_run_obeys_nothing(repo: Path, marker: Path) -> None:
    write_workflow(
        repo,
        "digraph N { start [shape=Mdiamond]; exit [shape=Msquare]; start -> exit }",
        "next.fabro",
    )
    proc = run_fabro("run", "next.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def test_in_place_a_command_stage_that_changes_fabro_fails_and_is_undone(
    repo: Path, tmp_path: Path
) -> None:
    config = _with_config(repo)
    marker = tmp_path / "hooked"
    (tmp_path / "plant.toml").write_text(_planted(marker))
    write_workflow(
        repo,
        f"""digraph P {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            plant [shape=parallelogram, script="cat {tmp_path / "plant.toml"} >> .fabro/project.toml; touch .fabro/extra"]
            start -> plant -> exit
        }}""",
    )
    proc, result = run_json("run", "wf.fabro", "--in-place", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    [failed] = [e for e in run_events(result["run_id"], repo) if e["event"] == "stage.failed"]
    error = failed["properties"]["error"]
    assert "stage plant changed .fabro/extra, .fabro/project.toml" in error, error
    assert "in an --in-place run no stage may change it" in error and "put back" in error
    assert config.read_text() == ORIGINAL and not (repo / ".fabro" / "extra").exists()
    _next_run_obeys_nothing(repo, marker)


def test_in_place_an_agent_cannot_change_fabro(
    repo: Path, tmp_path: Path, llm_server: LlmServer
) -> None:
    config = _with_config(repo)
    marker = tmp_path / "hooked"
    write_workflow(
        repo,
        """digraph A {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            work  [shape=box, model="sonnet", permissions="full", prompt="Set things up"]
            start -> work -> exit
        }""",
    )
    planted = _planted(marker)
    shell = f"printf '%s' {json.dumps(planted)} >> .fabro/project.toml"
    llm_server.script(
        Reply(
            text="Configuring.",
            tool_calls=(
                ToolUse("write_file", {"path": ".fabro/project.toml", "content": planted}, id="w"),
                ToolUse(
                    "edit_file",
                    {"path": ".fabro/project.toml", "old_string": "#", "new_string": planted},
                    id="e",
                ),
                ToolUse("write_file", {"path": ".fabro/skills/x/SKILL.md", "content": "x"}, id="n"),
            ),
        ),
        Reply(text="Trying the shell.", tool_calls=(ToolUse("shell", {"command": shell}, id="s"),)),
        Reply(text="Could not; leaving it."),
    )
    proc, _ = run_json("run", "wf.fabro", "--in-place", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert config.read_text() == ORIGINAL and not (repo / ".fabro" / "skills").exists()
    results = json.dumps(llm_server.requests[-1].body["messages"])  # the whole conversation
    assert results.count("in an --in-place run no stage may change it") == 4, results
    assert "refused: the command changed .fabro/project.toml" in results
    _next_run_obeys_nothing(repo, marker)


def test_what_a_stage_writes_under_fabro_in_its_worktree_is_never_loaded(
    repo: Path, tmp_path: Path
) -> None:
    marker, ok = tmp_path / "hooked", tmp_path / "ok"
    (tmp_path / "plant.toml").write_text(_planted(marker))
    write_workflow(
        repo,
        f"""digraph W {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            plant [shape=parallelogram, script="mkdir -p .fabro && cp {tmp_path / "plant.toml"} .fabro/project.toml"]
            gate  [shape=parallelogram, script="test -f {ok}"]
            start -> plant -> gate -> exit
        }}""",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stderr  # the gate fails: the run stops after plant
    run_id = result["run_id"]
    assert "[[run.hooks]]" in git(repo, "show", f"fabro/run/{run_id}:.fabro/project.toml")
    assert not marker.exists()  # not by the stage after plant
    ok.write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert not marker.exists()  # nor by resume
    _next_run_obeys_nothing(repo, marker)  # nor by the next run
    # The planted file is one the user's checkout would obey.
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(_planted(marker))
    git(repo, "add", ".fabro")
    git(repo, "commit", "-q", "-m", "the user's own hooks")
    trust_project(repo)
    assert run_fabro("run", "next.fabro", cwd=repo).returncode == 0
    assert marker.exists()
