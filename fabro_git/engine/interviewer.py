"""Who answers human gates: a person at the console, `--auto-approve`, or a queue.

An interviewer returns the chosen text, or None when nobody answered (stdin closed, the
queue ran dry): the gate then fails closed instead of guessing.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import msgspec
import trio


class Choice(msgspec.Struct, frozen=True):
    key: str | None
    label: str
    target: str
    freeform: bool = False


class Question(msgspec.Struct, frozen=True):
    text: str
    choices: Sequence[Choice]
    default: Choice | None
    # What the question is about: the end of the previous stage's output or response.
    details: str = ""


class Interviewer(Protocol):
    async def ask(self, question: Question) -> str | None: ...


class AutoApprove:
    kind = "auto"

    async def ask(self, question: Question) -> str | None:
        choice = question.default or (question.choices[0] if question.choices else None)
        return None if choice is None else choice.label


class QueueInterviewer:
    """Answers from a list, in order (`--answer`); runs dry → unanswered."""

    kind = "queue"

    def __init__(self, answers: Sequence[str], fallback: Interviewer | None = None) -> None:
        self.answers = deque(answers)
        self.fallback = fallback

    async def ask(self, question: Question) -> str | None:
        if self.answers:
            return self.answers.popleft()
        if self.fallback is not None:
            return await self.fallback.ask(question)
        return None


DETAIL_LINES = 20


def format_question(question: Question) -> str:
    """A question as a person reads it: what it is about, the question, its choices.
    All of it may come from a run (a stage's output, a fetched workflow's labels), so all
    of it is shown through the one sanitiser."""
    from fabro_git.terminal import printable

    lines = [""]
    if question.details.strip():
        shown = question.details.rstrip("\n").split("\n")[-DETAIL_LINES:]
        lines += [f"  │ {printable(line)}" for line in shown]
    lines.append(f"? {printable(question.text)}")
    for choice in question.choices:
        key = f"[{choice.key}] " if choice.key and not choice.label.lstrip().startswith("[") else ""
        free = "  (free text)" if choice.freeform else ""
        lines.append(f"  {printable(key + choice.label, one_line=True)}{free}")
    if question.default is not None:
        lines.append(f"  default: {printable(question.default.label, one_line=True)}")
    return "\n".join(lines) + "\n"


class ConsoleInterviewer:
    """Asks at the terminal. A question answered elsewhere first (`git fabro attach`)
    leaves its read of stdin pending, and the next question takes that read over: a
    second reader would race it, and the line typed would go to a question that is over."""

    kind = "console"

    def __init__(self) -> None:
        self._pending: Future[str] | None = None

    async def _readline(self) -> str:
        if self._pending is None:
            self._pending = pending = Future[str]()

            def read() -> None:
                try:
                    pending.set_result(sys.stdin.readline())
                except BaseException as exc:  # handed to the question waiting for it
                    pending.set_exception(exc)

            threading.Thread(target=read, name="console-answer", daemon=True).start()
        line = await trio.to_thread.run_sync(self._pending.result, abandon_on_cancel=True)
        self._pending = None
        return line

    async def ask(self, question: Question) -> str | None:
        sys.stderr.write(format_question(question) + "> ")
        sys.stderr.flush()
        line = await self._readline()
        if not line:
            return None  # stdin closed
        answer = line.strip()
        if not answer and question.default is not None:
            return question.default.label
        return answer or None


def make_interviewer(
    *, auto_approve: bool, answers: Sequence[str], interactive: bool
) -> Interviewer:
    fallback: Interviewer | None = None
    if auto_approve:
        fallback = AutoApprove()
    elif interactive:
        fallback = ConsoleInterviewer()
    if answers:
        return QueueInterviewer(answers, fallback)
    return fallback if fallback is not None else QueueInterviewer([])
