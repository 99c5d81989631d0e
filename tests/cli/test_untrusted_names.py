"""What others named reaches the terminal shown, never executed: a workflow's file and
subgraph names in `validate` and `run`'s warnings, a fetched batch record in `batch
status`, a remote's ref names in `fetch`, a fetched run's commit messages in `log`.

Each is made hostile with real git (a file name, `update-ref`, `commit-tree`) and read
back through the real `git fabro`: the escapes must arrive as text (`\\x1b`), never as
the bytes a terminal acts on. (`test_terminal_escapes` holds the sanitiser's own tests
and those of run data.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import bare_remote, git, on_a_terminal, run_fabro, run_json, write_workflow

from fabro_git.terminal import printable

# A clipboard write (OSC 52), a colour, a right-to-left override, a C1 CSI, a backspace.
HOSTILE = "\x1b]52;c;Zm9v\x07\x1b[31mRED\u202e\x9b2J\x08"
SHOWN = printable(HOSTILE, one_line=True)
RAW = ("\x1b", "\x07", "\u202e", "\x9b", "\x08")


def _raw_in(text: str) -> list[str]:
    return [char for char in RAW if char in text]


def _warned(repo: Path) -> str:
    """A workflow, hostile in its file and subgraph names, with warnings only: the
    subgraph's unknown attribute and a typo (which `run` lets pass when told)."""
    name = f"warn{HOSTILE}.fabro"
    write_workflow(
        repo,
        f'digraph V {{ subgraph "cluster{HOSTILE}" {{ foo="1"; s }} start [shape=Mdiamond] '
        'exit [shape=Msquare] s [shape=parallelogram, script="true", promt="x"] '
        "start -> s -> exit }\n",
        name=name,
    )
    return name


def test_validate_shows_the_names_a_workflow_holds(repo: Path, tmp_path: Path) -> None:
    assert SHOWN == "\\x1b]52;c;Zm9v\\x07\\x1b[31mRED\\u202e\\x9b2J\\x08"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"t{HOSTILE}.md").write_text("hi")
    (repo / "link.md").symlink_to(outside / f"t{HOSTILE}.md")
    (repo / "broken.fabro").write_text(
        "digraph W {\n"
        "    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        '    a [shape=tab, prompt="@link.md"]\n'
        f'    b [shape=tab, prompt="@nofile{HOSTILE}.md"]\n'
        f'    c [shape=tab, prompt="hello {{{{ in{HOSTILE} }}}} {{% ta{HOSTILE} %}}"]\n'
        "    start -> a -> b -> c -> exit\n}\n"
    )
    broken = run_fabro("validate", "broken.fabro", cwd=repo)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert _raw_in(broken.stdout + broken.stderr) == [], broken.stdout
    lines = broken.stdout.splitlines()
    assert any("[path_inside_repository]" in line and f"t{SHOWN}.md" in line for line in lines)
    assert any(f"(looked for {repo}/nofile{SHOWN}.md)" in line for line in lines), lines
    assert any(f"{{{{ in{SHOWN} }}}}" in line for line in lines), lines
    assert any(f"{{% ta{SHOWN} %}}" in line for line in lines), lines

    name = _warned(repo)
    warned = run_fabro("validate", name, cwd=repo)
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert _raw_in(warned.stdout) == [], warned.stdout
    assert f"subgraph cluster{SHOWN}: unknown attribute 'foo'" in warned.stdout
    assert f"warn{SHOWN}.fabro: valid with 2 warnings" in warned.stdout


def test_run_shows_the_names_in_its_warnings(repo: Path) -> None:
    ran = run_fabro("run", "--allow-typos", _warned(repo), cwd=repo)
    assert ran.returncode == 0, ran.stderr
    assert _raw_in(ran.stderr) == [], ran.stderr
    assert f"warn{SHOWN}.fabro:1:" in ran.stderr
    assert f"subgraph cluster{SHOWN}: unknown attribute 'foo'" in ran.stderr


def _git_in(repo: Path, args: list[str], data: bytes) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, input=data, capture_output=True, check=True)
    return proc.stdout.decode().strip()


def _with_status(repo: Path, run_id: str, status: str) -> None:
    """A new commit on the run's meta ref whose checkpoint says `status`."""
    ref = f"refs/fabro/meta/{run_id}"
    checkpoint = json.loads(git(repo, "show", f"{ref}:checkpoint.json"))
    checkpoint["status"] = status
    blob = _git_in(repo, ["hash-object", "-w", "--stdin"], json.dumps(checkpoint).encode())
    entries = [
        f"100644 blob {blob}\tcheckpoint.json" if line.endswith("\tcheckpoint.json") else line
        for line in git(repo, "ls-tree", ref).splitlines()
    ]
    tree = _git_in(repo, ["mktree"], "".join(f"{line}\n" for line in entries).encode())
    commit = _git_in(repo, ["commit-tree", tree, "-p", ref, "-F", "-"], b"fabro: forged\n")
    git(repo, "update-ref", ref, commit)


