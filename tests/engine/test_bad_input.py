"""Careless input is a user error (a message and exit 1), never a crash.

Node ids that refs and paths cannot carry, files that are not regular files or are far
too big, and a disk that fills up mid-run all end in a clear message through the real
`git fabro` command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import assert_fsck_clean, git, run_fabro, run_json, write_workflow

LONG_ID = "n" * 300
# The longest id allowed, visited twice and inside a fan-out, so its ref name
# (`<id>-<visit>/<n>`, plus git's `.lock`) and its scratch and meta directories are made.
MAX_ID = "m" * 100


def _workflow(node_id: str) -> str:
    return f"""\
digraph W {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    {node_id} [shape=parallelogram, script="true"]
    start -> {node_id} -> exit
}}
"""


def test_over_long_node_id_is_a_validation_error(repo: Path) -> None:
    write_workflow(repo, _workflow(LONG_ID))
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "wf.fabro:4:5: error: [node_id_valid]" in proc.stdout
    assert "300 characters" in proc.stdout
    run = run_fabro("run", "wf.fabro", cwd=repo)
    assert run.returncode == 1, run.stderr
    assert "wf.fabro:4:5: error: [node_id_valid]" in run.stderr
    assert "Traceback" not in run.stderr and "unexpected error" not in run.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


def test_quoted_node_id_that_no_ref_could_carry_is_refused(repo: Path) -> None:
    for bad in (
        "a/b",
        "x..y",
        "q@{1}",
        "lock.lock",
        "-lead",
        ".dot",
        "tab\\there",
        "back\\\\slash",
    ):
        write_workflow(repo, _workflow(f'"{bad}"'))
        proc = run_fabro("validate", "wf.fabro", cwd=repo)
        assert proc.returncode == 1, (bad, proc.stdout)
        assert "wf.fabro:4:5: error: [parse] invalid node id" in proc.stdout, (bad, proc.stdout)


def test_node_ids_differing_only_in_case_are_refused(repo: Path) -> None:
    write_workflow(
        repo,
        """\
digraph W {
    start  [shape=Mdiamond]
    exit   [shape=Msquare]
    Review [shape=parallelogram, script="true"]
    review [shape=parallelogram, script="true"]
    start -> Review -> review -> exit
}
""",
    )
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout
    assert (
        "wf.fabro:5:5: error: [node_id_valid] node id 'review' cannot be used: it differs "
        "from 'Review' (line 4) only in case"
    ) in proc.stdout
    assert proc.stdout.count("[node_id_valid]") == 1


def test_longest_allowed_node_id_runs_through_refs_and_paths(repo: Path) -> None:
    branch = "b" * 100
    write_workflow(
        repo,
        f"""\
