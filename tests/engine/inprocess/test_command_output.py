"""Where command stages put their output while they run: one pair of files per walk,
which its command stages take turns with, and the stage's own directory only for a
log too large to keep in memory until the checkpoint streams it into git."""

from __future__ import annotations

from pathlib import Path

from helpers import meta_bytes

from engine.inprocess.harness import walk

BIG = 1_100_000  # over the 1 MB of a stream the stage keeps in memory


def _meta(worktree: Path, path: str) -> bytes:
    return meta_bytes(worktree, "RUN", path)  # the harness's run


def test_a_walks_command_stages_take_turns_with_one_pair_of_files(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            a     [shape=parallelogram, script="echo A; stat -Lc %i /dev/stdout"]
            b     [shape=parallelogram, script="echo B; stat -Lc %i /dev/stdout"]
            c     [shape=parallelogram, script="echo C; stat -Lc %i /dev/stdout"]
            start -> a -> b -> c -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    scratch = tmp_path / "scratch"
    outputs = [_meta(walked.worktree, f"nodes/{n}/stdout.log").decode() for n in "abc"]
    # Each stage's own output is on the meta ref, though they shared one file.
    assert [out.split()[0] for out in outputs] == ["A", "B", "C"]
    inodes = {out.split()[1] for out in outputs}
    assert inodes == {str((scratch / "output" / "stdout.log").stat().st_ino)}
    assert (scratch / "output" / "stdout.log").read_text().startswith("C\n")
    # No stage wrote a file of its own, so none has a directory in scratch.
    assert not (scratch / "nodes").exists()


def test_large_logs_of_a_child_workflow_are_each_kept_whole(tmp_path: Path) -> None:
    """A child's stages are recorded with its parent's stage, after the child's next
    command has written over the walk's output file: a log kept by its path has to
    have left that file first."""
    child = (
        "digraph C { s [shape=Mdiamond]; e [shape=Msquare]; "
        f"x [shape=parallelogram, language=python, script=\\\"print('x' * {BIG})\\\"]; "
        f"y [shape=parallelogram, language=python, script=\\\"print('y' * {BIG})\\\"]; "
        "s -> x -> y -> e }"
    )
    walked = walk(
        f"""
        digraph T {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, stack.child_dot_source="{child}"]
            start -> sub -> exit
        }}
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    for name in "xy":
        log = _meta(walked.worktree, f"nodes/sub/nodes/{name}/stdout.log")
        assert log == name.encode() * BIG + b"\n", name


def test_parallel_branches_stream_their_commands_to_files_of_their_own(tmp_path: Path) -> None:
    walked = walk(
        f"""
        digraph T {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            fan   [shape=component]
            p     [shape=parallelogram, language=python, script="print('p' * {BIG})"]
            q     [shape=parallelogram, language=python, script="print('q' * {BIG})"]
            join  [shape=tripleoctagon]
            start -> fan
            fan -> p
            fan -> q
            p -> join
            q -> join
            join -> exit
        }}
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    for name in "pq":
        log = _meta(walked.worktree, f"nodes/{name}/stdout.log")
        assert log == name.encode() * BIG + b"\n", name
