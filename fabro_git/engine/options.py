"""How a run was asked to run: the command line's choices that hold for its whole walk."""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class Options(msgspec.Struct):
    auto_approve: bool = False
    answers: list[str] = msgspec.field(default_factory=list)
    dry_run: bool = False
    in_place: bool = False
    model: str | None = None
    provider: str | None = None
    interactive: bool = False
    # Live replication: the remote the run pushes its refs to after every checkpoint.
    push_remote: str | None = None
    # Running in the background (`run -d`): its gates wait for `git fabro attach`.
    detached: bool = False
    # Write `retro.json` at the run's end (`run --no-retro` turns it off for the run).
    retro: bool = True
    # Ask the run's model for the retro's narrative too (`run --retro-narrative`).
    retro_narrative: bool = False
    # US dollars the run may spend on models; None: no cap.
    max_cost: float | None = None
    # Hears each line a command stage prints, as it prints it (`run -v`): (node id, line).
    on_output: Callable[[str, str], None] | None = None
    # The goal and the inputs as given, where the stored run holds them masked: what a
    # detached child was handed by the command that made the run (`carry_secrets`).
    carried_goal: str | None = None
    carried_inputs: dict[str, str] = msgspec.field(default_factory=dict)
