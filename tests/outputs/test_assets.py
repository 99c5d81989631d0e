"""Automatic asset capture, end to end: `git fabro run`, then read back from the meta ref
in a fresh clone that fetched the run (`git fabro artifact list|cp`, `git show`).

Each test names the sentence of the outputs spec ("Automatic asset capture") it shows.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from helpers import (
    fresh_clone,
    git,
    meta_bytes,
    meta_file,
    run_config_passing,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)
from llm_server import LlmServer, Reply, ToolUse

from fabro_git.config.locations import run_scratch_dir

CAPTURE = r"""
digraph Capture {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    test [shape=parallelogram, script="sh make-assets.sh"]
    start -> test -> exit
}
"""

# Writes every kind of asset, files that are not assets, and assets inside the caches
# the scan must not enter.
MAKE_ASSETS = """\
set -e
put() { mkdir -p "$(dirname "$1")"; printf '%s' "$2" > "$1"; }
put test-results/shot.png PNGDATA
printf 'more' >> test-results/edit.png
put playwright-report/index.html '<html>report</html>'
put cypress/videos/run.webm WEBMDATA
put cypress/screenshots/fail.png FAILPNG
put packages/web/junit-unit.xml '<testsuite/>'
put deep/a/b/login.trace.zip ZIPDATA
put cypress/fixtures/data.json '{}'
put reports/summary.xml '<x/>'
put junit.txt 'not xml'
put node_modules/pkg/junit.xml '<cached/>'
put node_modules/test-results/a.png CACHED
put .cache/ms-playwright/chromium/x.trace.zip CACHED
put .yarn/cache/junit-y.xml CACHED
ln -s /etc/hostname test-results/link.png
echo made
"""

EXPECTED = {
    "cypress/screenshots/fail.png": (b"FAILPNG", "image/png"),
    "cypress/videos/run.webm": (b"WEBMDATA", "video/webm"),
    "deep/a/b/login.trace.zip": (b"ZIPDATA", "application/zip"),
    "packages/web/junit-unit.xml": (b"<testsuite/>", "application/xml"),
    "playwright-report/index.html": (b"<html>report</html>", "text/html"),
    "test-results/edit.png": (b"old-pngmore", "image/png"),
    "test-results/shot.png": (b"PNGDATA", "image/png"),
}


def artifact_list(cwd: Path, env: dict[str, str], *args: str) -> list[dict]:
    proc = run_fabro("artifact", "list", *args, "--json", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["artifacts"]


def checked_events(repo: Path, run_id: str) -> list[dict]:
    """The run's events, each checked against the contract by `run_events`."""
    return run_events(run_id, repo)


def captured(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "asset.captured"]


