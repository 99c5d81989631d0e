"""A 50 MB value offloaded: what the checkpoint after its stage costs, next to git.

Two runs, one stage each, whose value is offloaded to the artifact store:

  prompt   a prompt stage whose model replies with `--mb` megabytes of text (the local
           wire-format server of the tests, speaking the Anthropic Messages API), so
           `response.<node>` is offloaded, and the reply is also the stage's
           `response.md` and part of its events
  command  a command stage printing `--mb` megabytes (its whole output is stored; the
           context's bounded excerpt is offloaded)

For each, the checkpoint time is read off the run's own events: from the end of the
stage's handler (stage.started + duration_ms) to its checkpoint.completed, which covers
offloading, the events, the meta snapshot and the run-branch commit. The baseline is
`git hash-object -w` of a file of the same size, as a whole process, in the same run.
Target: at most 2x.

    python benchmarks/offload_50mb.py [--mb 50] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from big_output import checkpoint_seconds, git, measured  # noqa: E402
from installed import environ_with_fabro  # noqa: E402
from llm_server import LlmServer, Reply, provider_env  # noqa: E402

LINE = "offloaded-value-line-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


def _repo(root: Path, name: str, workflow: str) -> Path:
    repo = root / name
    git(root, "init", "-q", "-b", "main", str(repo))
    (repo / "wf.fabro").write_text(workflow)
    git(repo, "add", "wf.fabro")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "wf")
    return repo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    text = LINE * (size // len(LINE))  # no spaces: the server sends it as one delta
    root = Path(tempfile.mkdtemp(prefix="fabro-offload-", dir=args.dir))
    server = LlmServer().start()
    try:
        env = environ_with_fabro()
        env["FABRO_HOME"] = str(root / "fabro-home")
        env.update(provider_env(server))
        value = root / "value.txt"
        value.write_text(text)

        rows = []
        prompt_repo = _repo(
            root,
            "prompt",
            "digraph P {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
            '  plan [shape=tab, prompt="Write it all", model="claude-sonnet-4-6"]\n'
            "  start -> plan -> exit\n}\n",
        )
        server.script(Reply(text=text))
        wall, rss, out, _ = measured(
            ["git", "fabro", "run", "wf.fabro", "--json", "-q"], prompt_repo, env
        )
        run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
        offloaded = git(
            prompt_repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}", "artifacts/"
        )
        rows.append(
            ("prompt", checkpoint_seconds(prompt_repo, run_id, env, "plan"), wall, rss, offloaded)
        )

        command_repo = _repo(
            root,
            "command",
            "digraph C {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
            f'  big [shape=parallelogram, script="cat {value}"]\n'
            "  start -> big -> exit\n}\n",
        )
        wall, rss, out, _ = measured(
            ["git", "fabro", "run", "wf.fabro", "--json", "-q"], command_repo, env
        )
        run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
        offloaded = git(
            command_repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}", "artifacts/"
        )
        rows.append(
            ("command", checkpoint_seconds(command_repo, run_id, env, "big"), wall, rss, offloaded)
        )

        plain = root / "plain.git"
        git(root, "init", "-q", "--bare", str(plain))
        git_wall, _, _, _ = measured(
            ["git", "--git-dir", str(plain), "hash-object", "-w", str(value)], root, env
        )
        print(f"value         {args.mb} MB; git hash-object -w: {git_wall:.2f} s")
        for name, checkpoint, wall, rss, offloaded in rows:
            ratio = checkpoint / git_wall
            print(
                f"{name:<8}      checkpoint {checkpoint:.2f} s = {ratio:.2f}x git"
                f" ({'met' if ratio <= 2 else 'NOT met'}: target 2x); run {wall:.1f} s,"
                f" peak RSS {rss} MB; offloaded: {' '.join(offloaded.split()) or 'nothing'}"
            )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