def test_batch_status_shows_a_fetched_records_fields(repo: Path) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    _with_status(repo, run_id, f"st{HOSTILE}")
    batch_id = "01M91F6BATCH0000000000000A"
    record = {
        "batch_id": batch_id,
        "workflow": f"wf{HOSTILE}",
        "created_at": "2026-01-01T00:00:00Z",
        "labels": {},
        "remote": None,
        "rows": [
            {"row": 1, "run_id": run_id, "goal": None, "inputs": {}},
            {"row": 2, "run_id": f"RID{HOSTILE}", "goal": None, "inputs": {}},
        ],
    }
    data = json.dumps(record, ensure_ascii=False).encode()
    blob = _git_in(repo, ["hash-object", "-w", "--stdin"], data)
    tree = _git_in(repo, ["mktree"], f"100644 blob {blob}\tbatch.json\n".encode())
    commit = _git_in(repo, ["commit-tree", tree, "-F", "-"], b"fabro: batch\n")
    git(repo, "update-ref", f"refs/fabro/batch/{batch_id}", commit)

    shown = run_fabro("batch", "status", batch_id, cwd=repo)
    assert shown.returncode == 0, shown.stderr
    assert _raw_in(shown.stdout + shown.stderr) == [], shown.stdout
    header, *rows = shown.stdout.splitlines()
    assert header == f"batch {batch_id}: 2 runs of wf{SHOWN}: 1 queued, 1 st{SHOWN}"
    assert rows[1].split()[1:3] == [run_id, f"st{SHOWN}"]
    assert rows[2].split()[1:3] == [f"RID{SHOWN}", "queued"]


def test_fetch_shows_a_remotes_ref_names_in_what_it_kept(repo: Path, tmp_path: Path) -> None:
    # git refuses ASCII controls in a ref name, not a bidi override or a C1 control.
    run_id = "01M91FAAAAAAAAAAAAAAAAAAAA\u202e\x9b31mX"
    refs = [f"refs/heads/fabro/run/{run_id}", f"refs/fabro/meta/{run_id}"]
    origin = bare_remote(tmp_path, origin_of=repo)
    for ref in refs:
        git(origin, "update-ref", ref, "main")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    first = run_fabro("fetch", "origin", cwd=clone)
    assert first.returncode == 0, first.stderr
    # The remote's run moves where this clone's never was.
    elsewhere = git(origin, "commit-tree", "-m", "diverged", "main^{tree}").strip()
    for ref in refs:
        git(origin, "update-ref", ref, elsewhere)

    kept = run_fabro("fetch", "origin", cwd=clone)
    assert kept.returncode == 1, kept.stderr
    assert _raw_in(kept.stderr) == [], kept.stderr
    shown_id = "01M91FAAAAAAAAAAAAAAAAAAAA\\u202e\\x9b31mX"
    assert f"kept local refs/fabro/meta/{shown_id} (" in kept.stderr
    assert f"git fabro fork {shown_id}), then git fabro rm {shown_id} and" in kept.stderr


def test_log_shows_a_fetched_runs_commit_messages(repo: Path) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    ref = f"refs/fabro/meta/{run_id}"
    message = f"finalize {HOSTILE}\rOVER\n\nFabro-Status: failed{HOSTILE}\n"
    forged = _git_in(
        repo, ["commit-tree", f"{ref}^{{tree}}", "-p", ref, "-F", "-"], message.encode()
    )
    git(repo, "update-ref", ref, forged)

    piped = run_fabro("log", run_id, "-1", cwd=repo)
    assert piped.returncode == 0, piped.stderr
    assert _raw_in(piped.stdout) == [], piped.stdout
    assert f"    finalize {SHOWN}\\rOVER\n" in piped.stdout
    assert f"    Fabro-Status: failed{SHOWN}\n" in piped.stdout

    # On a terminal, through the pager git would start, shown all the same.
    code, seen = on_a_terminal(["log", run_id, "-1"], repo, env={"GIT_PAGER": "sed 's/^/paged: /'"})
    assert code == 0, seen
    text = seen.decode().replace("\r\n", "\n")
    assert _raw_in(text) == [] and "\r" not in text, text
    assert f"paged:     finalize {SHOWN}\\rOVER\n" in text
