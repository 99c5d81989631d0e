"""A snapshot of `.fabro/` finds every change made after it and puts all of it back."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from fabro_git.config import protected
from fabro_git.config.protected import ConfigSnapshot, config_change_refused


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for path in sorted((root / ".fabro").rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[name] = ("link", 0, os.readlink(path))
        elif path.is_dir():
            found[name] = ("dir", path.stat().st_mode & 0o777, "")
        else:
            found[name] = ("file", path.stat().st_mode & 0o777, path.read_bytes())
    return found


def test_every_kind_of_change_is_found_and_undone(tmp_path: Path) -> None:
    config = tmp_path / ".fabro"
    (config / "skills" / "a").mkdir(parents=True)
    (config / "project.toml").write_text("# ours\n")
    (config / "skills" / "a" / "SKILL.md").write_text("a\n")
    (config / "run.sh").write_text("echo\n")
    os.chmod(config / "run.sh", 0o755)
    (config / "link").symlink_to("project.toml")
    before = _tree(tmp_path)
    snapshot = ConfigSnapshot(tmp_path)
    assert snapshot.changes() == [] and config_change_refused(snapshot) is None

    (config / "project.toml").write_text("[[run.hooks]]\n")
    (config / "skills" / "a" / "SKILL.md").unlink()
    (config / "skills" / "a" / "SKILL.md").mkdir()  # a file become a directory
    (config / "new" / "deep").mkdir(parents=True)
    (config / "new" / "deep" / "x").write_text("x")
    os.chmod(config / "run.sh", 0o644)
    (config / "link").unlink()
    (config / "link").symlink_to("/etc/passwd")
    assert snapshot.changes() == [
        ".fabro/link",
        ".fabro/new",
        ".fabro/new/deep",
        ".fabro/new/deep/x",
        ".fabro/project.toml",
        ".fabro/run.sh",
        ".fabro/skills/a/SKILL.md",
    ]
    said = config_change_refused(snapshot, what="stage plant")
    assert said is not None and said.startswith("refused: stage plant changed .fabro/link")
    assert "put back as it was" in said
    assert _tree(tmp_path) == before and snapshot.changes() == []


def test_a_removed_or_replaced_fabro_comes_back_and_a_new_one_goes(tmp_path: Path) -> None:
    config = tmp_path / ".fabro"
    config.mkdir()
    (config / "project.toml").write_text("# ours\n")
    snapshot = ConfigSnapshot(tmp_path)
    (config / "project.toml").unlink()
    config.rmdir()
    (tmp_path / "elsewhere").mkdir()
    config.symlink_to("elsewhere")
    assert snapshot.changes() == [".fabro/", ".fabro/project.toml"]
    assert snapshot.restore() == []
    assert (config / "project.toml").read_text() == "# ours\n" and not config.is_symlink()

    empty = tmp_path / "empty"
    empty.mkdir()
    none_yet = ConfigSnapshot(empty)
    (empty / ".fabro").mkdir()
    (empty / ".fabro" / "project.toml").write_text("[[run.hooks]]\n")
    assert none_yet.changes() == [".fabro/", ".fabro/project.toml"]
    assert none_yet.restore() == [] and not (empty / ".fabro").exists()


def test_a_file_too_large_to_keep_is_found_but_not_put_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(protected, "KEEP_LIMIT", 4)
    (tmp_path / ".fabro").mkdir()
    (tmp_path / ".fabro" / "big").write_text("more than four bytes")
    snapshot = ConfigSnapshot(tmp_path)
    (tmp_path / ".fabro" / "big").write_text("changed, and large")
    said = config_change_refused(snapshot)
    assert said is not None and "except .fabro/big (restore those by hand)" in said


def test_a_fifo_swapped_in_after_the_look_is_never_waited_on(tmp_path: Path, monkeypatch) -> None:
    """An agent's process may replace a file between the snapshot's `lstat` and its
    read: a FIFO found then is "other", not a read that waits for a writer for ever."""
    config = tmp_path / ".fabro"
    config.mkdir()
    fifo = config / "project.toml"
    os.mkfifo(fifo)
    real_lstat = os.lstat
    seen_as_file = os.stat_result((0o100644, 0, 0, 1, 0, 0, 10, 0, 0, 0))

    def lstat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        # What lstat reported a moment before the swap: a regular file.
        return seen_as_file if Path(path) == fifo else real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(protected.os, "lstat", lstat)
    entries: list[dict[str, protected.Entry]] = []
    looking = threading.Thread(
        target=lambda: entries.append(protected._entries(config)), daemon=True
    )
    looking.start()
    looking.join(60)
    if looking.is_alive():  # let a read stuck on the FIFO go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert [entry["project.toml"].kind for entry in entries] == ["other"]
