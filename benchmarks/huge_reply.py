"""A 250 MB model reply: the run's peak memory, and the reply stored once, next to git.

One `git fabro run` of a prompt stage, and one of an agent stage (`--stage` picks one),
whose model (the tests' local wire-format server,
speaking the Anthropic Messages API) replies with `--mb` megabytes of text in 64 KB
deltas, made as they are sent. Started from a wrapper that reports the peak RSS of the
process tree (`getrusage(RUSAGE_CHILDREN)`: the largest of `git fabro` and its git
children). Then it checks that the reply is one blob in the repository (the blob of its
bytes, named by both `nodes/plan/response.md` and the offloaded value
`artifacts/plan/response.plan.md`), and compares with `git hash-object -w` of a file of
the same bytes, whose own peak RSS and time are measured the same way in the same run.
Targets: peak RSS under 200 MB, one blob.

    python benchmarks/huge_reply.py [--mb 250] [--dir /tmp] [--stage prompt|agent|both]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from big_output import git, measured  # noqa: E402
from installed import environ_with_fabro  # noqa: E402
from llm_server import LlmServer, LongText, Reply, provider_env  # noqa: E402

UNIT = "streamed-reply-line-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJ\n"
WORKFLOW = """digraph P {
  start [shape=Mdiamond]
  exit [shape=Msquare]
  plan [shape=SHAPE, prompt="Write it all", model="claude-sonnet-4-6"]
  start -> plan -> exit
}
"""
# The prompt stage's shape, and the agent stage's.
SHAPES = {"prompt": "tab", "agent": "box"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=250)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--stage", choices=[*SHAPES, "both"], default="both")
    args = parser.parse_args()
    for stage in SHAPES if args.stage == "both" else [args.stage]:
        measure(stage, args.mb, args.dir)


def measure(stage: str, mb: int, directory: str | None) -> None:
    text = LongText(UNIT, mb * 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="fabro-huge-reply-", dir=directory))
    server = LlmServer().start()
    try:
        env = environ_with_fabro()
        env["FABRO_HOME"] = str(root / "fabro-home")
        env.update(provider_env(server))
        repo = root / "repo"
        git(root, "init", "-q", "-b", "main", str(repo))
        (repo / "wf.fabro").write_text(WORKFLOW.replace("SHAPE", SHAPES[stage]))
        git(repo, "add", "wf.fabro")
        git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "wf")

        server.script(Reply(text=text))
        wall, rss, out, _ = measured(["git", "fabro", "run", "wf.fabro", "--json", "-q"], repo, env)
        run_id = json.loads(out.strip().splitlines()[-1])["run_id"]

        digest = hashlib.sha1(b"blob %d\0" % text.size)
        value = root / "value.txt"
        with value.open("wb") as fh:
            for chunk in text.chunks():
                digest.update(chunk)
                fh.write(chunk)
        listing = git(repo, "cat-file", "--batch-all-objects", "--batch-check")
        big = [
            line.split()[0] for line in listing.splitlines() if int(line.split()[2]) >= text.size
        ]
        meta = f"refs/fabro/meta/{run_id}"
        named = {
            path: git(repo, "rev-parse", f"{meta}:{path}").strip()
            for path in ("nodes/plan/response.md", "artifacts/plan/response.plan.md")
        }

        plain = root / "plain.git"
        git(root, "init", "-q", "--bare", str(plain))
        git_wall, git_rss, _, _ = measured(
            ["git", "--git-dir", str(plain), "hash-object", "-w", str(value)], root, env
        )
        once = big == [digest.hexdigest()] and set(named.values()) == set(big)
        print(f"{stage} stage")
        print(f"reply           {mb} MB in {text.piece // 1024} KB deltas")
        print(
            f"stored          {len(big)} blob(s) of the reply's size or more"
            f" ({'once, the bytes of the reply' if once else 'NOT once'});"
            f" response.md and the offloaded value: {'one blob' if once else named}"
        )
        print(
            f"git fabro run   peak RSS {rss} MB ({'met' if rss < 200 else 'NOT met'}: target"
            f" 200 MB), {wall:.1f} s"
        )
        print(
            f"git hash-object -w of the same bytes: peak RSS {git_rss} MB, {git_wall:.1f} s;"
            f" ratio {rss / max(git_rss, 1):.2f}x in memory, {wall / git_wall:.1f}x in time"
        )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
