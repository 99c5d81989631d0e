"""The documents say what the code does: the run layout in `docs/storage-format.md` and
the man page's FILES section against `store/runs.py`, which owns every ref name, tree
path and trailer, and the README's first workflow against the real command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import ROOT, git, run_fabro, run_json

from fabro_git.store import runs

STORAGE = ROOT / "docs" / "storage-format.md"
MAN = ROOT / "man" / "git-fabro.1"
README = ROOT / "README.md"

# Constants of store/runs.py that are not an entry at the top of the meta tree.
NOT_TOP_LEVEL = {
    "NODE_STATUS": "inside nodes/<node>/",
    "SNAPSHOT_SUBJECT_INIT": "a commit subject",
    "BATCH_RECORD": "the one file of a batch's commit",
}


def _layout_constants() -> dict[str, str]:
    """Every public string constant of store/runs.py: ref prefixes, tree paths, trailers."""
    return {
        name: value
        for name, value in vars(runs).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


def _trailers() -> set[str]:
    """Every `Fabro-*` trailer store/runs.py writes or reads, constants or not."""
    return set(
        re.findall(r"\bFabro-[A-Z][A-Za-z]*(?:-[A-Z][A-Za-z]*)*", Path(runs.__file__).read_text())
    )


def _man_plain(text: str) -> str:
    """roff as it reads: fonts dropped, escapes resolved."""
    text = re.sub(r"\\f[BIRP]", "", text)
    return text.replace("\\-", "-").replace("\\(aq", "'").replace("\\e", "\\")


def _man_files() -> str:
    text = MAN.read_text()
    section = re.search(r"^\.SH FILES\n(.*?)^\.SH ", text, re.M | re.S)
    assert section, "man/git-fabro.1 has no FILES section"
    return section.group(1)


def _man_meta_tree() -> list[str]:
    """The paths the FILES section lists under the meta ref: the tags of its .RS list."""
    files = _man_files()
    block = re.search(r"^\\fBrefs/fabro/meta/.*?^\.RS\n(.*?)^\.RE", files, re.M | re.S)
    assert block, "FILES lists no tree under refs/fabro/meta/ID (a .TP list in .RS/.RE)"
    tags = re.findall(r"^\.TP\n(.*)$", block.group(1), re.M)
    return [path.strip() for tag in tags for path in _man_plain(tag).split(",")]


def _doc_meta_tree() -> list[str]:
    """The paths docs/storage-format.md lists in its tree under "## The metadata tree"."""
    text = STORAGE.read_text()
    section = text[text.index("## The metadata tree") :]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block, "storage-format.md has no ```text tree under ## The metadata tree"
    return [line.split()[0] for line in block.group(1).splitlines() if line[:1].strip()]


def _documents() -> dict[str, tuple[str, dict[str, str]]]:
    """Each document's text and how it writes the placeholders the layout functions take."""
    angle = {
        "id": "<id>",
        "node": "<node>",
        "node_visit": "<node>-<visit>",
        "n": "<n>",
        "stage_id": "<stage_id>",
        "key": "<key>",
        "node_slug": "<node_slug>",
        "path": "<path>",
        "visit": "<visit>",
        "status": "<status>",
    }
    upper = {
        "id": "ID",
        "node": "NODE",
        "node_visit": "NODE-VISIT",
        "n": "N",
        "stage_id": "STAGE_ID",
        "key": "KEY",
        "node_slug": "NODE_SLUG",
        "path": "PATH",
        "visit": "VISIT",
        "status": "STATUS",
    }
    return {
        "docs/storage-format.md": (STORAGE.read_text(), angle),
        "man/git-fabro.1 FILES": (_man_plain(_man_files()), upper),
    }


def _layout_shapes(p: dict[str, str]) -> list[str]:
    """What the layout functions of store/runs.py make of the placeholders."""
    shapes = [
        runs.run_branch_ref(p["id"]),
        runs.meta_ref(p["id"]),
        runs.parallel_ref(p["id"], p["node_visit"], p["n"]),  # type: ignore[arg-type]
        runs.child_progress_ref(p["id"], p["stage_id"]),
        runs.batch_ref(p["id"]),
        runs.artifact_path(p["key"]),
        runs.asset_dir(p["node_slug"], p["n"]),  # type: ignore[arg-type]
        runs.graph_path(p["path"]),
        runs.node_dir(p["node"]),
        runs.snapshot_subject_checkpoint(p["node"], p["visit"]),  # type: ignore[arg-type]
        runs.snapshot_subject_finalize(p["status"]),
        # Segment numbers are zero-padded digits: the documents write each digit as N.
        re.sub(r"\d", "N", runs.segment_path(1)),
        re.sub(r"\d", "N", runs.flat_segment_path(1)),
    ]
    return shapes


@pytest.mark.parametrize("document", ["docs/storage-format.md", "man/git-fabro.1 FILES"])
def test_every_name_of_the_run_layout_is_documented(document: str) -> None:
    text, placeholders = _documents()[document]
    missing = []
    for name, value in _layout_constants().items():
        shown = f"{value}/" if name.endswith("_DIR") else value
        after = "" if shown.endswith("/") else r"(?![\w-])"
        if not re.search(rf"(?<![\w.-]){re.escape(shown)}{after}", text):
            missing.append(f"{name} = {value!r}")
    missing += [f"trailer {t}" for t in sorted(_trailers()) if t not in text]
    missing += [f"path {shape}" for shape in _layout_shapes(placeholders) if shape not in text]
    assert not missing, f"{document} does not mention: {missing}"


