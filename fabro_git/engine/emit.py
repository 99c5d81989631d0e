"""The shape of the run's emit function, as the engine and its helpers call it."""

from __future__ import annotations

from typing import Protocol, TypedDict

from fabro_git.events.envelope import Actor, EventProps


class EnvelopeFields(TypedDict, total=False):
    """The envelope's stage and agent-session fields, as keywords to an `Emit`."""

    node_id: str | None
    node_label: str | None
    stage_id: str | None
    session_id: str | None
    parent_session_id: str | None
    actor: Actor | None


class Emit(Protocol):
    def __call__(
        self,
        event: EventProps,
        /,
        *,
        node_id: str | None = None,
        node_label: str | None = None,
        stage_id: str | None = None,
        session_id: str | None = None,
        parent_session_id: str | None = None,
        actor: Actor | None = None,
    ) -> None:
        """Emit an event Struct, with the envelope's stage and agent-session fields."""
