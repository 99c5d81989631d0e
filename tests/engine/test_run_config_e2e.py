"""Every table of a run config, through `git fabro run run.toml` in a real repository,
and the four layers of settings (user, project, run config, flags) meeting in one run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import git, meta_file, run_fabro, run_json

SAY = """
digraph C {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    say [shape=parallelogram, script="%s"]
    start -> say -> exit
}
"""


def setup_config(repo: Path, toml: str, script: str = "echo {{ inputs.x }}") -> None:
    (repo / "runs").mkdir(exist_ok=True)
    (repo / "runs" / "say.fabro").write_text(SAY % script)
    (repo / "runs" / "run.toml").write_text(toml)
    git(repo, "add", "runs")
    git(repo, "commit", "-q", "-m", "run config")


def inspect(repo: Path, run_id: str) -> dict:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def stdout_of(repo: Path, run_id: str, node: str = "say") -> str:
    return meta_file(repo, run_id, f"nodes/{node}/stdout.log")


def test_inputs_goal_and_graph_path_relative_to_the_config(repo: Path) -> None:
    setup_config(
        repo,
        '_version = 1\n[workflow]\ngraph = "say.fabro"\n[run]\ngoal = "ship it"\n'
        '[run.inputs]\nx = "from-config"\n',
        script="echo {{ inputs.x }} / {{ goal }}",
    )
    proc, result = run_json("run", str(repo / "runs" / "run.toml"), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(repo, result["run_id"]) == "from-config / ship it\n"
    manifest = inspect(repo, result["run_id"])["manifest"]
    assert manifest["goal"] == "ship it"
    assert manifest["workflow_path"] == str((repo / "runs" / "say.fabro").resolve())


def test_prepare_steps_script_and_command_run_with_the_goal_in_env(repo: Path) -> None:
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run]\ngoal = "g1"\n'
        '[[run.prepare.steps]]\nscript = "echo \\"$FABRO_GOAL\\" > prepared.txt"\n'
        '[[run.prepare.steps]]\ncommand = ["sh", "-c", "echo two words >> prepared.txt"]\n',
        script="cat prepared.txt",
    )
    proc, result = run_json("run", "runs/run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(repo, result["run_id"]) == "g1\ntwo words\n"


def test_exclude_globs_keep_a_file_out_of_the_run_branch(repo: Path) -> None:
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run.checkpoint]\nexclude_globs = ["**/*.log"]\n',
        script="mkdir -p out && echo a > out/keep.txt && echo b > out/drop.log",
    )
    proc, result = run_json("run", "runs/run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{result['run_id']}").split()
    assert "out/keep.txt" in files
    assert "out/drop.log" not in files


def test_exclude_globs_hold_for_every_stage_not_only_the_first(repo: Path) -> None:
    """Stages after the first are staged in process: the globs hold there too, for the
    files they write and for those an earlier stage left out."""
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run.checkpoint]\nexclude_globs = ["**/*.log"]\n',
        script="echo a > one.txt && echo b > one.log",
    )
    (repo / "runs" / "say.fabro").write_text(
        (SAY % "echo a > one.txt && echo b > one.log").replace(
            "start -> say -> exit",
            'again [shape=parallelogram, script="echo c > two.txt && echo d > two.log"]\n'
            "    start -> say -> again -> exit",
        )
    )
    git(repo, "commit", "-q", "-am", "two stages")
    proc, result = run_json("run", "runs/run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{result['run_id']}").split()
    assert "one.txt" in files and "two.txt" in files
    assert "one.log" not in files and "two.log" not in files, files


def test_git_author_names_the_run_commits(repo: Path) -> None:
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run.inputs]\nx = "1"\n'
        '[run.git.author]\nname = "Fabro Bot"\nemail = "bot@example.org"\n',
        script="echo {{ inputs.x }} > made.txt",
    )
    proc, result = run_json("run", "runs/run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    branch = f"fabro/run/{result['run_id']}"
    authors = git(repo, "log", "--format=%an <%ae>|%cn", f"main..{branch}").split("\n")
    authors = [a for a in authors if a]
    assert authors, "the run made no commits"
    assert set(authors) == {"Fabro Bot <bot@example.org>|Test Committer"}
    # The user's own commits are untouched.
    assert git(repo, "log", "-1", "--format=%an", "main").strip() == "Test Author"


def test_artifacts_and_hooks_are_parsed_and_recorded(repo: Path) -> None:
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run.inputs]\nx = "1"\n'
        '[run.artifacts]\ninclude = ["test-results/**"]\n'
        '[[run.hooks]]\nevent = "stage_start"\ncommand = "true ./check.sh"\nmatcher = "^say$"\n'
        "blocking = true\ntimeout_ms = 3000\n"
        '[[run.hooks]]\nevent = "run_complete"\ntype = "http"\nurl = "https://127.0.0.1:9/done"\n',
    )
    proc, result = run_json("run", "runs/run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    config = inspect(repo, result["run_id"])["manifest"]["settings"]["config"]
    assert config["artifacts"] == {"include": ["test-results/**"]}
    assert config["hooks"] == [
        {
            "event": "stage_start",
            "command": "true ./check.sh",
            "matcher": "^say$",
            "blocking": True,
            "timeout_ms": 3000,
        },
        {"event": "run_complete", "type": "http", "url": "https://127.0.0.1:9/done"},
    ]


def test_four_layers_each_override_the_one_below(repo: Path, hermetic_env: Path) -> None:
    """user settings < project config < run config < flags, key by key."""
    user = hermetic_env / ".config" / "git-fabro" / "settings.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        '[run]\ngoal = "user goal"\n[run.inputs]\na = "user"\nb = "user"\nc = "user"\nd = "user"\n'
        '[run.model]\nname = "user-model"\nfallbacks = ["u1", "u2"]\n'
        '[run.checkpoint]\nexclude_globs = ["*.user"]\n'
    )
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(
        '[run.inputs]\nb = "project"\nc = "project"\nd = "project"\n'
        '[run.model]\nname = "project-model"\nfallbacks = ["p1"]\n'
    )
    git(repo, "add", ".fabro")
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run]\ngoal = "config goal"\n'
        '[run.inputs]\nc = "config"\nd = "config"\n[run.model]\nname = "config-model"\n',
        script="echo {{ inputs.a }} {{ inputs.b }} {{ inputs.c }} {{ inputs.d }}",
    )
    proc, result = run_json("run", "runs/run.toml", "-V", "d=flag", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(repo, result["run_id"]) == "user project config flag\n"
    settings = inspect(repo, result["run_id"])["manifest"]["settings"]
    config = settings["config"]
    assert config["goal"] == "config goal"
    # A table merges key by key; a list replaces the lower layer's whole list.
    assert config["model"] == {"name": "config-model", "fallbacks": ["p1"]}
    assert config["checkpoint"] == {"exclude_globs": ["*.user"]}
    assert settings["model"] == "config-model"
    assert [s.split(" ")[0] for s in settings["config_sources"]] == [
        "flags",
        "run",
        "project",
        "user",
    ]

    proc, result = run_json(
        "run",
        "runs/run.toml",
        "--goal",
        "flag goal",
        "--model",
        "flag-model",
        "--provider",
        "openai",
        "--label",
        "team=x",
        "--dry-run",
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = inspect(repo, result["run_id"])["manifest"]
    assert manifest["goal"] == "flag goal"
    assert manifest["labels"] == {"team": "x"}
    assert manifest["settings"]["model"] == "flag-model"
    assert manifest["settings"]["provider"] == "openai"
    assert manifest["settings"]["config"]["model"] == {
        "name": "flag-model",
        "provider": "openai",
        "fallbacks": ["p1"],
    }


def test_project_defaults_apply_to_a_plain_workflow_file(repo: Path) -> None:
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text('[run.inputs]\nx = "from-project"\n')
    git(repo, "add", ".fabro")
    setup_config(repo, "", script="echo {{ inputs.x }}")
    proc, result = run_json("run", "runs/say.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(repo, result["run_id"]) == "from-project\n"


def test_a_project_config_linked_out_of_the_repository_is_refused(
    repo: Path, tmp_path: Path
) -> None:
    """A clone's `.fabro/project.toml` is the repository's own file: a link to a file of
    this machine (the user's settings, say) is refused, not read as the project's."""
    outside = tmp_path / "elsewhere.toml"
    outside.write_text('[run.inputs]\nx = "from-outside"\n')
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").symlink_to(outside)
    setup_config(repo, "", script="echo {{ inputs.x }}")
    proc = run_fabro("run", "runs/say.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert f"is a link to {outside.resolve()}, outside the repository" in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_git_author_holds_in_a_detached_and_a_resumed_run(repo: Path) -> None:
    """The detached child and `resume` take the author from the manifest, not the
    config file, which may have changed or be gone."""
    setup_config(
        repo,
        '[workflow]\ngraph = "say.fabro"\n[run.git.author]\nname = "Fabro Bot"\nemail = "bot@example.org"\n',
        script="echo one >> made.txt; test -f $HOME/go || exit 1",
    )
    started = run_fabro("run", "runs/run.toml", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    follow = run_fabro("logs", run_id, "-f", cwd=repo)
    assert follow.returncode == 0, follow.stderr
    assert '"run.failed"' in follow.stdout
    (repo / "runs" / "run.toml").unlink()
    # Outside the worktree: resume restores that to its checkpoint, untracked files gone.
    (Path(os.environ["HOME"]) / "go").write_text("")
    proc = run_fabro("resume", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    branch = f"fabro/run/{run_id}"
    authors = {a for a in git(repo, "log", "--format=%an", f"main..{branch}").split("\n") if a}
    assert authors == {"Fabro Bot"}
    meta_authors = {
        a for a in git(repo, "log", "--format=%an", f"refs/fabro/meta/{run_id}").split("\n") if a
    }
    assert meta_authors == {"Fabro Bot"}
