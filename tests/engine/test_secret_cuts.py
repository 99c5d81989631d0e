"""A secret cut or rewritten before it is masked leaves a part no pattern recognises.

Each test puts a secret where the run cuts or folds text (an error's detail, a failure
signature, a prompt's lines, a setup command's stderr tail, `run -v`'s lines) and then
looks for any part of it, ten characters or more in either case, in every git object and
on the terminal. The secret has no digits, so the signature's folding of digits cannot
hide a part of it from the search.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import git, meta_file, run_fabro, run_json, wait_until, write_workflow

SECRET = "hunter-correct-horse-battery-PWsecretQXZ"
ENV = {"MY_SERVICE_PASSWORD": SECRET}


def _parts(text: str, size: int = 10) -> set[str]:
    found = {text[i : i + size] for i in range(len(text) - size + 1)}
    return found | {part.lower() for part in found}


def _all_objects(repo: Path) -> str:
    return subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8", "replace")


def _parts_in(text: str) -> list[str]:
    return sorted(part for part in _parts(SECRET) if part in text)


def _pad_then_secret(padding: int, stream: str = ">&2") -> str:
    return f"printf '%{padding}s%s\\\\n' '' \\\"$MY_SERVICE_PASSWORD\\\" {stream}"


def test_an_error_cut_after_the_start_of_a_secret_keeps_no_part_of_it(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The error quotes the last line of stderr, cut to 200 characters; the secret starts
    # at 185. The failure signature folds the error to lower case; the prompt of the
    # stage after quotes the error and the output's last lines, each cut to 200.
    run_config = repo.parent / "pass.toml"
    run_config.write_text(
        f'[workflow]\ngraph = "{repo / "wf.fabro"}"\n'
        '[run.sandbox.env]\nMY_SERVICE_PASSWORD = "{{ env.MY_SERVICE_PASSWORD }}"\n'
    )
    write_workflow(
        repo,
        f"""
        digraph Cut {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            fail  [shape=parallelogram, max_retries=0,
                   script="{_pad_then_secret(190, "")}; {_pad_then_secret(185)}; exit 1"]
            ask   [shape=box, prompt="Look at what failed"]
            start -> fail
            fail -> ask [condition="outcome=failed"]
            fail -> exit
            ask -> exit
        }}
        """,
    )
    monkeypatch.setenv("MY_SERVICE_PASSWORD", SECRET)
    proc, result = run_json("run", str(run_config), "--dry-run", cwd=repo)
    assert proc.returncode == 0 and result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    status = meta_file(repo, run_id, "nodes/fail/status.json")
    # The cut and the signature were made: their masked forms are there.
    assert "command exited with status 1: " in status
    assert '"failure_signature"' in status
    assert "***" in meta_file(repo, run_id, "nodes/ask/prompt.md")
    assert _parts_in(_all_objects(repo)) == []
    assert _parts_in(proc.stderr + proc.stdout) == []


def test_a_setup_commands_stderr_tail_keeps_no_part_of_a_secret(repo: Path) -> None:
    # The `setup.failed` event holds the last 4000 characters of stderr; the secret
    # starts 4010 from its end.
    script = (
        "printf '%s' \\\"$MY_SERVICE_PASSWORD\\\" >&2; "
        "head -c 3980 /dev/zero | tr '\\\\0' z >&2; exit 2"
    )
    (repo / "run.toml").write_text(
        '[workflow]\ngraph = "wf.fabro"\n'
        '[run.sandbox.env]\nMY_SERVICE_PASSWORD = "{{ env.MY_SERVICE_PASSWORD }}"\n'
        f'[[run.prepare.steps]]\nscript = "{script}"\n'
    )
    write_workflow(
        repo,
        """
        digraph Setup {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            start -> exit
        }
        """,
    )
    git(repo, "add", "run.toml")
    git(repo, "commit", "-q", "-m", "config")
    proc = run_fabro("run", "run.toml", cwd=repo, env=ENV)
    assert proc.returncode != 0
    assert "zzzz" in _all_objects(repo)  # the tail was recorded
    assert _parts_in(_all_objects(repo)) == []
    assert _parts_in(proc.stderr + proc.stdout) == []


def test_run_v_shows_a_commands_lines_masked(repo: Path) -> None:
    # Printed in two pieces, with a pause between, so the live follower reads the
    # secret cut in two at least some of the time; the masker holds back what may
    # still become one.
    run_config = repo.parent / "pass.toml"
    run_config.write_text(
        f'[workflow]\ngraph = "{repo / "wf.fabro"}"\n'
        '[run.sandbox.env]\nMY_SERVICE_PASSWORD = "{{ env.MY_SERVICE_PASSWORD }}"\n'
    )
    write_workflow(
        repo,
        """
        digraph Loud {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            say   [shape=parallelogram,
                   script="echo before; printf '%s' \\"${MY_SERVICE_PASSWORD%????????????}\\"; sleep 0.2; printf '%s\\\\n' \\"${MY_SERVICE_PASSWORD#????????????????????????????}\\"; echo after"]
            start -> say -> exit
        }
        """,
    )
    proc = run_fabro("run", str(run_config), "-v", cwd=repo, env=ENV)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stderr + proc.stdout
    assert "before" in shown and "after" in shown
    assert "***tQXZ" in shown
    assert _parts_in(shown) == []


def test_a_detached_run_gives_its_stages_the_secret_input_it_stores_masked(repo: Path) -> None:
    # The stage prints the input reversed: no masker knows that form, so what it saw is
    # what it printed.
    write_workflow(
        repo,
        """
        digraph Detached {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            show  [shape=parallelogram, script="printf '%s\\\\n' \\"$FABRO_INPUT_API_TOKEN\\" | rev"]
            start -> show -> exit
        }
        """,
    )
    proc = run_fabro("run", "-d", "wf.fabro", "-V", f"API_TOKEN={SECRET}", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()

    def ended() -> bool:
        tails = (Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*/events.jsonl")
        return any(b'"run.completed"' in tail.read_bytes() for tail in tails)

    wait_until(ended, what="the detached run's end")
    assert meta_file(repo, run_id, "nodes/show/stdout.log") == SECRET[::-1] + "\n"
    manifest = meta_file(repo, run_id, "manifest.json")
    assert "***tQXZ" in manifest
    assert SECRET not in _all_objects(repo)


def _encoded(secret: str) -> list[str]:
    """The secret base64-encoded after 0, 1 and 2 other bytes (the part of each that is
    the secret's alone), and hex-encoded in either case."""
    import base64

    data = secret.encode()
    forms = [data.hex(), data.hex().upper()]
    for offset, (start, end) in enumerate([(0, -1), (2, -1), (3, -1)]):
        forms.append(base64.b64encode(b"ab"[:offset] + data + b"\n").decode()[start:end][:-3])
    return forms


def test_a_secret_encoded_in_base64_or_hex_is_masked_too(repo: Path) -> None:
    """`env | base64` or a hex dump in a command's output carries the secret as surely
    as the secret itself: those forms are masked wherever the secret starts in the
    encoded bytes."""
    run_config = repo.parent / "pass.toml"
    run_config.write_text(
        f'[workflow]\ngraph = "{repo / "wf.fabro"}"\n'
        '[run.sandbox.env]\nMY_SERVICE_PASSWORD = "{{ env.MY_SERVICE_PASSWORD }}"\n'
    )
    dumps = "; ".join(
        f"printf '{prefix}%s\\\\n' \\\"$MY_SERVICE_PASSWORD\\\" | base64 -w0; echo"
        for prefix in ("", "a", "ab")
    )
    hexed = "printf %s \\\"$MY_SERVICE_PASSWORD\\\" | od -An -tx1 | tr -d ' \\\\n'; echo"
    write_workflow(
        repo,
        f"""
        digraph Encoded {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            say   [shape=parallelogram, script="{dumps}; {hexed}; {hexed} | tr a-f A-F"]
            start -> say -> exit
        }}
        """,
    )
    proc = run_fabro("run", str(run_config), "-v", cwd=repo, env=ENV)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stderr + proc.stdout
    everything = _all_objects(repo) + shown
    assert shown.count("***") >= 5, shown
    for form in _encoded(SECRET):
        assert len(form) > 40
        leaked = {form[i : i + 12] for i in range(len(form) - 11)} & set(
            everything[j : j + 12] for j in range(len(everything) - 11)
        )
        assert not leaked, (form, sorted(leaked)[:3])
