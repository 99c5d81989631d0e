"""A workflow names only files inside its repository, symlinks followed.

Whatever a workflow names is copied into the run's metadata, which `git fabro push`
sends away: a path that leads out of the repository (`..`, an absolute path, `~`, a
symlink, `.git/`) is a validation error at the attribute, and `run` refuses it before
the run exists. Shipped examples name their own prompts, inside the package; a workflow
file outside any repository names files in its own directory tree.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import git, meta_file, run_fabro, run_json, write_workflow

import fabro_git

SECRET = "TOPSECRET-do-not-push\n"


def _fabro_refs(repo: Path) -> list[str]:
    return git(
        repo, "for-each-ref", "--format=%(refname)", "refs/fabro", "refs/heads/fabro"
    ).split()


def _in_objects(repo: Path, content: str, tmp_path: Path) -> bool:
    """Whether a blob with exactly `content` is in the repository's object store."""
    probe = tmp_path / "probe.txt"
    probe.write_text(content)
    sha = git(repo, "hash-object", str(probe)).strip()
    check = subprocess.run(["git", "cat-file", "-e", sha], cwd=repo, check=False)
    return check.returncode == 0


def test_paths_out_of_the_repository_are_errors_and_run_refuses_them(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    (tmp_path / "secret.txt").write_text(SECRET)
    (hermetic_env / ".bashrc").write_text(SECRET)
    (repo / "inside").mkdir()
    (repo / "inside" / "link.md").symlink_to(tmp_path / "secret.txt")
    (repo / "inside" / "dirlink").symlink_to(tmp_path)
    (repo / "inside" / "gitlink.md").symlink_to(repo / ".git" / "config")
    git(repo, "add", "inside")
    lines = [
        "digraph Escape {",
        "    start [shape=Mdiamond]",
        "    exit  [shape=Msquare]",
        '    up    [prompt="@../secret.txt"]',
        f'    abs   [prompt="@{tmp_path / "secret.txt"}"]',
        '    home  [prompt="@~/.bashrc"]',
        '    link  [prompt="@inside/link.md"]',
        '    dir   [prompt="@inside/dirlink/secret.txt"]',
        '    gitc  [prompt="@.git/config"]',
        '    child [shape=house, stack.child_workflow="../elsewhere.fabro"]',
        '    gitl  [prompt="@inside/gitlink.md"]',
        "    start -> up -> abs -> home -> link -> dir -> gitc -> child -> gitl -> exit",
        "}",
    ]
    write_workflow(repo, "\n".join(lines) + "\n")

    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout
    found = {
        line.split(": ")[0]: line
        for line in proc.stdout.splitlines()
        if "[path_inside_repository]" in line
    }
    # file:line:col of each attribute, and the path as written.
    expected = {
        "wf.fabro:4:19": "'@../secret.txt' leads outside",
        "wf.fabro:5:19": "is an absolute path",
        "wf.fabro:6:19": "'@~/.bashrc' names a home directory",
        "wf.fabro:7:19": "'@inside/link.md' resolves through a symlink",
        "wf.fabro:8:19": "'@inside/dirlink/secret.txt' resolves through a symlink",
        "wf.fabro:9:19": "'@.git/config' is inside .git",
        "wf.fabro:10:46": "stack.child_workflow '../elsewhere.fabro' leads outside",
        "wf.fabro:11:19": "'@inside/gitlink.md' resolves through a symlink",
    }
    assert sorted(found) == sorted(expected), proc.stdout
    for where, text in expected.items():
        assert text in found[where], found[where]
    assert "unresolved_file_ref" not in proc.stdout  # one error per path, not two

    run = run_fabro("run", "wf.fabro", "--dry-run", cwd=repo)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "[path_inside_repository]" in run.stderr and "wf.fabro:4:19" in run.stderr
    assert _fabro_refs(repo) == []
    assert not _in_objects(repo, SECRET, tmp_path)


def test_the_home_prompt_library_is_not_a_fallback(repo: Path, hermetic_env: Path) -> None:
    (hermetic_env / ".fabro" / "prompts").mkdir(parents=True)
    (hermetic_env / ".fabro" / "prompts" / "review.md").write_text(SECRET)
    write_workflow(
        repo,
        "digraph F {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  review [prompt="@prompts/review.md"]\n  start -> review -> exit\n}\n',
    )
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    assert "wf.fabro:4:18: error: [unresolved_file_ref]" in proc.stdout
    assert f"looked for {repo.resolve() / 'prompts' / 'review.md'}" in proc.stdout


def test_prompts_inside_the_repository_are_recorded_under_graphs(repo: Path) -> None:
    (repo / "flows" / "prompts").mkdir(parents=True)
    (repo / "shared").mkdir()
    (repo / "flows" / "prompts" / "plan.md").write_text("Plan {{ goal }}\n")
    (repo / "shared" / "review.md").write_text("Review it\n")
    # A symlink that stays inside the repository is fine.
    (repo / "flows" / "prompts" / "alias.md").symlink_to(repo / "shared" / "review.md")
    git(repo, "add", "flows", "shared")
    write_workflow(
        repo,
        "digraph In {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  plan [prompt="@prompts/plan.md"]\n'
        '  review [prompt="@../shared/review.md"]\n'
        '  again [prompt="@prompts/alias.md"]\n'
        "  start -> plan -> review -> again -> exit\n}\n",
        name="flows/in.fabro",
    )
    proc, result = run_json("run", "flows/in.fabro", "--dry-run", "--goal", "ship", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "graphs/flows/prompts/plan.md") == "Plan {{ goal }}\n"
    assert meta_file(repo, run_id, "graphs/shared/review.md") == "Review it\n"
    assert meta_file(repo, run_id, "graphs/flows/prompts/alias.md") == "Review it\n"
    manifest = json.loads(meta_file(repo, run_id, "manifest.json"))
    assert manifest["workflow_file"] == "flows/in.fabro"
    assert "Plan ship" in meta_file(repo, run_id, "nodes/plan/prompt.md")


def test_a_shipped_example_reads_its_own_prompts(repo: Path) -> None:
    examples = Path(fabro_git.__file__).resolve().parent / "examples"
    proc = run_fabro("validate", "plan-implement-review", cwd=repo)
    assert proc.returncode == 0, proc.stdout
    proc, result = run_json(
        "run", "plan-implement-review", "--dry-run", "--goal", "add a flag", cwd=repo
    )
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    for name in ("plan", "implement", "review"):
        recorded = meta_file(repo, run_id, f"graphs/prompts/{name}.md")
        assert recorded == (examples / "prompts" / f"{name}.md").read_text()
    manifest = json.loads(meta_file(repo, run_id, "manifest.json"))
    assert manifest["workflow_file"] == "plan-implement-review.fabro"


def test_a_workflow_outside_the_repository_names_files_in_its_own_tree(
    repo: Path, tmp_path: Path
) -> None:
    flows = tmp_path / "flows"
    (flows / "notes").mkdir(parents=True)
    (flows / "notes" / "ask.md").write_text("Ask nicely\n")
    (tmp_path / "secret.txt").write_text(SECRET)
    good = flows / "good.fabro"
    good.write_text(
        "digraph Out {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  ask [prompt="@notes/ask.md"]\n  start -> ask -> exit\n}\n'
    )
    proc, result = run_json("run", str(good), "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert meta_file(repo, result["run_id"], "graphs/notes/ask.md") == "Ask nicely\n"

    bad = flows / "bad.fabro"
    bad.write_text(
        "digraph Out {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  ask [prompt="@../secret.txt"]\n  start -> ask -> exit\n}\n'
    )
    refused = run_fabro("run", str(bad), "--dry-run", cwd=repo)
    assert refused.returncode == 1
    assert f"{bad}:4:15: error: [path_inside_repository]" in refused.stderr
    assert f"leads outside {flows.resolve()}" in refused.stderr
    assert len(git(repo, "for-each-ref", "refs/fabro/meta").splitlines()) == 1
    assert not _in_objects(repo, SECRET, tmp_path)
