"""Run events: the seed's envelope and catalogue as Structs, the emitter and its sinks.

Import the pieces from here: `EventBus`, the sinks, `Envelope`, `encode_event` /
`decode_event`, and every event Struct (`StageCompleted`, `EdgeSelected`, …, all in
`fabro_git.events.catalogue`). The terminal renderer (`fabro_git.events.render`) and the
seed parser / contract checker (`seed`, `contract`) are imported on demand.
"""

from fabro_git.events import catalogue as _catalogue
from fabro_git.events.bus import EventBus, MemorySink, Sink, TailFileSink, tail_after
from fabro_git.events.catalogue import *  # noqa: F403 - the event Structs are the API
from fabro_git.events.catalogue import CATALOGUE, NOT_EMITTED
from fabro_git.events.envelope import (
    Actor,
    Envelope,
    EventProps,
    decode_event,
    encode_event,
    format_ts,
    iter_complete_lines,
    make_envelope,
    now_ts,
    stage_id_for,
    uuid7,
)

__all__ = [
    "CATALOGUE",
    "NOT_EMITTED",
    "Actor",
    "Envelope",
    "EventBus",
    "EventProps",
    "MemorySink",
    "Sink",
    "TailFileSink",
    "decode_event",
    "encode_event",
    "format_ts",
    "iter_complete_lines",
    "make_envelope",
    "now_ts",
    "stage_id_for",
    "tail_after",
    "uuid7",
]
__all__ += _catalogue.__all__