digraph W {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    {MAX_ID} [shape=component]
    {branch} [shape=parallelogram, script="echo x >> b.txt"]
    other [shape=parallelogram, script="true"]
    join  [shape=tripleoctagon]
    check [shape=parallelogram, script="test -f loop.done || {{ touch loop.done; exit 1; }}"]
    start -> {MAX_ID}
    {MAX_ID} -> {branch} -> join
    {MAX_ID} -> other -> join
    join -> check
    check -> {MAX_ID} [condition="outcome=failed"]
    check -> exit [condition="outcome=succeeded"]
}}
""",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded", result
    run_id = result["run_id"]
    refs = git(repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}/")
    assert f"refs/fabro/parallel/{run_id}/{MAX_ID}-2/0" in refs.split()
    tree = git(repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}:nodes")
    assert f"{MAX_ID}-2" in tree.split()


# -- input files that are not small regular files ---------------------------------------

OK_WORKFLOW = """\
digraph Ok {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    start -> exit
}
"""


def _special_file(kind: str, directory: Path) -> tuple[Path, str]:
    """A path of the given kind and the reason the reader should give for it."""
    if kind == "dev-zero":
        return Path("/dev/zero"), "is a character device, not a regular file"
    if kind == "fifo":
        path = directory / "pipe.fabro"
        os.mkfifo(path)
        return path, "is a named pipe (FIFO), not a regular file"
    path = directory / "huge.fabro"
    with path.open("wb") as out:
        out.truncate(11 * 1024 * 1024)
    return path, "is 11.0 MB; input files are limited to 10.0 MB"


KINDS = ["dev-zero", "fifo", "11MB"]


@pytest.mark.parametrize("kind", KINDS)
def test_validate_refuses_a_file_that_is_not_a_small_regular_file(
    repo: Path, tmp_path: Path, kind: str
) -> None:
    path, reason = _special_file(kind, tmp_path)
    # The timeout turns a hang on the FIFO into a failure instead of a stuck suite.
    proc = run_fabro("validate", str(path), cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{path}: error: [parse] {reason}" in proc.stdout
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_run_refuses_a_workflow_that_is_not_a_small_regular_file(
    repo: Path, tmp_path: Path, kind: str
) -> None:
    path, reason = _special_file(kind, tmp_path)
    proc = run_fabro("run", str(path), cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: {path}: {reason}" in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


@pytest.mark.parametrize("kind", KINDS)
def test_run_refuses_a_goal_file_that_is_not_a_small_regular_file(
    repo: Path, tmp_path: Path, kind: str
) -> None:
    write_workflow(repo, OK_WORKFLOW)
    path, reason = _special_file(kind, tmp_path)
    proc = run_fabro("run", "wf.fabro", "--goal-file", str(path), cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: --goal-file {path}: {reason}" in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


@pytest.mark.parametrize("kind", KINDS)
def test_run_config_naming_a_special_graph_or_being_one_is_refused(
    repo: Path, tmp_path: Path, kind: str
) -> None:
    path, reason = _special_file(kind, tmp_path)
    config = repo / "run.toml"
    config.write_text(f'_version = 1\n[workflow]\ngraph = "{path}"\n')
    proc = run_fabro("run", "run.toml", cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: {path}: {reason}" in proc.stderr
    if kind == "dev-zero":
        return
    toml_path = tmp_path / "config.toml"
    path.rename(toml_path)
    proc = run_fabro("run", str(toml_path), cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: run config {toml_path}: {reason}" in proc.stderr


# -- a disk that fills up mid-run -----------------------------------------------------------

# `fill` leaves the small filesystem under FABRO_HOME (scratch: the worktree, the event
# tail) full, and ignores its own failure to write; the engine's next write then fails.
FILL_WORKFLOW = """\
digraph Fill {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    first [shape=parallelogram, script="echo one > one.txt"]
    fill  [shape=parallelogram, script="head -c 2000000 /dev/zero > big.bin || true"]
    last  [shape=parallelogram, script="echo done > last.txt"]
    start -> first -> fill -> last -> exit
}
"""


def _private_mount_namespace() -> list[str]:
    """An `unshare` prefix giving the command its own mount table, or skip.

    A user namespace lets an unprivileged user mount a tmpfs that only the command
    sees; as root a mount namespace alone will do.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs for the command")
    for prefix in ([unshare, "--user", "--map-root-user", "--mount"], [unshare, "--mount"]):
        probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot make a private mount namespace here (no user namespaces, not root)")


