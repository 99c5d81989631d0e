"""`git fabro graph`: styled DOT, Graphviz rendering, and a clear error without Graphviz."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_fabro

import fabro_git
from fabro_git.cli.graph import quote, render_dot
from fabro_git.workflow import parse

EXAMPLES = Path(fabro_git.__file__).parent / "examples"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz is not installed")


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr
    assert "unexpected error" not in proc.stderr


@pytest.fixture
def bin_without_dot(tmp_path: Path) -> Path:
    """A PATH holding only git and git-fabro: no Graphviz."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bindir / "git").symlink_to(os.path.realpath(git))
    wrapper = bindir / "git-fabro"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fabro_git "$@"\n')
    wrapper.chmod(0o755)
    return bindir


def test_dot_format_needs_no_graphviz_and_styles_by_type(
    tmp_path: Path, bin_without_dot: Path
) -> None:
    proc = run_fabro(
        "graph", str(EXAMPLES / "branch-loop.fabro"), "--format", "dot",
        cwd=tmp_path, env={"PATH": str(bin_without_dot)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith('digraph "BranchLoop" {')
    assert 'rankdir="LR"' in out
    assert '"start" [shape="circle"' in out
    assert '"exit" [shape="doublecircle"' in out
    assert '"test" [shape="parallelogram"' in out
    assert 'label="Test\\ncommand · goal gate"' in out
    assert (
        '"test" -> "exit" [color="#2563eb", fontcolor="#1d4ed8", label="Pass\\n[outcome=succeeded]"]'
        in out
    )
    assert '"test" -> "fix" [label="Fix"]' in out


@needs_dot
def test_svg_to_stdout(tmp_path: Path) -> None:
    proc = run_fabro("graph", str(EXAMPLES / "hello.fabro"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in proc.stdout and "</svg>" in proc.stdout
    assert "Write greeting" in proc.stdout


@needs_dot
def test_svg_and_png_to_files(tmp_path: Path) -> None:
    svg = tmp_path / "out.svg"
    png = tmp_path / "out.png"
    workflow = str(EXAMPLES / "parallel-review.fabro")
    assert run_fabro("graph", workflow, "-o", str(svg), cwd=tmp_path).returncode == 0
    proc = run_fabro("graph", workflow, "--format", "png", "--output", str(png), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert svg.read_text().lstrip().startswith("<?xml")
    assert "Reviewers" in svg.read_text()  # the subgraph became a labelled cluster
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@needs_dot
def test_png_to_stdout_is_binary(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["git", "fabro", "graph", str(EXAMPLES / "hello.fabro"), "--format", "png"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(("flag", "rankdir"), [("tb", "TB"), ("LR", "LR")])
def test_direction(tmp_path: Path, flag: str, rankdir: str) -> None:
    proc = run_fabro(
        "graph", str(EXAMPLES / "hello.fabro"), "--format", "dot", "--direction", flag, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert f'rankdir="{rankdir}"' in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "gif"], "error: unknown format 'gif': choose one of svg, png, dot"),
        (["--direction", "diagonal"], "error: unknown direction 'diagonal': choose lr or tb"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_fabro("graph", str(EXAMPLES / "hello.fabro"), *args, cwd=tmp_path)
    assert proc.returncode == 1
    assert message in proc.stderr
    no_traceback(proc)


def test_missing_graphviz_says_how_to_install(tmp_path: Path, bin_without_dot: Path) -> None:
    proc = run_fabro(
        "graph", str(EXAMPLES / "hello.fabro"), "-o", str(tmp_path / "x.svg"),
        cwd=tmp_path, env={"PATH": str(bin_without_dot)},
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Graphviz's `dot` is needed to render svg but is not on PATH" in proc.stderr
    assert "apt-get install graphviz" in proc.stderr
    assert "brew install graphviz" in proc.stderr
    assert not (tmp_path / "x.svg").exists()
    no_traceback(proc)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    proc = run_fabro("graph", "nope.fabro", "--format", "dot", cwd=tmp_path)
    assert proc.returncode == 1
    assert "error: nope.fabro: no such file" in proc.stderr
    no_traceback(proc)
    (tmp_path / "bad.fabro").write_text("digraph G {\n  a -> \n}\n")
    proc = run_fabro("graph", "bad.fabro", "--format", "dot", cwd=tmp_path)
    assert proc.returncode == 1
    assert "error: bad.fabro:3:1: expected a node id after '->'" in proc.stderr
    no_traceback(proc)


def test_invalid_but_parseable_workflow_still_renders(tmp_path: Path) -> None:
    (tmp_path / "w.fabro").write_text("digraph W { a -> b }\n")
    proc = run_fabro("graph", "w.fabro", "--format", "dot", cwd=tmp_path)
    assert proc.returncode == 0
    assert '"a" -> "b"' in proc.stdout


def test_unwritable_output(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "g.dot"
    proc = run_fabro("graph", str(EXAMPLES / "hello.fabro"), "--format", "dot", "-o", str(target))
    assert proc.returncode == 1
    assert f"cannot write {target}" in proc.stderr
    no_traceback(proc)


# render_dot directly ---------------------------------------------------------------------


def test_quote_round_trips_through_graphviz_escapes() -> None:
    assert quote('say "hi"\\ now\nnext') == '"say \\"hi\\"\\\\ now\\nnext"'


def test_render_dot_types_conditions_clusters_and_models() -> None:
    graph = parse(
        """digraph Demo {
            graph [goal="A \\"quoted\\" goal", model_stylesheet="* { model: gpt-5; }"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            subgraph cluster_x { label="Loop A" work [prompt="p"] }
            gate [shape=hexagon, label="OK?"]
            fan [shape=component] merge [shape=tripleoctagon]
            nap [shape=insulator, duration="30s"] odd [type="mystery"]
            start -> work -> gate
            gate -> exit [label="[A] Approve"]
            gate -> work [label="[R] Redo", condition="context.n < 3", loop_restart=true]
            gate -> nap [freeform=true, weight=10]
            nap -> fan -> merge -> odd -> exit
        }"""
    )
    out = render_dot(graph, direction="TB")
    assert 'rankdir="TB"' in out
    assert 'label="Demo\\nA \\"quoted\\" goal"' in out
    assert 'label="Loop A"' in out and "subgraph cluster_1 {" in out
    assert 'label="work\\nagent · gpt-5"' in out
    assert '"gate" [shape="hexagon"' in out
    assert 'label="fan\\nfan-out"' in out and 'label="merge\\nfan-in"' in out
    assert 'label="nap\\nwait · 30s"' in out
    assert '"odd" [shape="box", style="filled,dashed"' in out
    assert 'label="[R] Redo\\n[context.n < 3]\\n(restart)"' in out
    assert 'style="dashed"' in out
    assert 'label="(free text)", penwidth="3.0"' in out


@needs_dot
def test_every_example_renders_through_graphviz() -> None:
    examples = sorted(EXAMPLES.glob("*.fabro"))
    assert examples, f"no examples in {EXAMPLES}"
    for path in examples:
        dot_source = render_dot(parse(path.read_text(), path))
        proc = subprocess.run(
            ["dot", "-Tsvg"], input=dot_source.encode(), capture_output=True, check=False
        )
        assert proc.returncode == 0, (path, proc.stderr)
        assert b"Warning" not in proc.stderr, (path, proc.stderr)
