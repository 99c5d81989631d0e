"""Who answers human gates: a person at the console, `--auto-approve`, or a queue.

An interviewer returns the chosen text, or None when nobody answered (stdin closed, the
queue ran dry): the gate then fails closed instead of guessing. A person at a terminal
who types an answer no choice takes (or Enter where the gate has no default) is asked
again and told what is accepted, as `git fabro attach` does; a pipe or `--answer` is a
script, and its stray answer fails the gate as before.
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

from fabro_git.engine.edges import normalize_label


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


def match(answer: str, choices: Sequence[Choice]) -> Choice | None:
    """The fixed choice `answer` names: its accelerator key, its label or its target."""
    text = answer.strip()
    fixed = [c for c in choices if not c.freeform]
    for c in fixed:
        if c.key and text.lower() == c.key.lower():
            return c
    for c in fixed:
        if normalize_label(text) == normalize_label(c.label) or text == c.target:
            return c
    return None


def takes(question: Question, answer: str) -> bool:
    """Whether the gate can route on `answer`: a choice's key, label or target, or any
    text when it has a free-text choice."""
    return any(c.freeform for c in question.choices) or match(answer, question.choices) is not None


def ask_again(question: Question, answer: str) -> str:
    """What a person is told when `answer` (maybe empty) cannot be taken: why, and
    what would be."""
    from fabro_git.terminal import printable

    shown = [_with_key(c) for c in question.choices if not c.freeform]
    accepted = f"type one of: {printable(', '.join(shown), one_line=True)}"
    if answer:
        return f"({printable(answer, one_line=True)!r} is none of the choices; {accepted})\n"
    return f"(this question has no default; {accepted})\n"


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


def _with_key(choice: Choice) -> str:
    """`[Y] Yes`: a choice as shown, with its key unless its label already shows it."""
    if choice.key and not choice.label.lstrip().startswith("["):
        return f"[{choice.key}] {choice.label}"
    return choice.label


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
        free = "  (free text)" if choice.freeform else ""
        lines.append(f"  {printable(_with_key(choice), one_line=True)}{free}")
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
        at_terminal = _stdin_is_terminal()
        while True:
            line = await self._readline()
            if not line:
                return None  # stdin closed
            answer = line.strip()
            if not answer and question.default is not None:
                return question.default.label
            if not at_terminal:
                return answer or None
            if answer and takes(question, answer):
                return answer
            sys.stderr.write(ask_again(question, answer) + "> ")
            sys.stderr.flush()


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):
        return False


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