def test_full_disk_stops_the_run_cleanly_and_resume_finishes_it(repo: Path) -> None:
    prefix = _private_mount_namespace()
    write_workflow(repo, FILL_WORKFLOW)
    home = Path(os.environ["FABRO_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    # The tmpfs lives as long as the command: once it exits the space is free again, as
    # after a user cleans up, and the scratch dir is gone, which git alone must survive.
    script = 'mount -t tmpfs -o size=256k tmpfs "$FABRO_HOME" && exec git fabro run wf.fabro'
    proc = subprocess.run(
        [*prefix, "sh", "-c", script],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "error: disk full: No space left on device" in proc.stderr
    assert "Nothing recorded is lost" in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    (run_id,) = [
        ref.rsplit("/", 1)[1]
        for ref in git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta/").split()
    ]
    assert f"git fabro resume {run_id}" in proc.stderr
    # The run stopped at a checkpoint after `first` (where exactly depends on how much
    # of the last tmpfs page the event tail still had), before `last`.
    log = git(repo, "log", "--format=%s", f"fabro/run/{run_id}")
    assert f"fabro({run_id}): first (succeeded)" in log
    assert "last" not in log

    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    info = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)
    assert info["status"] == "succeeded", info
    assert git(repo, "show", f"fabro/run/{run_id}:last.txt") == "done\n"
    assert_fsck_clean(repo)


def test_git_running_out_of_space_in_the_store_is_disk_full(tmp_path: Path) -> None:
    """The repository itself on a small filesystem: the pack that takes the stage's
    output fails to write, and its "No space left on device" becomes the same message,
    naming where it was written."""
    prefix = _private_mount_namespace()
    mount = tmp_path / "small"
    mount.mkdir()
    (tmp_path / "wf.fabro").write_text(
        FILL_WORKFLOW.replace(
            "head -c 2000000 /dev/zero > big.bin || true", "head -c 1000000 /dev/urandom > big.bin"
        )
    )
    # Everything in the repository is gone with the namespace; only the messages count.
    script = (
        f'mount -t tmpfs -o size=512k tmpfs "{mount}" && cd "{mount}" '
        f'&& git init -q -b main repo && cd repo && cp "{tmp_path}/wf.fabro" . '
        "&& git add wf.fabro && git commit -q -m wf && exec git fabro run wf.fabro"
    )
    proc = subprocess.run(
        [*prefix, "sh", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "error: disk full: cannot write a pack to " in proc.stderr
    assert "/.git/objects/pack: No space left on device" in proc.stderr
    assert "No space left on device" in proc.stderr
    assert "Nothing recorded is lost" in proc.stderr and "git fabro resume" in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr


# -- negative durations --------------------------------------------------------------------

NEGATIVE_DURATIONS = """\
digraph Neg {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    a     [shape=parallelogram, script="true", timeout="-5s"]
    w     [shape=insulator, duration="-1m"]
    h     [shape=hexagon, human.timeout="-3s"]
    start -> a -> w -> h -> exit
}
"""


def test_a_negative_duration_is_refused_before_a_run_exists(repo: Path) -> None:
    write_workflow(repo, NEGATIVE_DURATIONS)
    expected = [
        "wf.fabro:4:56: error: [attribute_value] node 'a': timeout='-5s' is not a duration "
        "of zero or more",
        "wf.fabro:5:38: error: [attribute_value] node 'w': duration='-1m' is not a duration",
        "wf.fabro:6:41: error: [attribute_value] node 'h': human.timeout='-3s' is not a duration",
    ]
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for line in expected:
        assert line in proc.stdout, proc.stdout
    run = run_fabro("run", "wf.fabro", cwd=repo)
    assert run.returncode == 1, run.stderr
    for line in expected:
        assert line in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "unexpected error" not in run.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


def test_a_negative_duration_in_a_run_config_names_its_line(repo: Path) -> None:
    write_workflow(repo, OK_WORKFLOW)
    config = repo / "run.toml"
    config.write_text(
        f'_version = 1\n[workflow]\ngraph = "{repo / "wf.fabro"}"\n'
        '[run.agent]\nrequest_retry_delay = "-2s"\n'
    )
    proc = run_fabro("run", "run.toml", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "run.toml:5: run.agent.request_retry_delay: expected a duration" in proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


def test_a_run_recorded_with_a_negative_timeout_is_refused_on_resume(repo: Path) -> None:
    """A run an earlier version started with `timeout="-5s"` (it crashed in that stage):
    resume says what is wrong and how to go on, on every try, instead of crashing."""
    write_workflow(
        repo,
        "digraph Neg {\n    start [shape=Mdiamond]\n    exit  [shape=Msquare]\n"
        '    a     [shape=parallelogram, script="exit 1", timeout="5s"]\n'
        "    start -> a -> exit\n}\n",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = str(result["run_id"])
    ref = f"refs/fabro/meta/{run_id}"
    recorded = git(repo, "show", f"{ref}:graph.fabro")
    assert 'timeout="5s"' in recorded
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=repo,
        input=recorded.replace('timeout="5s"', 'timeout="-5s"'),
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    listing = [
        f"100644 blob {blob}\tgraph.fabro" if line.endswith("\tgraph.fabro") else line
        for line in git(repo, "ls-tree", ref).splitlines()
    ]
    tree = subprocess.run(
        ["git", "mktree"], cwd=repo, input="\n".join(listing) + "\n", text=True,
        capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    tip = git(repo, "rev-parse", ref).strip()
    commit = subprocess.run(
        ["git", "commit-tree", tree, "-p", tip, "-F", "-"],
        cwd=repo,
        input=git(repo, "log", "-1", "--format=%B", tip),
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    git(repo, "update-ref", ref, commit, tip)
    # The graph changed since the run started here: trusted again, as it now stands.
    trusted = run_fabro("trust", "--run", run_id, "--yes", cwd=repo)
    assert trusted.returncode == 0, trusted.stderr

    for _ in range(2):
        resumed = run_fabro("resume", run_id, cwd=repo)
        assert resumed.returncode == 1, resumed.stderr
        assert (
            f"error: {repo / 'wf.fabro'}:4:58: node 'a': timeout='-5s' is not a duration"
            in resumed.stderr
        ), resumed.stderr
        assert f"`git fabro resume {run_id} --workflow FILE`" in resumed.stderr
        assert "Traceback" not in resumed.stderr and "unexpected error" not in resumed.stderr


# -- a git dir or a FABRO_HOME that cannot be written -----------------------------------------

ECHO_WORKFLOW = """\
digraph Echo {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    say   [shape=parallelogram, script="echo hi > said.txt"]
    start -> say -> exit
}
"""


def _with_git_dir_read_only(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`git fabro ARGS` in `repo` with its `.git` mounted read-only, for this command
    alone (a read-only mount refuses root too)."""
    prefix = _private_mount_namespace()
    script = 'mount --bind .git .git && mount -o remount,ro,bind .git && exec git fabro "$@"'
    return subprocess.run(
        [*prefix, "sh", "-c", script, "sh", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _no_crash(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert "This is a bug" not in proc.stderr


def test_a_read_only_git_dir_is_named_by_run_and_rm(repo: Path) -> None:
    write_workflow(repo, ECHO_WORKFLOW)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = str(result["run_id"])
    (repo / "fails.fabro").write_text(ECHO_WORKFLOW.replace("echo hi > said.txt", "exit 1"))
    proc, failed = run_json("run", str(repo / "fails.fabro"), cwd=repo)
    assert failed["status"] == "failed", proc.stderr
    locks = repo / ".git" / "fabro" / "locks"
    for args in (["run", "wf.fabro"], ["rm", "-y", run_id], ["resume", "-d", failed["run_id"]]):
        refused = _with_git_dir_read_only(repo, *args)
        _no_crash(refused)
        assert f"error: cannot write {locks}/" in refused.stderr, refused.stderr
        assert ": Read-only file system" in refused.stderr
        assert f"hint: make {locks} writable" in refused.stderr
    # Nothing was lost: the runs are there as they were.
    metas = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta/").split()
    assert sorted(metas) == sorted(f"refs/fabro/meta/{r}" for r in (run_id, failed["run_id"]))
    assert run_fabro("rm", "-y", run_id, cwd=repo).returncode == 0


def test_a_fork_git_refuses_says_why(repo: Path) -> None:
    write_workflow(repo, ECHO_WORKFLOW)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = str(result["run_id"])
    refused = _with_git_dir_read_only(repo, "fork", run_id)
    _no_crash(refused)
    assert "could not write the first snapshot of run " in refused.stderr
    # git's reason, not a pointer to an error nobody printed.
    assert f"{repo}/.git/objects" in refused.stderr and "Read-only file system" in refused.stderr
    assert "see the error above" not in refused.stderr
    assert f"run {run_id} is unchanged" in refused.stderr
    assert len(git(repo, "for-each-ref", "refs/fabro/meta/").splitlines()) == 1


def test_a_fabro_home_that_is_no_directory_is_named(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, ECHO_WORKFLOW)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    run_id = str(result["run_id"])
    afile = tmp_path / "a-file"
    afile.write_text("")
    home = afile / "fabro"
    proc = run_fabro("run", "wf.fabro", cwd=repo, env={"FABRO_HOME": str(home)})
    _no_crash(proc)
    assert f"error: FABRO_HOME ({home}) is not usable: cannot write {home}: Not a directory" in (
        proc.stderr
    ), proc.stderr
    assert "hint: set FABRO_HOME to a directory you can write to" in proc.stderr
    assert len(git(repo, "for-each-ref", "refs/fabro/meta/").splitlines()) == 1
    # What git holds reads as ever: there is no live tail there, that is all.
    for args in (["logs", run_id], ["events"]):
        read = run_fabro(*args, cwd=repo, env={"FABRO_HOME": str(home)})
        assert read.returncode == 0, read.stderr
        assert '"event":"run.completed"' in read.stdout


def test_a_read_only_fabro_home_is_named(repo: Path, tmp_path: Path) -> None:
    prefix = _private_mount_namespace()
    write_workflow(repo, ECHO_WORKFLOW)
    home = tmp_path / "home"
    home.mkdir()
    script = 'mount -t tmpfs -o size=64k,ro tmpfs "$FABRO_HOME" && exec git fabro run wf.fabro'
    proc = subprocess.run(
        [*prefix, "sh", "-c", script],
        cwd=repo,
        env={**os.environ, "FABRO_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    _no_crash(proc)
    assert (
        f"error: FABRO_HOME ({home}) is not usable: cannot write {home}/runs: "
        "Read-only file system" in proc.stderr
    ), proc.stderr
    assert "hint: set FABRO_HOME to a directory you can write to" in proc.stderr
