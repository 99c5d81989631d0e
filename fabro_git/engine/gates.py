"""Human gates answered from another terminal: `git fabro attach`.

Every question a live run asks is put on a desk the control socket shows: an attached
client sees the open questions as they open and close, and may answer one. The run's
own interviewer (its terminal, `--answer`, `--auto-approve`) is asked as before, and
the first answer, from either side, wins. When the run's own interviewer has no answer
(a detached run has no terminal; a run whose stdin is closed), a gate waits for an
attached answer if the run is detached or a client is attached; otherwise it fails
closed, as it always did. How long a gate waits is the node's business (`timeout`,
`human.timeout`), enforced by the gate handler around this.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import trio

from fabro_git.engine.control import GateUpdate, Send
from fabro_git.engine.interviewer import Interviewer, Question


class OpenGate(msgspec.Struct):
    id: int
    question: Question
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    answer: str | None = None
    by: str | None = None  # "terminal" or "attach"


class Lively(Protocol):
    @property
    def activity(self) -> int: ...

    @property
    def store_busy(self) -> int: ...


class AttendedRun(msgspec.Struct):
    """A run's signs of life for the stall watchdog, where a gate waiting on a person
    counts as work in flight: waiting for a human is not a stall (the gate's own
    `timeout` and `human.timeout` bound it)."""

    run: Lively
    desk: GateDesk

    @property
    def activity(self) -> int:
        return self.run.activity

    @property
    def store_busy(self) -> int:
        return self.run.store_busy + len(self.desk.open)


class GateDesk:
    """The run's open questions, and the clients attached to watch them."""

    def __init__(self) -> None:
        self.open: dict[int, OpenGate] = {}
        self.clients = 0
        self._next_id = 0
        self._changed = trio.Event()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def post(self, question: Question) -> OpenGate:
        self._next_id += 1
        gate = OpenGate(self._next_id, question)
        self.open[gate.id] = gate
        self._pulse()
        return gate

    def settle(self, gate: OpenGate, answer: str | None, by: str | None) -> bool:
        """Give `gate` its answer (None: nobody will); False when it was settled before."""
        if gate.done.is_set():
            return False
        gate.answer, gate.by = answer, by
        gate.done.set()
        return True

    def withdraw(self, gate: OpenGate) -> None:
        if self.open.pop(gate.id, None) is not None:
            self._pulse()

    def answer(self, gate_id: int, text: str) -> bool:
        """An attached client's answer; False when the gate is no longer open."""
        gate = self.open.get(gate_id)
        return gate is not None and self.settle(gate, text, "attach")

    async def follow(self, send: Send) -> None:
        """Tell an attached client about every question as it opens and closes, until
        the client goes (the caller cancels this)."""
        self.clients += 1
        shown: dict[int, OpenGate] = {}
        try:
            while True:
                changed = self._changed
                for gate_id, gate in list(self.open.items()):
                    if gate_id not in shown:
                        shown[gate_id] = gate
                        await send(GateUpdate(question=gate.question, id=gate_id))
                for gate_id, gate in list(shown.items()):
                    if gate_id not in self.open:
                        del shown[gate_id]
                        await send(GateUpdate(closed=gate_id, answer=gate.answer, by=gate.by))
                if changed is self._changed:
                    await changed.wait()
        finally:
            self.clients -= 1


class SharedInterviewer:
    """The run's own interviewer, with the desk beside it: first answer wins."""

    kind = "shared"

    def __init__(self, own: Interviewer, desk: GateDesk, *, detached: bool) -> None:
        self.own = own
        self.desk = desk
        self.detached = detached

    async def ask(self, question: Question) -> str | None:
        desk = self.desk
        gate = desk.post(question)
        try:
            async with trio.open_nursery() as nursery:

                async def ask_own() -> None:
                    answer = await self.own.ask(question)
                    if answer is not None:
                        desk.settle(gate, answer, "terminal")
                    elif not (self.detached or desk.clients):
                        desk.settle(gate, None, None)  # nobody can answer: fail closed

                nursery.start_soon(ask_own)
                await gate.done.wait()
                nursery.cancel_scope.cancel()
        finally:
            desk.withdraw(gate)
        if gate.by == "attach" and not self.detached:
            import sys

            from fabro_git.terminal import printable

            answer = printable(str(gate.answer), one_line=True)
            sys.stderr.write(f"\n(answered from git fabro attach: {answer})\n")
            sys.stderr.flush()
        return gate.answer
