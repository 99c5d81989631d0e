"""How a prompt or agent hook's reply is read as a decision (`engine.lifecycle`): the
many shapes a model answers in, in process; the end-to-end runs are in
test_lifecycle_hooks.py."""

from __future__ import annotations

import pytest

from fabro_git.engine.lifecycle import _decision_in_reply


@pytest.mark.parametrize(
    ("reply", "action", "reason"),
    [
        ('{"ok": true}', "proceed", None),
        ('{"ok": false, "reason": "tests fail"}', "block", "tests fail"),
        ('Checked.\n```json\n{"ok": false, "reason": "no"}\n```\nThat is all.', "block", "no"),
        ('{"decision": "skip", "reason": "docs only"}', "skip", "docs only"),
        # The last decision in the reply is the answer; an object without one is not.
        ('First {"ok": false} then, on reflection, {"ok": true}. {"note": 1}', "proceed", None),
    ],
)
def test_a_reply_decides_by_the_last_json_decision_in_it(
    reply: str, action: str, reason: str | None
) -> None:
    said = _decision_in_reply(reply)
    assert said is not None
    assert (said.action, said.reason) == (action, reason)


@pytest.mark.parametrize("reply", ["", "Yes, looks fine.", '{"verdict": "block"}', "{ broken"])
def test_a_reply_without_a_decision_decides_nothing(reply: str) -> None:
    assert _decision_in_reply(reply) is None
