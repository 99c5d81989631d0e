"""A fetched run whose refs were made by hand cannot write outside its destination.

The hostile refs are built with git's own plumbing (`mktree`, `commit-tree`,
`update-ref`) on top of a real run, so everything but the hostile entry is valid; they
travel through a bare remote to a clone as any run does (git checks no tree entry
names on push or fetch), and the real `git fabro` in the clone must refuse them with a
message, not a traceback, and write nothing outside.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import fresh_clone, git, pasted, run_fabro, run_json, write_workflow

# `check` fails until $HOME/ok exists, so the run can be resumed.
FAILING = """\
digraph Hostile {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="printf 'made\\\\n' > made.txt"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]
    start -> make -> check -> exit
}
"""


def _git_in(repo: Path, args: list[str], data: bytes) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, input=data, capture_output=True, check=True)
    return proc.stdout.decode().strip()


def _put(repo: Path, tree: str | None, parts: list[str], mode: str, sha: str) -> str:
    """`tree` with the entry `parts` set to (`mode`, `sha`), any name git's `mktree`
    takes (`..` and `.git` too): the id of the new tree."""
    entries: dict[str, str] = {}
    if tree is not None:
        for line in git(repo, "ls-tree", "-z", tree).split("\0"):
            if line:
                header, name = line.split("\t", 1)
                entries[name] = header
    head, rest = parts[0], parts[1:]
    if rest:
        old = entries.get(head, "").split()
        subtree = old[2] if len(old) == 3 and old[1] == "tree" else None
        entries[head] = f"040000 tree {_put(repo, subtree, rest, mode, sha)}"
    else:
        entries[head] = f"{mode} {'tree' if mode == '040000' else 'blob'} {sha}"
    listing = "".join(f"{header}\t{name}\0" for name, header in entries.items())
    return _git_in(repo, ["mktree", "-z"], listing.encode())


def _add_entry(
    repo: Path,
    ref: str,
    path: list[str],
    data: bytes,
    mode: str = "100644",
    message_from: str | None = None,
) -> None:
    """A new commit on `ref` whose tree also holds `path` (a blob of `data`), with the
    message (trailers too) of the tip, or of the commit `message_from`."""
    blob = _git_in(repo, ["hash-object", "-w", "--stdin"], data)
    tip = git(repo, "rev-parse", ref).strip()
    tree = _put(repo, git(repo, "rev-parse", f"{tip}^{{tree}}").strip(), path, mode, blob)
    message = git(repo, "log", "-1", "--format=%B", message_from or tip)
    commit = _git_in(repo, ["commit-tree", tree, "-p", tip, "-F", "-"], message.encode())
    git(repo, "update-ref", ref, commit, tip)


def _named(root: Path, stem: str) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files if stem in n]


def _refused(proc: subprocess.CompletedProcess[str], run_id: str, entry: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"run {run_id}: refusing to write" in proc.stderr, proc.stderr
    assert entry in proc.stderr, proc.stderr


def test_resume_refuses_an_artifact_entry_that_climbs_out(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, FAILING)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    # From the scratch dir's artifacts/values/: out of the scratch dir, out of runs/,
    # out of FABRO_HOME and into the test's own directory.
    climb = [".."] * 5
    _add_entry(repo, f"refs/fabro/meta/{run_id}", ["artifacts", *climb, "pwned.json"], b"1")
    clone, env = fresh_clone(repo, tmp_path)
    (hermetic_env / "ok").write_text("")

    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    _refused(resumed, run_id, "'artifacts/..'")
    assert _named(tmp_path, "pwned") == [] and _named(hermetic_env, "pwned") == []


@pytest.mark.parametrize(
    ("entry", "outside"),
    [(["test-results", "pwned.txt"], "symlink"), ([".git", "hooks", "pre-commit"], "git")],
    ids=["through-a-committed-symlink", "into-the-git-dir"],
)
def test_artifact_cp_refuses_to_write_through_the_work_products_symlink(
    repo: Path, tmp_path: Path, entry: list[str], outside: str
) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    elsewhere = tmp_path / "xyz-outside"
    elsewhere.mkdir()
    # The run's work product holds `test-results -> <elsewhere>`, and its metadata an
    # asset captured under that name.
    branch = f"refs/heads/fabro/run/{run_id}"
    _add_entry(repo, branch, ["test-results"], str(elsewhere).encode(), mode="120000")
    _add_entry(repo, f"refs/fabro/meta/{run_id}", ["assets", "hello", "retry_1", *entry], b"x")
    clone, env = fresh_clone(repo, tmp_path)
    git(clone, "checkout", "-q", f"fabro/run/{run_id}")
    assert (clone / "test-results").is_symlink()

    copied = run_fabro("artifact", "cp", run_id, ".", cwd=clone, env=env)
    _refused(copied, run_id, "/".join(entry))
    assert list(elsewhere.iterdir()) == []
    assert not (clone / ".git" / "hooks" / "pre-commit").exists()
    assert outside in copied.stderr


@pytest.mark.parametrize(
    "entry",
    [[".git", "hooks", "post-checkout"], ["nodes", "..", "..", "pwned.txt"]],
    ids=["git-dir", "climbs-out"],
)
def test_dump_refuses_an_entry_outside_the_dump(
    repo: Path, tmp_path: Path, entry: list[str]
) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    _add_entry(repo, f"refs/fabro/meta/{run_id}", entry, b"#!/bin/sh\necho owned\n")
    clone, env = fresh_clone(repo, tmp_path)
    target = tmp_path / "dumps" / "dump"

    dumped = run_fabro("dump", run_id, "-o", str(target), cwd=clone, env=env)
    _refused(dumped, run_id, "/".join(entry))
    assert not (target / ".git").exists()
    assert _named(tmp_path, "pwned") == [] and _named(tmp_path, "post-checkout") == []


def test_dump_and_artifact_cp_of_an_honest_run_still_write_everything(
    repo: Path, tmp_path: Path
) -> None:
    # Its output (about 190 KB) is offloaded: an artifact to copy.
    write_workflow(
        repo,
        "digraph W { start [shape=Mdiamond]; exit [shape=Msquare]; "
        'big [shape=parallelogram, script="seq 1 30000"]; start -> big -> exit }',
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    clone, env = fresh_clone(repo, tmp_path)
    dump = tmp_path / "dump"
    dumped = run_fabro("dump", run_id, "-o", str(dump), cwd=clone, env=env)
    assert dumped.returncode == 0, dumped.stderr
    assert json.loads((dump / "run.json").read_text())["run_id"] == run_id
    written = {p.relative_to(dump).as_posix() for p in dump.rglob("*") if p.is_file()}
    assert {"nodes/big/stdout.log", "nodes/big/status.json"} <= written, sorted(written)
    assert any(name.startswith("checkpoints/") for name in written), sorted(written)
    copied_to = tmp_path / "copied"
    copied = run_fabro("artifact", "cp", run_id, str(copied_to), cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    files = [p for p in copied_to.rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["command.output.json"], files
    assert json.loads(files[0].read_text()).splitlines() == [str(n) for n in range(1, 30001)]


def test_fork_refuses_to_copy_an_entry_that_climbs_out(repo: Path) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    # A checkpoint of `exit` (its message and trailers) whose tree holds the entry.
    exit_commit = git(repo, "log", "--format=%H", "--grep=^checkpoint exit@1", meta).split()[0]
    _add_entry(repo, meta, ["artifacts", "..", "pwned.json"], b"1", message_from=exit_commit)
    before = git(repo, "for-each-ref", "refs/fabro")
    forked = run_fabro("fork", run_id, "exit", cwd=repo)
    _refused(forked, run_id, "'artifacts/..'")
    assert git(repo, "for-each-ref", "refs/fabro") == before


@pytest.mark.parametrize(
    "name",
    ["nested/inner", "x;touch${IFS}pwned;$(touch${IFS}pwned2)", "01j0000000000000000000000a"],
    ids=["nests", "shell-code", "not-a-ulid"],
)
def test_a_meta_ref_whose_name_is_no_run_id_is_no_run(repo: Path, name: str) -> None:
    """`refs/fabro/meta/a/b` names no run: its id would nest the run's scratch and lock
    paths; nor does a name with shell code, which would go into every command a message
    suggests for the run. ps lists them not, and resume finds no run by them."""
    write_workflow(
        repo,
        "digraph W { start [shape=Mdiamond]; exit [shape=Msquare]; start -> exit }",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    meta = git(repo, "rev-parse", f"refs/fabro/meta/{run_id}").strip()
    git(repo, "update-ref", f"refs/fabro/meta/{name}", meta)
    listed = run_fabro("ps", "--json", cwd=repo)
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == [run_id]
    resumed = run_fabro("resume", name, cwd=repo)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert f"no run matches '{name}' here" in resumed.stderr
    assert not list((Path(os.environ["FABRO_HOME"]) / "runs").glob(name.split("/")[0] + "*"))
    assert not list(repo.rglob("pwned*"))


def test_a_command_a_hint_suggests_keeps_a_fetched_value_one_quoted_word(
    repo: Path, tmp_path: Path
) -> None:
    """A fetched run's manifest says who replaced it; resume suggests resuming that run.
    The id is the manifest's, so the suggested command quotes it: pasted into a shell,
    it stays one argument and runs nothing."""
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    manifest = json.loads(git(repo, "show", f"{meta}:manifest.json"))
    hostile = "x; touch pwned; $(touch pwned2)"
    manifest["superseded_by"] = hostile
    _add_entry(repo, meta, ["manifest.json"], json.dumps(manifest).encode())
    clone, env = fresh_clone(repo, tmp_path)

    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode != 0 and "Traceback" not in resumed.stderr
    hint = resumed.stderr.split("resume that run with `", 1)[1].split("`", 1)[0]
    sandbox = tmp_path / "paste"
    sandbox.mkdir()
    assert pasted(hint, sandbox) == ["fabro", "resume", hostile]
    assert list(sandbox.iterdir()) == []


def test_a_fetched_runs_base_commit_is_no_option_to_git_diff(repo: Path, tmp_path: Path) -> None:
    """`git fabro diff` hands git the manifest's base commit: one made into
    `--output=FILE` would have git write any file the user can. A record's object id
    must be one; the run is refused with a message, and nothing is written."""
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    canary = tmp_path / "canary"
    manifest = json.loads(git(repo, "show", f"{meta}:manifest.json"))
    manifest["base_sha"] = f"--output={canary}"
    _add_entry(repo, meta, ["manifest.json"], json.dumps(manifest).encode())
    clone, env = fresh_clone(repo, tmp_path)

    shown = run_fabro("diff", run_id, cwd=clone, env=env)
    assert shown.returncode == 1, shown.stderr
    assert "Traceback" not in shown.stderr
    assert run_id in shown.stderr and "base_sha" in shown.stderr, shown.stderr
    assert not canary.exists()


def test_a_fetched_runs_setup_commands_wait_for_trust_on_resume(repo: Path, tmp_path: Path) -> None:
    """The manifest keeps the commands setup runs apart from the recorded
    configuration; a fetched run's are its author's, and act only once trusted."""
    write_workflow(repo, FAILING)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    marker = tmp_path / "setup-ran"
    manifest = json.loads(git(repo, "show", f"{meta}:manifest.json"))
    manifest["settings"]["setup_commands"] = [f"touch {marker}"]
    _add_entry(repo, meta, ["manifest.json"], json.dumps(manifest).encode())
    clone, env = fresh_clone(repo, tmp_path)

    refused = run_fabro("resume", run_id, cwd=clone, env=env)
    assert refused.returncode == 1, refused.stderr
    assert f"run {run_id}'s recorded configuration is not trusted" in refused.stderr
    assert f"runs `touch {marker}` before the first stage" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not marker.exists()


def test_a_fetched_run_recorded_before_graphs_reads_no_file_from_the_disk(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """A run recorded before `graphs/` names its workflow's place in its manifest. A
    fetched one can name any place: an `@file` prompt it did not record must not be read
    from around it (and committed to the meta ref, which goes back to its author)."""
    write_workflow(repo, FAILING)
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text("the-private-words\n")
    manifest = json.loads(git(repo, "show", f"{meta}:manifest.json"))
    manifest["workflow_file"] = None
    manifest["workflow_path"] = str(private / "x.fabro")
    _add_entry(repo, meta, ["manifest.json"], json.dumps(manifest).encode())
    graph = git(repo, "show", f"{meta}:graph.fabro")
    forged = graph.replace(
        'check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]',
        'check [prompt="@secret.txt"]',
    )
    assert forged != graph
    _add_entry(repo, meta, ["graph.fabro"], forged.encode())
    clone, env = fresh_clone(repo, tmp_path)

    # Trusted, so the resume gets as far as the prompt (else it stops at trust).
    trusted = run_fabro("trust", "--run", run_id, "--yes", cwd=clone, env=env)
    assert trusted.returncode == 0, trusted.stderr
    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode == 1, resumed.stderr
    assert "prompt file '@secret.txt' is not among the files this run recorded" in (resumed.stderr)
    assert "Traceback" not in resumed.stderr
    assert "the-private-words" not in resumed.stdout + resumed.stderr
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=clone, capture_output=True
    ).stdout
    assert b"the-private-words" not in objects


def test_resume_refuses_an_artifact_tree_nested_without_end(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """Hundreds of directories deep, read a level at a time, cost resume the square of
    the depth and then the stack of a recursive walk: refused, with the run named."""
    write_workflow(repo, FAILING)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    _add_entry(repo, f"refs/fabro/meta/{run_id}", ["artifacts", *["d"] * 200, "x.json"], b"1")
    clone, env = fresh_clone(repo, tmp_path)
    (hermetic_env / "ok").write_text("")

    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode == 1, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert f"run {run_id}: refusing to write" in resumed.stderr, resumed.stderr
    assert "more than 64 directories deep" in resumed.stderr


FANNED = """\
digraph Fanned {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    b1    [shape=parallelogram, script="printf 'b1\\\\n' > b1.txt"]
    b2    [shape=parallelogram, script="printf 'b2\\\\n' > b2.txt"]
    join  [shape=tripleoctagon]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]
    start -> fan
    fan -> b1
    fan -> b2
    b1 -> join
    b2 -> join
    join -> check -> exit
}
"""


def test_a_fetched_runs_branch_head_is_no_option_to_git_on_resume(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """The fan-in takes the best branch's files from the commit its record names; a
    fetched checkpoint's record could name an option to git instead."""
    write_workflow(repo, FANNED)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    canary = tmp_path / "canary-index"
    checkpoint = json.loads(git(repo, "show", f"{meta}:checkpoint.json"))
    assert "delta_of" not in checkpoint
    checkpoint["next_node_id"] = "join"
    for record in checkpoint["context_values"]["parallel.results"]:
        record["head_sha"] = f"--index-output={canary}"
    _add_entry(repo, meta, ["checkpoint.json"], json.dumps(checkpoint).encode())
    clone, env = fresh_clone(repo, tmp_path)
    (hermetic_env / "ok").write_text("")

    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode == 1, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert "which is no commit id" in resumed.stderr, resumed.stderr
    assert not canary.exists()


