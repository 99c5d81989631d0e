"""The overall deadline of a stage: the node's `timeout`, and for model stages that
set none a default, so no provider can hold a run for ever."""

from __future__ import annotations

from fabro_git.engine.runner import DEFAULT_LLM_STAGE_TIMEOUT, stage_timeout
from fabro_git.workflow.parser import parse

GRAPH = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    agent [shape=box, prompt="work"]
    ask [shape=tab, prompt="answer"]
    quick [shape=box, prompt="work", timeout="5m"]
    shell [shape=parallelogram, script="true"]
    start -> agent -> ask -> quick -> shell -> exit
}
"""


def test_model_stages_get_a_default_timeout_that_the_node_overrides() -> None:
    graph = parse(GRAPH)
    assert DEFAULT_LLM_STAGE_TIMEOUT == 1800
    assert stage_timeout(graph.nodes["agent"]) == DEFAULT_LLM_STAGE_TIMEOUT
    assert stage_timeout(graph.nodes["ask"]) == DEFAULT_LLM_STAGE_TIMEOUT
    assert stage_timeout(graph.nodes["quick"]) == 300
    assert stage_timeout(graph.nodes["shell"]) is None
