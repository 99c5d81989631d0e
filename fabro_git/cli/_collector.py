"""The cyclic garbage collector of the `git-fabro` process, off while it starts.

What start-up makes (the modules, the typer application, a run's plan) lives as long as
the process: the collector would only walk it over and over while it loads, ~20 ms of
a run's start. The console script (`fabro_git.cli.entry`) turns the collector off
first thing; `start_collecting` sets aside for good what exists by then (`gc.freeze`)
and turns it back on as the command's own work begins, so a long run's cycles are
collected as usual: before dispatch for every command but `run`, which loads the
engine first and calls it itself once the run exists.
"""

from __future__ import annotations

import gc

import fabro_git


def start_collecting() -> None:
    """What is loaded now stays; the collector looks at what comes after. Only in the
    console script's process: a test or a library calling `main` keeps its collector
    as it was."""
    if fabro_git.running_as_command and not gc.isenabled():
        gc.freeze()
        gc.enable()
