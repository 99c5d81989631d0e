"""Live replication: a run with a push remote pushes its refs after every checkpoint.

A teammate follows it with `fetch` and `logs`, and when the first machine dies (kill -9)
takes it over with `resume` in a clone of the remote. A remote that refuses is a
warning, never a failed run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import (
    assert_fsck_clean,
    bare_remote,
    git,
    run_events,
    run_fabro,
    start_fabro,
    wait_until,
    write_workflow,
)

# `hold` waits (inside the run) until the remote holds the checkpoint after `one` (its
# meta snapshot and its run-branch commit: one push updates the two refs one after the
# other, so a reader can see the first before the second), then
# says so with $HOME/holding and waits for $HOME/go: the test looks at the remote while
# the run is still in flight, with no sleeps and no timing luck.
WORKFLOW = """\
digraph Live {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one   [shape=parallelogram, script="echo one > one.txt"]
    hold  [shape=parallelogram, script="until git --git-dir={remote} log --format=%s refs/fabro/meta/$FABRO_RUN_ID 2>/dev/null | grep -q 'checkpoint one@1' && git --git-dir={remote} cat-file -e refs/heads/fabro/run/$FABRO_RUN_ID:one.txt 2>/dev/null; do sleep 0.05; done; touch \\"$HOME/holding\\"; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.05; done"]
    two   [shape=parallelogram, script="echo two > two.txt"]
    start -> one -> hold -> two -> exit
}}
"""


def _remote(tmp_path: Path, repo: Path) -> Path:
    bare = bare_remote(tmp_path, "remote.git", origin_of=repo)
    return bare


def _remote_refs(bare: Path) -> dict[str, str]:
    out = git(bare, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(line.split() for line in out.splitlines())


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    wait_until(path.exists, process=proc, limit=120, what=path.name)


def test_a_teammate_follows_the_run_and_takes_it_over(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    bare = _remote(tmp_path, repo)
    write_workflow(repo, WORKFLOW.format(remote=bare))
    git(repo, "push", "-q", "origin", "HEAD:refs/heads/main")
    first = start_fabro(
        ["run", "wf.fabro", "--push", "origin"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(hermetic_env / "holding", first)
        # In flight at `hold`: the remote has the run as of the checkpoint after `one`.
        (meta,) = [ref for ref in _remote_refs(bare) if ref.startswith("refs/fabro/meta/")]
        run_id = meta.rsplit("/", 1)[1]
        assert f"refs/heads/fabro/run/{run_id}" in _remote_refs(bare)
        assert "one.txt" in git(bare, "ls-tree", "--name-only", f"fabro/run/{run_id}")

        # A teammate watches it from a clone.
        mate = tmp_path / "mate"
        git(tmp_path, "clone", "-q", str(bare), str(mate))
        fetched = run_fabro("fetch", cwd=mate)
        assert fetched.returncode == 0, fetched.stderr
        assert "1 run new" in fetched.stderr
        logs = run_fabro("logs", run_id, "--pretty", cwd=mate)
        assert logs.returncode == 0, logs.stderr
        completed = [
            e["node_id"] for e in run_events(run_id, mate) if e["event"] == "stage.completed"
        ]
        assert "one" in completed and "two" not in completed

        # The first machine dies mid-stage.
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        (hermetic_env / "go").write_text("")
        if first.poll() is None:
            first.kill()
        first.communicate()

    # Another teammate, who never fetched, takes the run over from the remote.
    taker = tmp_path / "taker"
    git(tmp_path, "clone", "-q", str(bare), str(taker))
    resumed = run_fabro("resume", run_id, cwd=taker)
    assert resumed.returncode == 0, resumed.stderr
    assert git(taker, "show", f"fabro/run/{run_id}:two.txt").strip() == "two"
    # resume found the run on the remote and fetched it: that is in the run's log.
    events = run_events(run_id, taker)
    (fetch,) = [e for e in events if e["event"] == "git.fetch"]
    assert fetch["properties"] == {"branch": f"fabro/run/{run_id}", "success": True}
    # The resumed run keeps replicating (the push remote is in its recorded config):
    # the remote holds the finished run, and the watcher sees it end.
    remote_meta = _remote_refs(bare)[meta]
    assert remote_meta == git(taker, "rev-parse", meta).strip()
    assert "Fabro-Status: succeeded" in git(bare, "log", "-1", "--format=%B", meta)
    again = run_fabro("fetch", cwd=mate)
    assert again.returncode == 0 and "1 run updated" in again.stderr, again.stderr
    ps = run_fabro("ps", "--json", cwd=mate)
    assert json.loads(ps.stdout.splitlines()[0])["status"] == "succeeded"
    assert_fsck_clean(bare)


def test_a_remote_that_refuses_is_a_warning_and_the_run_succeeds(
    repo: Path, tmp_path: Path
) -> None:
    write_workflow(repo, "digraph B { start [shape=Mdiamond] exit [shape=Msquare] start -> exit }")
    missing = tmp_path / "no-such-remote.git"
    proc = run_fabro("run", "wf.fabro", "--push", str(missing), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    assert "could not push the run" in proc.stderr
    events = run_events(run_id, repo)
    pushes = [e["properties"]["success"] for e in events if e["event"] == "git.push"]
    assert pushes and not any(pushes)
    notices = [
        e for e in events if e["event"] == "run.notice" and e["properties"]["code"] == "push_failed"
    ]
    assert len(notices) == 1, notices
    notice = notices[0]
    assert notice["properties"]["level"] == "warn"
    # The final push is awaited after the run completes (its notice, when it is the
    # first push to fail, comes after it).
    names = [e["event"] for e in events]
    assert "run.completed" in names
    last_push = len(names) - 1 - names[::-1].index("git.push")
    assert last_push > names.index("run.completed")
    assert set(names[last_push + 1 :]) <= {"run.notice"}


def test_push_remote_from_the_run_config(repo: Path, tmp_path: Path) -> None:
    bare = _remote(tmp_path, repo)
    write_workflow(repo, "digraph C { start [shape=Mdiamond] exit [shape=Msquare] start -> exit }")
    (repo / "run.toml").write_text(
        '[workflow]\ngraph = "wf.fabro"\n\n[run.git]\npush_remote = "origin"\n'
    )
    git(repo, "add", "run.toml")
    git(repo, "commit", "-q", "-m", "run config")
    proc = run_fabro("run", "run.toml", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    assert _remote_refs(bare)[meta] == git(repo, "rev-parse", meta).strip()
    pushes = [e for e in run_events(run_id, repo) if e["event"] == "git.push"]
    assert pushes and all(e["properties"]["success"] for e in pushes)

    (repo / "bad.toml").write_text('[workflow]\ngraph = "wf.fabro"\n\n[run.git]\npush_remote = 3\n')
    bad = run_fabro("run", "bad.toml", cwd=repo)
    assert bad.returncode == 1
    assert "bad.toml" in bad.stderr and "run.git.push_remote" in bad.stderr
    flag = run_fabro("run", "wf.fabro", "--push", "--force", cwd=repo)
    assert flag.returncode == 1 and "cannot name a git remote" in flag.stderr


FAN_OUT = """
digraph Fan {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a     [shape=parallelogram, script="echo a > a.txt"]
    b     [shape=parallelogram, script="echo b > b.txt"]
    join  [shape=tripleoctagon]
    start -> fan
    fan -> a
    fan -> b
    a -> join
    b -> join
    join -> exit
}
"""


def test_parallel_refs_are_replicated_too(repo: Path, tmp_path: Path) -> None:
    bare = _remote(tmp_path, repo)
    write_workflow(repo, FAN_OUT)
    proc = run_fabro("run", "wf.fabro", "--push", "origin", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    local = {
        ref: sha
        for ref, sha in (
            line.split()
            for line in git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
        )
        if run_id in ref and not ref.startswith("refs/remotes/")
    }
    assert any(ref.startswith(f"refs/fabro/parallel/{run_id}/") for ref in local), local
    remote = {ref: sha for ref, sha in _remote_refs(bare).items() if run_id in ref}
    assert remote == local


# A stage makes two refs of its own run's: `x`, and one whose name is `x`, a line
# separator (U+2028, which a ref name may hold) and the name of a branch the user never
# pushed. Cut at that separator, the listing of the run's refs would name the branch.
SMUGGLE = """\
digraph Smuggle {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="p=refs/fabro/parallel/$FABRO_RUN_ID/x; git update-ref $p HEAD && git update-ref \\"$p$(printf '\\342\\200\\250')refs/heads/private\\" HEAD"]
    start -> make -> exit
}
"""


def test_a_ref_name_that_holds_a_line_separator_pushes_nothing_else(
    repo: Path, tmp_path: Path
) -> None:
    bare = _remote(tmp_path, repo)
    git(repo, "branch", "private")  # the user's, never pushed
    write_workflow(repo, SMUGGLE)
    proc = run_fabro("run", "wf.fabro", "--push", "origin", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    assert "could not push" not in proc.stderr, proc.stderr
    # The run's refs reached the remote by their whole names, and nothing else did.
    made = git(repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}/")
    pushed = git(bare, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}/")
    assert "\u2028" in made and pushed == made
    assert "refs/heads/private" not in git(bare, "for-each-ref", "--format=%(refname)").split("\n")


def test_a_slow_remote_does_not_hold_the_stages_and_pushes_coalesce(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """The remote takes no push until the last stage has run: the stages go on meanwhile,
    the checkpoints' asks pile up into one push, and the end pushes the final state."""
    bare = _remote(tmp_path, repo)
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(
        '#!/bin/sh\nwhile [ ! -e "$HOME/release" ]; do sleep 0.05; done\ncat >/dev/null\n'
    )
    hook.chmod(0o755)
    stages = "".join(
        f'    s{i} [shape=parallelogram, script="echo {i} > s{i}.txt"]\n' for i in range(4)
    )
    write_workflow(
        repo,
        "digraph Slow {\n    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        + stages
        + '    last [shape=parallelogram, script="touch \\"$HOME/release\\""]\n'
        + "    start -> s0 -> s1 -> s2 -> s3 -> last -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--push", "origin", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    events = run_events(run_id, repo)
    checkpoints = [e for e in events if e["event"] == "checkpoint.completed"]
    pushes = [e["properties"]["success"] for e in events if e["event"] == "git.push"]
    assert len(checkpoints) == 7
    # Eight asks (the start and seven checkpoints), but at most four pushes: the first,
    # blocked until `last`; the asks of start..last in one; the exit's; the final push.
    # (A push still in flight when the run ends is overtaken by the final one, unreported.)
    assert 1 <= len(pushes) <= 4 and all(pushes), pushes
    meta = f"refs/fabro/meta/{run_id}"
    assert _remote_refs(bare)[meta] == git(repo, "rev-parse", meta).strip()


def test_resume_push_replicates_a_run_that_did_not(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    bare = _remote(tmp_path, repo)
    write_workflow(
        repo,
        "digraph R { start [shape=Mdiamond] exit [shape=Msquare]\n"
        '  check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]\n'
        "  start -> check -> exit }\n",
    )
    failed = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert failed.returncode == 1
    run_id = json.loads(failed.stdout.splitlines()[-1])["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    assert meta not in _remote_refs(bare)
    (hermetic_env / "ok").write_text("")
    resumed = run_fabro("resume", run_id, "--push", "origin", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert _remote_refs(bare)[meta] == git(repo, "rev-parse", meta).strip()
    assert "Fabro-Status: succeeded" in git(bare, "log", "-1", "--format=%B", meta)