def _forged_failed_run(repo: Path, marker: Path) -> str:
    """A failed run of FAILING, its recorded graph then rewritten (as a remote could
    have it) so that its `check` stage touches `marker`: the run's id."""
    write_workflow(repo, FAILING)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = str(result["run_id"])
    meta = f"refs/fabro/meta/{run_id}"
    graph = git(repo, "show", f"{meta}:graph.fabro")
    forged = graph.replace('script="test -f \\"$HOME/ok\\""', f'script="touch {marker}"')
    assert forged != graph
    _add_entry(repo, meta, ["graph.fabro"], forged.encode())
    return run_id


def test_a_fetched_runs_commands_wait_for_trust_on_resume(repo: Path, tmp_path: Path) -> None:
    """A resume walks the graph the run recorded. One that came from elsewhere (here:
    rewritten after this machine ran it) runs its commands only once the user trusted
    that exact graph; the question names what it would run."""
    marker = tmp_path / "forged-ran"
    run_id = _forged_failed_run(repo, marker)
    clone, env = fresh_clone(repo, tmp_path)

    refused = run_fabro("resume", run_id, cwd=clone, env=env)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"run {run_id}'s recorded configuration is not trusted" in refused.stderr
    assert f"runs `touch {marker}`  [stage check]" in refused.stderr, refused.stderr
    assert f"git fabro trust --run {run_id}" in refused.stderr
    assert not marker.exists()

    trusted = run_fabro("trust", "--run", run_id, "--yes", cwd=clone, env=env)
    assert trusted.returncode == 0, trusted.stderr
    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert marker.exists()


def test_resume_with_the_users_own_workflow_asks_nothing_of_the_recorded_one(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """`resume --workflow FILE` goes on with the user's file, not the graph the run
    recorded: that graph needs no trust, and the user's file, recorded in its place,
    needs none on the next resume."""
    marker = tmp_path / "forged-ran"
    run_id = _forged_failed_run(repo, marker)
    # Not the graph the run first recorded either, which its start trusted.
    workflow = write_workflow(repo, "// the user's own\n" + FAILING, name="own.fabro")

    refused = run_fabro("resume", run_id, cwd=repo)
    assert refused.returncode == 1 and "is not trusted" in refused.stderr, refused.stderr
    own = run_fabro("resume", run_id, "--workflow", str(workflow), cwd=repo)
    assert own.returncode == 1 and "not trusted" not in own.stderr, own.stderr
    assert "failed" in own.stderr
    (hermetic_env / "ok").write_text("")
    again = run_fabro("resume", run_id, cwd=repo)
    assert again.returncode == 0, again.stderr
    assert not marker.exists()
