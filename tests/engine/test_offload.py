"""Large context values go to the artifact store; command stages list the files they touched.

Everything is read back the way a user would: `checkpoint.json`, `artifacts/` and
`nodes/` on the meta ref, the scratch copy the pointer names, and `git fabro logs`.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import (
    assert_fsck_clean,
    bare_remote,
    git,
    meta_bytes,
    meta_file,
    run_config_passing,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)

from fabro_git.config.locations import run_scratch_dir

BIG = """
digraph Big {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    big [shape=parallelogram, script="head -c 300000 /dev/zero | tr '\\\\0' x; echo; echo done"]
    start -> big -> exit
}
"""


def pointer_file(pointer: str) -> Path:
    assert pointer.startswith("file:///"), pointer[:100]
    return Path(pointer.removeprefix("file://"))


def test_a_large_command_output_is_offloaded_to_the_meta_ref_and_the_scratch_dir(
    repo: Path,
) -> None:
    write_workflow(repo, BIG)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    pointer = checkpoint["context_values"]["command.output"]
    scratch = run_scratch_dir(repo / ".git", run_id)
    path = pointer_file(pointer)
    assert path == scratch / "artifacts" / "values" / "command.output.json"
    # The artifact is the whole output as a JSON string, the same on the meta ref and
    # in the scratch dir.
    stored = meta_bytes(repo, run_id, "artifacts/command.output.json")
    output = meta_bytes(repo, run_id, "nodes/big/stdout.log").decode()
    assert output == "x" * 300_000 + "\ndone\n"
    assert json.loads(stored) == output
    assert path.read_bytes() == stored
    # The checkpoint, the stage record and the event carry a pointer, not the output:
    # the record's names the stage visit's own copy, which no later stage replaces.
    assert len(meta_bytes(repo, run_id, "checkpoint.json")) < 20_000
    status = json.loads(meta_file(repo, run_id, "nodes/big/status.json"))
    visit_pointer = status["context_updates"]["command.output"]
    assert pointer_file(visit_pointer) == path.parent / "big" / "command.output.json"
    assert pointer_file(visit_pointer).read_bytes() == stored
    assert meta_bytes(repo, run_id, "artifacts/big/command.output.json") == stored
    events = run_events(run_id, repo)
    done = next(e for e in events if e["event"] == "stage.completed" and e["node_id"] == "big")
    assert done["properties"]["context_updates"]["command.output"] == visit_pointer
    completed = next(e for e in events if e["event"] == "run.completed")
    assert completed["properties"]["artifact_count"] == 1
    assert_fsck_clean(repo)


def test_a_value_under_the_threshold_stays_inline(repo: Path) -> None:
    # 102,010 bytes as JSON: under 100 KiB (102,400), over a decimal 100 KB.
    write_workflow(repo, BIG.replace("300000", "102000"))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["command.output"] == "x" * 102_000 + "\ndone\n"
    assert git(repo, "ls-tree", f"refs/fabro/meta/{run_id}", "artifacts") == ""
    events = run_events(run_id, repo)
    completed = next(e for e in events if e["event"] == "run.completed")
    assert completed["properties"]["artifact_count"] == 0


def test_a_large_response_is_offloaded_and_a_later_preamble_points_to_it(repo: Path) -> None:
    response = "plan line\n" * 15_000  # 150 KB
    workflow = """
        digraph P {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            plan [shape=box, prompt="Plan it", dry_run.response="RESPONSE"]
            build [shape=parallelogram, script="echo built > new.txt; echo more >> README.md"]
            review [shape=box, prompt="Review it"]
            start -> plan -> build -> review -> exit
        }
    """
    write_workflow(repo, workflow.replace("RESPONSE", response.replace("\n", "\\n")))
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    pointer = checkpoint["context_values"]["response.plan"]
    path = pointer_file(pointer)
    assert path.name == "response.plan.json"
    # Stored as its text, one blob with response.md (as a real model's reply is).
    assert meta_bytes(repo, run_id, "artifacts/response.plan.md") == response.encode()
    assert meta_bytes(repo, run_id, "nodes/plan/response.md") == response.encode()
    assert json.loads(path.read_bytes()) == response
    plan = json.loads(meta_file(repo, run_id, "nodes/plan/status.json"))
    visit_path = pointer_file(plan["context_updates"]["response.plan"])
    assert visit_path == path.parent / "plan" / "response.plan.json"
    assert visit_path.read_bytes() == path.read_bytes()
    assert plan["context_updates"]["last_response"] == response[:200]

    prompt = meta_file(repo, run_id, "nodes/review/prompt.md")
    assert f"- **plan**: succeeded\n  - Response: See: {visit_path}\n" in prompt
    # Only the context's 200-character `last_response` preview, not the response.
    assert prompt.count("plan line") < 30
    # The command stage: its files, its script, and its (small) output inline.
    assert (
        "- **build**: succeeded\n"
        "  - Files: README.md, new.txt\n"
        "  - Script: `echo built > new.txt; echo more >> README.md`\n"
    ) in prompt


def test_files_touched_of_a_command_stage(repo: Path) -> None:
    (repo / "old.txt").write_text("old\n")
    git(repo, "add", "old.txt")
    git(repo, "commit", "-q", "-m", "old")
    write_workflow(
        repo,
        """
        digraph F {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            edit [shape=parallelogram, script="mkdir -p src && echo new > src/new.txt && echo more >> README.md && rm old.txt"]
            quiet [shape=parallelogram, script="echo nothing"]
            start -> edit -> quiet -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    expected = ["README.md", "old.txt", "src/new.txt"]
    events = run_events(run_id, repo)
    by_node = {e["node_id"]: e["properties"] for e in events if e["event"] == "stage.completed"}
    assert by_node["edit"]["files_touched"] == expected
    assert by_node["quiet"]["files_touched"] == []
    status = json.loads(meta_file(repo, run_id, "nodes/edit/status.json"))
    assert status["files_touched"] == expected
    # stage.completed comes before its checkpoint, and the checkpoint commits that tree.
    names = [(e["event"], e.get("node_id")) for e in events]
    assert names.index(("stage.completed", "edit")) < names.index(("checkpoint.completed", "edit"))
    commit = next(
        e["properties"]["git_commit_sha"]
        for e in events
        if e["event"] == "checkpoint.completed" and e["node_id"] == "edit"
    )
    changed = git(repo, "diff", "--name-only", f"{commit}~1", commit).split()
    assert changed == expected


CLONE = """\
digraph CloneBig {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    big   [shape=parallelogram, script="head -c 300000 /dev/zero | tr '\\\\0' y; echo"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]
    start -> big -> check -> exit
}
"""


def test_resume_in_a_fresh_clone_writes_the_artifacts_into_its_scratch_dir(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    workflow = tmp_path / "clone-big.fabro"
    workflow.write_text(CLONE)
    proc = run_fabro("run", str(workflow), "--json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    origin = bare_remote(tmp_path, origin_of=repo)
    assert run_fabro("push", "origin", cwd=repo).returncode == 0
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    (hermetic_env / "ok").write_text("")
    resumed = run_fabro("resume", run_id, "--json", cwd=clone, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "succeeded"

    checkpoint = json.loads(meta_file(clone, run_id, "checkpoint.json"))
    pointer = checkpoint["node_outcomes"]["big"]["context_updates"]["command.output"]
    path = pointer_file(pointer)
    old_scratch = run_scratch_dir(repo / ".git", run_id)
    assert not path.is_relative_to(old_scratch)
    assert path.is_file()
    assert json.loads(path.read_bytes()) == "y" * 300_000 + "\n"
    assert path.read_bytes() == meta_bytes(clone, run_id, "artifacts/big/command.output.json")
    events = [
        json.loads(line)
        for line in run_fabro("logs", run_id, cwd=clone, env=env).stdout.splitlines()
    ]
    completed = next(e for e in events if e["event"] == "run.completed")
    assert completed["properties"]["artifact_count"] == 1


def test_parallel_branches_offload_the_same_key_to_their_own_files(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Fan {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            a [shape=parallelogram, script="seq 1 30000"]
            b [shape=parallelogram, script="seq 2 30001"]
            join [shape=tripleoctagon]
            start -> fan
            fan -> a
            fan -> b
            a -> join
            b -> join
            join -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    results = {r["id"]: r for r in checkpoint["context_values"]["parallel.results"]}
    pointers = {b: results[b]["context_updates"]["command.output"] for b in ("a", "b")}
    assert pointers["a"] != pointers["b"]
    for branch, first in (("a", 1), ("b", 2)):
        path = pointer_file(pointers[branch])
        expected = "".join(f"{n}\n" for n in range(first, first + 30_000))
        assert json.loads(path.read_bytes()) == expected
        assert path.read_bytes() == meta_bytes(repo, run_id, f"artifacts/{branch}/{path.name}")
    events = run_events(run_id, repo)
    completed = next(e for e in events if e["event"] == "run.completed")
    assert completed["properties"]["artifact_count"] == 2


def test_secrets_in_an_offloaded_value_are_masked_on_the_meta_ref(repo: Path) -> None:
    token = "svc" + "k3Yq9Zt2Wm4R" + '"q\\' + "Xp7Lr2Vn"
    write_workflow(
        repo,
        """
        digraph S {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            leak [shape=parallelogram, script="echo \\"MY_SERVICE_TOKEN=$MY_SERVICE_TOKEN\\"; head -c 200000 /dev/zero | tr '\\\\0' z; echo"]
            start -> leak -> exit
        }
        """,
    )
    proc = run_fabro(
        "run",
        run_config_passing(repo, "MY_SERVICE_TOKEN"),
        "--json",
        cwd=repo,
        env={"MY_SERVICE_TOKEN": token},
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    stored = meta_bytes(repo, run_id, "artifacts/command.output.json")
    value = json.loads(stored)
    assert value.startswith(f"MY_SERVICE_TOKEN=***{token[-4:]}\n")
    assert token not in value
    assert json.dumps(token)[1:-1].encode() not in stored


def test_a_stage_summary_follows_the_completed_stages_layout() -> None:
    from fabro_git.handlers.llm import stage_summary
    from fabro_git.workflow import parse

    graph = parse(
        'digraph G { plan [shape=box]; test [shape=parallelogram, script="cargo test 2>&1 || true"] }'
    )
    pointer = "file:///logs/artifacts/values/response.plan.json"
    plan = {
        "status": "succeeded",
        "usage": {"model": "claude-sonnet-4-5", "input_tokens": 12_400, "output_tokens": 3_200},
        "files_touched": ["src/main.rs", "tests/api_test.rs"],
        "context_updates": {"response.plan": pointer, "last_response": "..."},
    }
    output = "file:///logs/artifacts/values/command.output.json"
    test = {"status": "succeeded", "context_updates": {"command.output": output}}
    assert stage_summary(graph, "plan", plan) + stage_summary(graph, "test", test) == [
        "- **plan**: succeeded",
        "  - Model: claude-sonnet-4-5, 12.4k tokens in / 3.2k out",
        "  - Files: src/main.rs, tests/api_test.rs",
        "  - Response: See: /logs/artifacts/values/response.plan.json",
        "- **test**: succeeded",
        "  - Script: `cargo test 2>&1 || true`",
        "  - Stdout: See: /logs/artifacts/values/command.output.json",
    ]
    # An inline output shows its first and last lines only.
    many = "".join(f"line {n}\n" for n in range(100))
    lines = stage_summary(
        graph, "test", {"status": "failed", "context_updates": {"command.output": many}}
    )
    assert lines[2:4] == ["  - Stdout:", "    line 0"]
    assert "    [... 70 lines omitted ...]" in lines
    assert lines[-1] == "    line 99" and len(lines) == 3 + 10 + 1 + 20


def test_files_touched_include_what_the_script_committed_itself(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph C {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            commit [shape=parallelogram, script="echo c > committed.txt && git add committed.txt && git commit -qm own && echo u > loose.txt"]
            start -> commit -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    status = json.loads(meta_file(repo, run_id, "nodes/commit/status.json"))
    assert status["files_touched"] == ["committed.txt", "loose.txt"]
    subjects = git(repo, "log", "--format=%s", f"main..fabro/run/{run_id}").splitlines()
    assert "own" in subjects
