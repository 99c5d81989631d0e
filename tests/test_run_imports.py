"""What `git fabro run` imports stays cheap to import.

A dataclass costs about 0.3 ms to make (its methods are generated and exec'd); the
run imports dozens of records, so they are msgspec Structs, made in C.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers import write_workflow

RUN_PATH = (
    "fabro_git.cli.app",
    "fabro_git.cli.run",
    "fabro_git.engine.runner",
    "fabro_git.engine.session",
)


def test_the_run_import_path_makes_no_dataclass() -> None:
    code = (
        "import dataclasses, sys\n"
        f"for name in {RUN_PATH!r}:\n"
        "    __import__(name)\n"
        "for name, module in sorted(sys.modules.items()):\n"
        "    if name.startswith('fabro_git'):\n"
        "        for value in vars(module).values():\n"
        "            if (isinstance(value, type) and value.__module__ == name\n"
        "                    and dataclasses.is_dataclass(value)):\n"
        "                print(f'{name}.{value.__qualname__}')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == "", f"dataclasses on the run's import path:\n{proc.stdout}"


def test_the_version_probe_imports_only_the_cli_face() -> None:
    """`git fabro --version` goes through the console script's `entry` and loads no
    module of the package beyond its face: every other import costs start-up time."""
    code = (
        "import sys\n"
        "sys.argv = ['git-fabro', '--version']\n"
        "from fabro_git.cli import entry\n"
        "import os\n"
        "real_exit = os._exit\n"
        "def leave(code):\n"
        "    loaded = sorted(n for n in sys.modules if n.startswith('fabro_git'))\n"
        "    sys.stderr.write(repr(loaded))\n"
        "    sys.stderr.flush()\n"
        "    real_exit(code)\n"
        "os._exit = leave\n"
        "entry()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = ast.literal_eval(proc.stderr)  # the list printed above
    assert loaded == ["fabro_git", "fabro_git.cli"], loaded


def test_a_run_of_commands_loads_only_what_it_needs(repo: Path) -> None:
    """A workflow of command stages runs without the LLM stages' handlers, model choice
    or the handlers of stage kinds it lacks: each is start-up time it does not need. Nor
    does a checkpoint's diff load dulwich's patch module, which brings the `email`
    package along (5 ms and more)."""
    write_workflow(
        repo,
        'digraph W { start [shape=Mdiamond]; exit [shape=Msquare]; s [shape=parallelogram, script="echo x > f.txt"]; start -> s -> exit }\n',
    )
    report = repo.parent / "loaded.txt"
    code = (
        "import os, sys\n"
        "sys.argv = ['git-fabro', 'run', 'wf.fabro']\n"
        "from fabro_git.cli import entry\n"
        "real_exit = os._exit\n"
        "def leave(code):\n"
        f"    with open({str(report)!r}, 'w') as out:\n"
        "        out.write(repr(sorted(sys.modules)))\n"
        "    real_exit(code)\n"
        "os._exit = leave\n"
        "entry()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(ast.literal_eval(report.read_text()))
    assert "fabro_git.handlers.command" in loaded
    unneeded = {
        "fabro_git.handlers.llm",
        "fabro_git.handlers.parallel",
        "fabro_git.handlers.subworkflow",
        "fabro_git.llm.choice",
        "fabro_git.llm.cli",
        "dulwich.patch",
        "email",
    }
    assert not loaded & unneeded, sorted(loaded & unneeded)
