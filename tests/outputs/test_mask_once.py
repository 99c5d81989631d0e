"""An offloaded value is one content under two paths (the visit's file and the key's
current one): a snapshot scans it for secrets once and stores it as one blob, and both
paths hold the masked bytes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import git, run_config_passing, run_fabro, write_workflow

from fabro_git.engine.recorder import _masked_once

LEAK = """
digraph S {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    leak [shape=parallelogram, script="echo \\"MY_SERVICE_TOKEN=$MY_SERVICE_TOKEN\\"; head -c 200000 /dev/zero | tr '\\\\0' z; echo"]
    start -> leak -> exit
}
"""


def test_both_files_of_an_offloaded_value_are_one_masked_blob(repo: Path) -> None:
    token = "svc" + "k3Yq9Zt2Wm4R" + "Xp7Lr2Vn"
    write_workflow(repo, LEAK)
    proc = run_fabro(
        "run",
        run_config_passing(repo, "MY_SERVICE_TOKEN"),
        "--json",
        cwd=repo,
        env={"MY_SERVICE_TOKEN": token},
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    current = git(repo, "rev-parse", f"{meta}:artifacts/command.output.json").strip()
    visit = git(repo, "rev-parse", f"{meta}:artifacts/leak/command.output.json").strip()
    assert current == visit
    stored = subprocess.run(
        ["git", "cat-file", "blob", current], cwd=repo, capture_output=True, check=True
    ).stdout
    assert token.encode() not in stored
    assert json.loads(stored).startswith(f"MY_SERVICE_TOKEN=***{token[-4:]}\n")


def test_equal_big_files_are_masked_once_and_share_the_result() -> None:
    calls: list[int] = []

    def mask(data: bytes) -> bytes:
        calls.append(len(data))
        return data.replace(b"secret", b"***")

    big = b"x" * 200_000 + b"secret"
    twin = bytes(bytearray(big))  # equal bytes, another object
    other = b"y" * 200_000 + b"secret"  # same length, other bytes
    masked = _masked_once(
        mask,
        {
            "artifacts/a/k.json": big,
            "artifacts/k.json": twin,
            "nodes/a/response.md": other,
            "small.json": b"secret",
            "gone.json": None,
            "streamed.txt": Path("/nonexistent"),
        },
    )
    assert calls == [len(big), len(other), len(b"secret")]
    assert masked["artifacts/a/k.json"] is masked["artifacts/k.json"]
    assert masked["artifacts/k.json"] == b"x" * 200_000 + b"***"
    assert masked["nodes/a/response.md"] == b"y" * 200_000 + b"***"
    assert masked["small.json"] == b"***" and masked["gone.json"] is None
    assert "streamed.txt" not in masked