@pytest.mark.parametrize("lister", [_doc_meta_tree, _man_meta_tree])
def test_the_meta_tree_listed_is_the_one_the_code_writes(lister: object) -> None:
    listed = lister()  # type: ignore[operator]
    top = {path.split("/")[0] for path in listed}
    constants = _layout_constants()
    tree = {
        value
        for name, value in constants.items()
        if name not in NOT_TOP_LEVEL and not value.startswith(("refs/", "Fabro-"))
    }
    assert top - tree == set(), f"listed under the meta tree, unknown to store/runs.py: {listed}"
    assert tree - top == set(), f"in store/runs.py's meta tree, not listed: {sorted(tree - top)}"


def _commands() -> list[str]:
    """Every command of the app as typed, `model list` for a group's subcommand."""
    import typer.main

    from fabro_git.cli.app import app

    group = typer.main.get_command(app)
    names = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        if getattr(command, "hidden", False):
            continue
        sub = getattr(command, "commands", None)
        names += [f"{name} {n}" for n in sub] if sub else [name]
    return names


def test_the_synopsis_names_every_command_once() -> None:
    text = MAN.read_text()
    synopsis = re.search(r"^\.SH SYNOPSIS\n(.*?)^\.SH ", text, re.M | re.S)
    assert synopsis
    lines = [_man_plain(line) for line in synopsis.group(1).splitlines()]
    heads = [
        line.removeprefix("git fabro ").split(" [")[0]
        for line in lines
        if line.startswith("git fabro ")
    ]
    said = []
    for head in heads:
        words = head.split()
        if words[0] == "hooks":  # hooks install|uninstall
            said += [f"{words[0]} {sub}" for sub in words[1].split("|")]
        elif words and words[0] in ("model", "artifact", "workflow"):
            said.append(" ".join(words[:2]))
        elif words and not words[0].startswith("-"):
            said.append(words[0])
    commands = _commands()
    missing = sorted(set(commands) - set(said))
    twice = sorted({c for c in said if said.count(c) > 1})
    unknown = sorted(set(said) - set(commands))
    assert not (missing or twice or unknown), (
        f"SYNOPSIS: missing {missing}, twice {twice}, unknown {unknown}"
    )


def _first_workflow() -> str:
    """The README's first workflow: the ```dot block after its marker."""
    text = README.read_text()
    start = text.index("<!-- first-workflow")
    block = re.search(r"```dot\n(.*?)```", text[start:], re.S)
    assert block, "no ```dot block after the README's first-workflow marker"
    return block.group(1)


def _stages(repo: Path, run_id: str) -> list[str]:
    """The nodes of the run branch's stage commits, first to last."""
    subjects = git(repo, "log", "--reverse", "--format=%s", f"fabro/run/{run_id}").splitlines()
    return [s.split(": ", 1)[1].split(" (")[0] for s in subjects if s.startswith("fabro(")]


def test_the_readmes_first_workflow_validates_and_runs(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stages' `python3 -m pytest` is the suite's own: without the plugins installed
    # beside it (xdist, hypothesis, playwright) each of its four starts costs a sixth.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    (repo / "fix-tests.fabro").write_text(_first_workflow())
    (repo / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    git(repo, "add", "test_ok.py")
    git(repo, "commit", "-q", "-m", "a passing test suite")
    checked = run_fabro("validate", "fix-tests.fabro", cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "warning" not in checked.stdout, checked.stdout

    proc, result = run_json("run", "fix-tests.fabro", "--dry-run", "--auto-approve", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    assert _stages(repo, result["run_id"]) == ["start", "test", "review", "exit"]

    # A suite that keeps failing, and a fix that changes nothing: the third failure alike
    # ends the loop, as the README says.
    (repo / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 3\n")
    git(repo, "commit", "-q", "-am", "a failing test suite")
    proc, result = run_json("run", "fix-tests.fabro", "--dry-run", "--auto-approve", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    stages = _stages(repo, result["run_id"])
    assert stages == ["start", "test", "fix", "test", "fix", "test"], (stages, proc.stderr)
    assert "failed the same way 3 times" in proc.stderr, proc.stderr


PYTHON_STAGES = """\
digraph Which {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    shell [shape=parallelogram, script="python3 -c 'import sys; print(sys.prefix)' > shell.txt"]
    py    [shape=parallelogram, language=python, script="import sys; open('py.txt', 'w').write(sys.prefix)"]
    start -> shell -> py -> exit
}
"""


def test_installed_as_the_readme_says_stages_run_the_users_python(repo: Path) -> None:
    """`git-fabro` on PATH alone (a symlink, pipx): its venv is not what stages run."""
    import os
    import subprocess
    import sys

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment")
    own = Path(sys.executable).parent
    path = os.pathsep.join(
        entry
        for entry in os.environ["PATH"].split(os.pathsep)
        if not (os.path.isdir(entry) and os.path.samefile(entry, own))
    )
    (repo / "which.fabro").write_text(PYTHON_STAGES)
    proc = subprocess.run(
        [str(own / "git-fabro"), "run", "which.fabro", "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=path),
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    for name in ("shell.txt", "py.txt"):
        prefix = git(repo, "show", f"fabro/run/{run_id}:{name}").strip()
        assert prefix and not os.path.samefile(prefix, sys.prefix), (name, prefix)


def test_the_man_page_names_every_git_variable_a_stage_does_not_get() -> None:
    from fabro_git.store._gitcli import GIT_LOCATION_VARIABLES

    text = _man_plain(MAN.read_text())
    paragraph = text[text.index("gets the environment without") :][:1200]
    missing = sorted(name for name in GIT_LOCATION_VARIABLES if name not in paragraph)
    assert not missing, f"man/git-fabro.1 does not say a stage goes without {missing}"