def setup_repo(repo: Path) -> None:
    (repo / "make-assets.sh").write_text(MAKE_ASSETS)
    (repo / "test-results").mkdir()
    (repo / "test-results" / "edit.png").write_text("old-png")
    (repo / "test-results" / "old.png").write_text("unchanged")
    (repo / ".gitignore").write_text("playwright-report/\ncypress/videos/\nnode_modules/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "assets fixture")


def test_new_and_changed_assets_are_copied_with_a_manifest_and_one_event_each(
    repo: Path, tmp_path: Path
) -> None:
    """After each node executes a command, new or changed files in the known asset
    directories and matching the patterns anywhere are copied to
    assets/{node_slug}/retry_{n}/ with a manifest; caches are not scanned."""
    setup_repo(repo)
    write_workflow(repo, CAPTURE)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    manifest = json.loads(meta_file(repo, run_id, "assets/test/retry_1/manifest.json"))
    assert manifest == {
        "files_copied": len(EXPECTED),
        "total_bytes": sum(len(data) for data, _ in EXPECTED.values()),
        "files_skipped": 0,
        "download_errors": 0,
        "copied_paths": sorted(EXPECTED),
    }
    listed = git(repo, "ls-tree", "-r", "--name-only", f"refs/fabro/meta/{run_id}", "assets")
    assert sorted(listed.split()) == sorted(
        [f"assets/test/retry_1/{p}" for p in EXPECTED] + ["assets/test/retry_1/manifest.json"]
    )
    # The live copy in the run's scratch dir holds the same files.
    scratch = run_scratch_dir(repo / ".git", run_id) / "assets" / "test" / "retry_1"
    for path, (data, _) in EXPECTED.items():
        assert (scratch / path).read_bytes() == data
        assert meta_bytes(repo, run_id, f"assets/test/retry_1/{path}") == data
    assert json.loads((scratch / "manifest.json").read_bytes()) == manifest

    events = checked_events(repo, run_id)
    by_path = {e["properties"]["path"]: e for e in captured(events)}
    assert set(by_path) == set(EXPECTED)
    for path, (data, mime) in EXPECTED.items():
        event = by_path[path]
        assert event["node_id"] == "test" and event["stage_id"] == "test@1"
        assert event["properties"] == {
            "attempt": 1,
            "node_slug": "test",
            "path": path,
            "mime": mime,
            "content_md5": hashlib.md5(data).hexdigest(),
            "content_sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    # Captured within the stage: after it started, before it completed.
    names = [(e["event"], e.get("node_id")) for e in events]
    first = names.index(("asset.captured", "test"))
    assert names.index(("stage.started", "test")) < first < names.index(("stage.completed", "test"))

    # A fresh clone reads them back from git alone.
    clone, env = fresh_clone(repo, tmp_path)
    items = artifact_list(clone, env, run_id)
    assert [(i["kind"], i["stage"], i["retry"], i["name"], i["bytes"]) for i in items] == [
        ("asset", "test@1", 1, path, len(EXPECTED[path][0])) for path in sorted(EXPECTED)
    ]
    flat = tmp_path / "flat"
    copied = run_fabro("artifact", "cp", run_id, str(flat), cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    assert f"copied {len(EXPECTED)} files" in copied.stdout
    got = {p.relative_to(flat).as_posix(): p.read_bytes() for p in flat.rglob("*") if p.is_file()}
    assert got == {path: data for path, (data, _) in EXPECTED.items()}
    tree = tmp_path / "tree"
    copied = run_fabro("artifact", "cp", run_id, str(tree), "--tree", cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    assert json.loads((tree / "test" / "retry_1" / "manifest.json").read_text()) == manifest
    assert (tree / "test" / "retry_1" / "cypress" / "videos" / "run.webm").read_bytes() == (
        b"WEBMDATA"
    )
    one = tmp_path / "one"
    copied = run_fabro(
        "artifact",
        "cp",
        f"{run_id}:test/retry_1/test-results/shot.png",
        str(one),
        cwd=clone,
        env=env,
    )
    assert copied.returncode == 0, copied.stderr
    assert [p.name for p in one.rglob("*") if p.is_file()] == ["shot.png"]
    # `show` lists them with the command that copies each.
    shown = run_fabro("show", run_id, "test", cwd=clone, env=env)
    assert shown.returncode == 0, shown.stderr
    assert (
        f"git fabro artifact cp {run_id[:12]}:test/retry_1/test-results/shot.png ." in shown.stdout
    )
    assert "asset cypress/videos/run.webm (8 B, attempt 1)" in shown.stdout


def test_only_files_new_or_modified_since_the_command_started_are_collected(
    repo: Path, tmp_path: Path
) -> None:
    """Files that match the baseline fingerprint (same size and mtime) are skipped; a
    rewrite that keeps size and mtime is told apart by its content."""
    write_workflow(
        repo,
        r"""
        digraph Twice {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            first [shape=parallelogram, script="mkdir -p test-results && printf A > test-results/a.png && printf '<a/>' > junit.xml && printf K > test-results/keep.png"]
            second [shape=parallelogram, script="cp -p junit.xml ref && printf '<b/>' > junit.xml && touch -r ref junit.xml && cp -p test-results/a.png a.copy && cp -p a.copy test-results/a.png && printf B > test-results/b.png && touch test-results/keep.png"]
            quiet [shape=parallelogram, script="echo nothing"]
            start -> first -> second -> quiet -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    clone, _ = fresh_clone(repo, tmp_path)
    first = json.loads(meta_file(clone, run_id, "assets/first/retry_1/manifest.json"))
    assert first["copied_paths"] == ["junit.xml", "test-results/a.png", "test-results/keep.png"]
    second = json.loads(meta_file(clone, run_id, "assets/second/retry_1/manifest.json"))
    # junit.xml: same size and mtime, new content. keep.png: only its mtime moved.
    # a.png: rewritten with the same bytes, size and mtime: skipped.
    assert second["copied_paths"] == ["junit.xml", "test-results/b.png", "test-results/keep.png"]
    assert meta_file(clone, run_id, "assets/second/retry_1/junit.xml") == "<b/>"
    # A stage that wrote no asset leaves no asset directory.
    tree = git(clone, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}", "assets/")
    assert tree.split() == ["assets/first", "assets/second"]


def test_files_over_10_mb_are_skipped_and_the_collection_stops_past_50_mb(
    repo: Path, tmp_path: Path
) -> None:
    """Individual files over 10 MB and total collections over 50 MB are skipped."""
    write_workflow(
        repo,
        r"""
        digraph Big {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            big [shape=parallelogram, script="mkdir -p test-results && yes big | head -c 11000000 > big.trace.zip && for i in 1 2 3 4 5 6; do yes part$i | head -c 9500000 > test-results/part$i.bin; done"]
            start -> big -> exit
        }
        """,
    )
    (repo / ".gitignore").write_text("test-results/\n*.trace.zip\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    manifest = json.loads(meta_file(repo, run_id, "assets/big/retry_1/manifest.json"))
    assert manifest == {
        "files_copied": 5,
        "total_bytes": 5 * 9_500_000,
        "files_skipped": 2,
        "download_errors": 0,
        "copied_paths": [f"test-results/part{i}.bin" for i in range(1, 6)],
    }
    listed = git(repo, "ls-tree", "-r", "-l", f"refs/fabro/meta/{run_id}", "assets/big/retry_1")
    sizes = {line.split("\t")[1]: int(line.split()[3]) for line in listed.splitlines()}
    assert {p: s for p, s in sizes.items() if not p.endswith("manifest.json")} == {
        f"assets/big/retry_1/test-results/part{i}.bin": 9_500_000 for i in range(1, 6)
    }
    assert len(captured(run_events(run_id, repo))) == 5


def test_a_repeat_visit_has_its_own_node_slug(repo: Path, tmp_path: Path) -> None:
    """Assets are organised by node (a repeat visit is `<node>-<visit>`) and attempt."""
    write_workflow(
        repo,
        r"""
        digraph Loop {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            test [shape=parallelogram, script="mkdir -p test-results; if [ -f once ]; then printf 2 > test-results/second.png; else touch once; printf 1 > test-results/first.png; exit 1; fi"]
            start -> test
            test -> test [condition="outcome=fail"]
            test -> exit [condition="outcome=success"]
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    clone, env = fresh_clone(repo, tmp_path)
    items = artifact_list(clone, env, run_id)
    assert [(i["stage"], i["path"]) for i in items] == [
        ("test@1", "test/retry_1/test-results/first.png"),
        ("test@2", "test-2/retry_1/test-results/second.png"),
    ]
    only = artifact_list(clone, env, run_id, "--node", "test@2")
    assert [i["name"] for i in only] == ["test-results/second.png"]
    both = artifact_list(clone, env, run_id, "--node", "test")
    assert len(both) == 2
    slugs = {e["properties"]["node_slug"] for e in captured(run_events(run_id, repo))}
    assert slugs == {"test", "test-2"}


def test_each_attempt_of_an_agent_stage_keeps_its_own_retry_directory(
    repo: Path, tmp_path: Path, llm_server: LlmServer
) -> None:
    """Agent stages run commands too; each attempt (here the reply asks for a retry)
    keeps its assets in `retry_<n>`."""
    write_workflow(
        repo,
        """
        digraph Agent {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            work [shape=box, model="sonnet", max_retries=1, retry_policy="standard", permissions="full", prompt="Run the tests"]
            start -> work -> exit
        }
        """,
    )
    shot = "mkdir -p test-results && printf one > test-results/a.png"
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": shot}, id="s1"),)),
        Reply(text='Flaky, again please: {"outcome": "retry"}'),
        Reply(
            text="",
            tool_calls=(
                ToolUse("write_file", {"path": "test-results/b.png", "content": "two"}, id="w"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = checked_events(repo, run_id)
    assert [(e["properties"]["attempt"], e["properties"]["path"]) for e in captured(events)] == [
        (1, "test-results/a.png"),
        (2, "test-results/b.png"),
    ]
    clone, env = fresh_clone(repo, tmp_path)
    items = artifact_list(clone, env, run_id, "--retry", "2")
    assert [i["path"] for i in items] == ["work/retry_2/test-results/b.png"]
    dest = tmp_path / "out"
    copied = run_fabro("artifact", "cp", run_id, str(dest), "--tree", cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    assert (dest / "work" / "retry_1" / "test-results" / "a.png").read_text() == "one"
    assert (dest / "work" / "retry_2" / "test-results" / "b.png").read_text() == "two"
    assert not (dest / "work" / "retry_2" / "test-results" / "a.png").exists()


def test_a_fork_carries_the_assets_of_the_stages_it_keeps(repo: Path) -> None:
    write_workflow(
        repo,
        r"""
        digraph Fork {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            one [shape=parallelogram, script="mkdir -p test-results && printf 1 > test-results/one.png"]
            two [shape=parallelogram, script="printf 2 > junit-two.xml"]
            start -> one -> two -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    forked = run_fabro("fork", result["run_id"], "one", cwd=repo)
    assert forked.returncode == 0, forked.stderr
    items = artifact_list(repo, {}, forked.stdout.strip())
    assert [i["path"] for i in items] == ["one/retry_1/test-results/one.png"]


def test_a_secret_in_an_asset_never_reaches_git(repo: Path) -> None:
    token = "svc" + "Zt2Wm4Rk3Yq9" + "Xp7Lr2Vn"
    write_workflow(
        repo,
        r"""
        digraph Leak {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            test [shape=parallelogram, script="mkdir -p test-results && echo \"token=$MY_SERVICE_TOKEN\" > test-results/log.txt"]
            start -> test -> exit
        }
        """,
    )
    (repo / ".gitignore").write_text("test-results/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    proc = run_fabro(
        "run",
        run_config_passing(repo, "MY_SERVICE_TOKEN"),
        "--json",
        cwd=repo,
        env={"MY_SERVICE_TOKEN": token},
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    stored = meta_file(repo, run_id, "assets/test/retry_1/test-results/log.txt")
    assert stored == f"token=***{token[-4:]}\n"
    every_object = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=repo, capture_output=True
    ).stdout
    assert token.encode() not in every_object


def test_parallel_branches_capture_in_their_own_worktrees(repo: Path) -> None:
    write_workflow(
        repo,
        r"""
        digraph Fan {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            a [shape=parallelogram, script="mkdir -p test-results && printf A > test-results/shot.png"]
            b [shape=parallelogram, script="mkdir -p test-results && printf BB > test-results/shot.png"]
            join [shape=tripleoctagon]
            start -> fan
            fan -> a
            fan -> b
            a -> join
            b -> join
            join -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "assets/a/retry_1/test-results/shot.png") == "A"
    assert meta_file(repo, run_id, "assets/b/retry_1/test-results/shot.png") == "BB"
    events = captured(run_events(run_id, repo))
    assert sorted((e["node_id"], e["properties"]["bytes"]) for e in events) == [("a", 1), ("b", 2)]


def test_a_file_name_git_cannot_hold_is_skipped_not_fatal(repo: Path) -> None:
    (repo / ".gitignore").write_text("test-results/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    write_workflow(
        repo,
        r"""
        digraph Odd {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            test [shape=parallelogram, script="mkdir -p test-results && printf x > \"$(printf 'test-results/bad-\\377.png')\" && printf y > test-results/ok.png"]
            start -> test -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(meta_file(repo, result["run_id"], "assets/test/retry_1/manifest.json"))
    assert manifest["copied_paths"] == ["test-results/ok.png"]
    assert manifest["files_skipped"] == 1


INCLUDE = """\
digraph Shots {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    shoot [shape=parallelogram,
           script="mkdir -p screenshots/home docs && printf 'PNG1' > screenshots/home/a.png && printf 'notes' > docs/notes.txt && printf 'x' > report.html"]
    start -> shoot -> exit
}
"""


def test_run_artifacts_include_adds_the_runs_own_globs(repo: Path) -> None:
    """`[run.artifacts] include` globs count as asset paths too; other files do not."""
    write_workflow(repo, INCLUDE)
    (repo / "run.toml").write_text(
        '[workflow]\ngraph = "wf.fabro"\n\n[run.artifacts]\ninclude = ["screenshots/**", "*.html"]\n'
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    manifest = json.loads(meta_file(repo, run_id, "assets/shoot/retry_1/manifest.json"))
    assert manifest["copied_paths"] == ["report.html", "screenshots/home/a.png"]
    assert meta_bytes(repo, run_id, "assets/shoot/retry_1/screenshots/home/a.png") == b"PNG1"
    events = checked_events(repo, run_id)
    assert sorted(e["properties"]["path"] for e in captured(events)) == [
        "report.html",
        "screenshots/home/a.png",
    ]


def test_without_include_only_the_known_paths_are_captured(repo: Path) -> None:
    write_workflow(repo, INCLUDE)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    listed = git(repo, "ls-tree", "-r", "--name-only", f"refs/fabro/meta/{result['run_id']}")
    assert "assets/" not in listed
