"""Node retry policies: how many attempts a stage gets and how long to wait between them.

Only transient failures are retried. A node's `retry_policy` preset wins; otherwise an
explicit `max_retries` (or the graph's `default_max_retries`) keeps the standard backoff
with that many extra attempts. Delays carry 0.5x-1.5x jitter and are capped at 60 s.
"""

from __future__ import annotations

import random

import msgspec

from fabro_git.errors import WorkflowError
from fabro_git.workflow import Graph, Node

MAX_DELAY = 60.0


class RetryPolicy(msgspec.Struct, frozen=True):
    name: str
    max_attempts: int
    initial_delay: float = 0.2
    factor: float = 2.0
    max_delay: float = MAX_DELAY
    jitter: bool = True

    def delay_for(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before retry number `attempt` (1 = the first retry)."""
        delay = min(self.initial_delay * self.factor ** (attempt - 1), self.max_delay)
        if self.jitter:
            delay *= (rng or random).uniform(0.5, 1.5)
        return min(delay, self.max_delay)


PRESETS: dict[str, RetryPolicy] = {
    "none": RetryPolicy("none", 1),
    "standard": RetryPolicy("standard", 5, 0.2, 2.0),
    "aggressive": RetryPolicy("aggressive", 5, 0.5, 2.0),
    "linear": RetryPolicy("linear", 3, 0.5, 1.0),
    "patient": RetryPolicy("patient", 3, 2.0, 3.0),
}


def policy_for(node: Node, graph: Graph) -> RetryPolicy:
    preset = node.get("retry_policy")
    if preset is not None:
        policy = PRESETS.get(preset.strip().lower())
        if policy is None:
            raise WorkflowError(
                f"node {node.id!r}: unknown retry_policy {preset!r}",
                path=graph.path,
                line=node.line,
                column=node.column,
                hint="use one of: " + ", ".join(PRESETS),
            )
        if node.get("max_retries") is not None:
            return RetryPolicy(
                policy.name, node.get_int("max_retries", 0) + 1, policy.initial_delay, policy.factor
            )
        return policy
    if node.get("max_retries") is not None:
        retries = node.get_int("max_retries", 0)
    else:
        retries = graph.get_int("default_max_retries", graph.get_int("default_max_retry", 0))
    return RetryPolicy("custom" if retries else "none", max(1, retries + 1), 5.0, 2.0)
