"""Shell completion: the printed scripts, run in real shells against a real repository.

bash goes through git's own completion script when it is installed (`git fabro <TAB>`
calls `_git_fabro`), and is also tried on its own (`git-fabro <TAB>`). zsh and fish run
the script's functions with their completion builtins where a test can reach them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import git, run_fabro, run_json, write_workflow

GIT_BASH_COMPLETION = Path("/usr/share/bash-completion/completions/git")

THREE = """\
digraph Three {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    s1 [shape=parallelogram, script="echo one >> log.txt"]
    s2 [shape=parallelogram, script="echo two >> log.txt"]
    start -> s1 -> s2 -> exit
}
"""


@pytest.fixture
def with_run(repo: Path) -> tuple[Path, str]:
    write_workflow(repo, THREE)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return repo, result["run_id"]


def _script(shell: str, tmp_path: Path) -> Path:
    proc = run_fabro("completion", shell)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / f"completion.{shell}"
    path.write_text(proc.stdout)
    return path


def _bash(script: str, cwd: Path) -> list[str]:
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_complete_words_lists_runs_and_workflow_names_and_is_hidden(
    with_run: tuple[Path, str],
) -> None:
    repo, run_id = with_run
    proc = run_fabro("__complete", "runs", cwd=repo)
    assert proc.stdout.split() == [run_id, "wf"]
    assert run_fabro("__complete", "checkpoints", run_id[:8], cwd=repo).stdout.split() == [
        "start@1",
        "s1@1",
        "s2@1",
        "exit@1",
    ]
    assert "__complete" not in run_fabro("-h").stdout
    # Outside a repository it prints nothing and fails nothing.
    outside = run_fabro("__complete", "runs", cwd=repo.parent)
    assert outside.returncode == 0 and outside.stdout == "" and outside.stderr == ""


def _hostile_run(repo: Path, run_id: str, marker: Path) -> str:
    """A run as a fetch could bring it: a meta ref whose commit names its workflow with
    shell code, and another whose workflow name is a terminal escape."""
    tree = git(repo, "rev-parse", f"refs/fabro/meta/{run_id}^{{tree}}").strip()
    hostile = "01HXZZZZZZZZZZZZZZZZZZZZZZ"
    for ident, name in (
        (hostile, f"$(touch${{IFS}}{marker})"),
        ("01HXZZZZZZZZZZZZZZZZZZZZZY", "\x1b]8;;https://example.com\x07x"),
        # A record separator is a line break to `str.splitlines`: no made-up run.
        ("01HXZZZZZZZZZZZZZZZZZZZZZX", "w\x1erefs/fabro/meta/01HXFAKEFAKEFAKEFAKEFAKEFA"),
    ):
        message = f"init\n\nFabro-Workflow: {name}\n"
        sha = subprocess.run(
            ["git", "commit-tree", tree], input=message, cwd=repo,
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        git(repo, "update-ref", f"refs/fabro/meta/{ident}", sha)
    return hostile


def test_a_fetched_runs_words_are_offered_only_when_they_are_plain(
    with_run: tuple[Path, str], tmp_path: Path
) -> None:
    """A workflow name or a checkpoint's label comes from a fetched run: `__complete`
    prints none that holds shell or terminal characters, and bash's script adds the
    words it is given as they are (`compgen -W` would run a `$(...)` in them)."""
    repo, run_id = with_run
    marker = tmp_path / "pwned"
    hostile = _hostile_run(repo, run_id, marker)
    words = run_fabro("__complete", "runs", cwd=repo).stdout.split("\n")
    assert sorted(w for w in words if w) == sorted(
        [run_id, hostile, "01HXZZZZZZZZZZZZZZZZZZZZZY", "01HXZZZZZZZZZZZZZZZZZZZZZX", "wf"]
    )

    bash = _script("bash", tmp_path)
    lines = _bash(
        f"""
        source {bash}
        comp() {{
            COMP_WORDS=(git-fabro "$@"); COMP_CWORD=$#; COMPREPLY=()
            _git_fabro_standalone
            printf '%s|' "${{COMPREPLY[@]}}"; echo
        }}
        comp show ""
        # Whatever the command printed, the script expands none of it.
        git-fabro() {{ printf '%s\\n' '$(touch${{IFS}}{marker})' 'a*' 'b c'; }}
        comp show ""
        """,
        cwd=repo,
    )
    assert sorted(lines[0].split("|")[:-1]) == sorted(w for w in words if w)
    assert lines[1].split("|")[:-1] == [f"$(touch${{IFS}}{marker})", "a*", "b c"]
    assert not marker.exists()


def test_unknown_shell_is_a_user_error() -> None:
    proc = run_fabro("completion", "tcsh")
    assert proc.returncode == 1 and "bash, zsh and fish" in proc.stderr


@pytest.mark.skipif(
    not GIT_BASH_COMPLETION.exists(), reason="git's bash completion is not installed"
)
def test_bash_through_gits_completion(with_run: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = with_run
    script = _script("bash", tmp_path)
    lines = _bash(
        f"""
        source {GIT_BASH_COMPLETION}
        source {script}
        comp() {{
            COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
            COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
            __git_wrap__git_main
            echo "${{COMPREPLY[*]}}"
        }}
        comp git fabro lo
        comp git fabro re
        comp git fabro inspect ""
        comp git fabro fork {run_id} s
        comp git fabro dump --o
        comp git fabro run hel
        comp git fabro model ""
        comp git fabro completion ""
        comp git -C {repo} fabro logs {run_id[:6]}
        """,
        cwd=repo,
    )
    assert lines[0].split() == ["log", "logs"]
    assert lines[1].split() == ["resume", "rewind"]
    assert lines[2].split() == [run_id, "wf"]
    assert lines[3].split() == ["start@1", "s1@1", "s2@1"]
    assert lines[4].split() == ["--output"]
    assert "hello" in lines[5].split()
    assert lines[6].split() == ["list", "test", "-h", "--help"]
    assert lines[7].split() == ["bash", "zsh", "fish"]
    assert lines[8].split() == [run_id]


def test_bash_standalone_git_fabro(with_run: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = with_run
    script = _script("bash", tmp_path)
    lines = _bash(
        f"""
        source {script}
        COMP_WORDS=(git-fabro res); COMP_CWORD=1; _git_fabro_standalone; echo "${{COMPREPLY[*]}}"
        COMP_WORDS=(git-fabro diff ""); COMP_CWORD=2; _git_fabro_standalone; echo "${{COMPREPLY[*]}}"
        COMP_WORDS=(git-fabro doctor -); COMP_CWORD=2; _git_fabro_standalone; echo "${{COMPREPLY[*]}}"
        """,
        cwd=repo,
    )
    assert lines == ["resume", f"{run_id} wf", "-h --help --json"]


def test_every_visible_command_is_in_the_scripts(tmp_path: Path) -> None:
    import typer.main

    from fabro_git.cli.app import app

    group = typer.main.get_command(app)
    visible = [n for n, c in group.commands.items() if not c.hidden]  # type: ignore[attr-defined]
    for shell in ("bash", "zsh", "fish"):
        text = _script(shell, tmp_path).read_text()
        for name in visible:
            # A whole word in a list: the first of a sorted list follows a quote.
            assert re.search(rf"""[\s"'=]{name}[\s"']""", text), (shell, name)
        assert "__complete runs" in text


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script(with_run: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = with_run
    script = _script("zsh", tmp_path)
    assert subprocess.run(["zsh", "-n", str(script)], check=False).returncode == 0
    # compadd and _files are completion builtins; outside completion, stand-ins print
    # what the function would offer.
    proc = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"""
        source {script}
        compadd() {{ [[ $1 == -- ]] && shift; print -r -- "$*"; }}
        _files() {{ print FILES; }}
        words=(git-fabro lo); CURRENT=2; _git-fabro
        words=(fabro fork {run_id} ""); CURRENT=4; _git-fabro
        words=(fabro dump x --); CURRENT=4; _git-fabro
        words=(fabro inspect ""); CURRENT=3; _git-fabro
        """,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "logs" in lines[0].split() and "doctor" in lines[0].split()
    assert lines[1].split() == ["start@1", "s1@1", "s2@1", "exit@1"]
    assert lines[2].split() == ["-h", "--help", "-o", "--output"]
    assert lines[3].split() == [run_id, "wf"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script(with_run: tuple[Path, str], tmp_path: Path) -> None:
    repo, run_id = with_run
    script = _script("fish", tmp_path)
    assert subprocess.run(["fish", "-n", str(script)], check=False).returncode == 0
    proc = subprocess.run(
        [
            "fish",
            "--no-config",
            "-c",
            f"""
        source {script}
        complete -C 'git-fabro lo'; echo ==
        complete -C 'git fabro do'; echo ==
        complete -C 'git fabro inspect '; echo ==
        complete -C 'git-fabro fork {run_id} s'; echo ==
        complete -C 'git-fabro dump x --o'
        """,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    # One candidate a line, maybe followed by a tab and a description.
    blocks = [[line.split("\t")[0] for line in b.splitlines()] for b in proc.stdout.split("==\n")]
    assert blocks[0] == ["log", "logs"]
    assert blocks[1] == ["doctor"]
    assert blocks[2] == [run_id, "wf"]
    assert blocks[3] == ["s1@1", "s2@1", "start@1"]
    assert blocks[4] == ["--output"]


@pytest.mark.skipif(
    shutil.which("zsh") is None or shutil.which("fish") is None, reason="zsh or fish missing"
)
def test_every_command_that_takes_a_run_completes_run_ids(
    with_run: tuple[Path, str], tmp_path: Path
) -> None:
    """Not files: run ids after show, rm (every word), wait, interrupt, steer and
    `trust --run`, and a run's checkpoints after `show RUN`, in all three shells."""
    repo, run_id = with_run
    (repo / "a-file").write_text("")
    runs = [run_id, "wf"]
    cases = [
        (["show", ""], runs),
        (["rm", ""], runs),
        (["rm", run_id, ""], runs),
        (["wait", ""], runs),
        (["wait", "--timeout", "5", ""], runs),
        (["interrupt", ""], runs),
        (["steer", ""], runs),
        (["trust", "--run", ""], runs),
        (["artifact", "list", ""], runs),
        (["show", run_id, ""], ["start@1", "s1@1", "s2@1", "exit@1"]),
    ]

    def quoted(words: list[str]) -> str:
        return " ".join(w or '""' for w in words)

    bash = _script("bash", tmp_path)
    calls = "\n".join(
        f"COMP_WORDS=(git-fabro {quoted(words)}); "
        f"COMP_CWORD={len(words)}; COMPREPLY=(); _git_fabro_standalone; "
        'echo "${COMPREPLY[*]}"'
        for words, _ in cases
    )
    lines = _bash(f"source {bash}\n{calls}", cwd=repo)
    assert [sorted(line.split()) for line in lines] == [sorted(w) for _, w in cases]

    zsh = _script("zsh", tmp_path)
    calls = "\n".join(
        f"words=(fabro {quoted(words)}); CURRENT={len(words) + 1}; _git-fabro; print -r -- '==='"
        for words, _ in cases
    )
    proc = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"""
        source {zsh}
        compadd() {{ [[ $1 == -- ]] && shift; print -r -- "$*"; }}
        _files() {{ print FILES; }}
        {calls}
        """,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("===\n")[:-1]
    assert [sorted(b.split()) for b in blocks] == [sorted(w) for _, w in cases]

    fish = _script("fish", tmp_path)
    calls = "\n".join(f"complete -C 'git-fabro {' '.join(words)}'; echo ==" for words, _ in cases)
    proc = subprocess.run(
        ["fish", "--no-config", "-c", f"source {fish}\n{calls}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    blocks = [
        sorted(line.split("\t")[0] for line in b.splitlines())
        for b in proc.stdout.split("==\n")[:-1]
    ]
    assert blocks == [sorted(w) for _, w in cases]


@pytest.fixture
def with_batch(repo: Path, tmp_path: Path) -> tuple[Path, str]:
    """A repository with one batch (of one row) of the THREE workflow."""
    write_workflow(repo, THREE)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"goal": "one row"}\n')
    proc = run_fabro("batch", "wf.fabro", "--inputs", str(rows), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return repo, json.loads(proc.stdout.splitlines()[0])["batch_id"]


@pytest.mark.skipif(
    shutil.which("zsh") is None or shutil.which("fish") is None, reason="zsh or fish missing"
)
def test_batch_ids_complete_after_batch_status_and_resume(
    with_batch: tuple[Path, str], tmp_path: Path
) -> None:
    """`batch status <TAB>` and `batch --resume <TAB>` offer the batches of
    refs/fabro/batch/, and `batch <TAB>` offers `status` beside the workflows, in all
    three shells; no run id is offered for a batch."""
    repo, batch_id = with_batch
    assert run_fabro("__complete", "batches", cwd=repo).stdout.split() == [batch_id]
    cases: list[tuple[list[str], list[str]]] = [
        (["batch", "status", ""], [batch_id]),
        (["batch", "--resume", ""], [batch_id]),
        (["batch", "--json", "status", ""], [batch_id]),
        (["batch", "st"], ["status"]),
    ]

    def quoted(words: list[str]) -> str:
        return " ".join(w or '""' for w in words)

    bash = _script("bash", tmp_path)
    calls = "\n".join(
        f"COMP_WORDS=(git-fabro {quoted(words)}); "
        f"COMP_CWORD={len(words)}; COMPREPLY=(); _git_fabro_standalone; "
        'echo "${COMPREPLY[*]}"'
        for words, _ in cases
    )
    # The value of --inputs is a file, not a workflow nor `status`.
    (repo / "rows.jsonl").write_text("")
    calls += '\nCOMP_WORDS=(git-fabro batch --inputs ""); COMP_CWORD=3; _git_fabro_standalone'
    calls += '; echo "${COMPREPLY[*]}"'
    lines = _bash(f"source {bash}\n{calls}", cwd=repo)
    assert [sorted(line.split()) for line in lines[:-1]] == [sorted(w) for _, w in cases]
    assert "rows.jsonl" in lines[-1].split() and "status" not in lines[-1].split()

    zsh = _script("zsh", tmp_path)
    calls = "\n".join(
        f"words=(fabro {quoted(words)}); CURRENT={len(words) + 1}; _git-fabro; print -r -- '==='"
        for words, _ in cases
    )
    proc = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"""
        source {zsh}
        compadd() {{ [[ $1 == -- ]] && shift; print -r -- "$*"; }}
        _files() {{ :; }}
        {calls}
        """,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("===\n")[:-1]
    # zsh's compadd filters by the typed prefix itself; the stand-in does not.
    assert [sorted(b.split()) for b in blocks[:3]] == [sorted(w) for _, w in cases[:3]]
    assert "status" in blocks[3].split() and batch_id not in blocks[3].split()

    fish = _script("fish", tmp_path)
    calls = "\n".join(f"complete -C 'git-fabro {' '.join(words)}'; echo ==" for words, _ in cases)
    proc = subprocess.run(
        ["fish", "--no-config", "-c", f"source {fish}\n{calls}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    blocks = [
        sorted(line.split("\t")[0] for line in b.splitlines())
        for b in proc.stdout.split("==\n")[:-1]
    ]
    assert blocks == [sorted(w) for _, w in cases]
