"""Model choice for an LLM stage, below the workflow model: any node that answers
`StageNode` will do, a refused attribute is a `StageChoiceError` naming the node and
the key, and the engine points it at the attribute's line in the right file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fabro_git.engine.options import Options
from fabro_git.engine.preflight import check_options
from fabro_git.engine.stage_choice import located
from fabro_git.errors import WorkflowError
from fabro_git.llm.choice import (
    StageChoiceError,
    StageNode,
    backend_of,
    check_stage,
    check_stages,
    effort_of,
)
from fabro_git.llm.errors import UnknownModel
from fabro_git.llm.types import Target
from fabro_git.workflow import load

KEYS = {"ANTHROPIC_API_KEY": "sk-test"}


@dataclass
class Stage:
    """A node from no workflow file: only what model choice reads."""

    id: str
    handler_type: str = "agent"
    attrs: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, /) -> str | None:
        return self.attrs.get(key)


def checked(node: StageNode, model: str | None = None) -> Target | None:
    return check_stage(node, model=model, provider=None, env=KEYS, cli_command=None)


@pytest.mark.parametrize(
    ("attrs", "key", "detail"),
    [
        ({"reasoning_effort": "Extreme"}, "reasoning_effort", "reasoning_effort='extreme'"),
        ({"backend": "shell"}, "backend", "backend='shell' is not one of api, cli"),
        ({"model": "claude-sonet-4-6"}, "model", "claude-sonet-4-6"),
        ({"llm_model": "claude-sonet-4-6"}, "model", "claude-sonet-4-6"),
        ({"provider": "antropic"}, "provider", "antropic"),
    ],
)
def test_a_refused_attribute_names_the_node_and_the_key(
    attrs: dict[str, str], key: str, detail: str
) -> None:
    node = Stage("review", attrs=attrs)
    with pytest.raises(StageChoiceError) as caught:
        checked(node)
    assert caught.value.key == key
    assert caught.value.node is node
    assert caught.value.message.startswith("node 'review': ")
    assert detail in caught.value.detail
    # Not from a workflow file: nowhere to point, so the error stays as it is.
    assert located(caught.value) is caught.value


def test_a_model_the_node_does_not_name_is_the_runs_mistake() -> None:
    with pytest.raises(UnknownModel) as caught:
        checked(Stage("review"), model="claude-sonet-4-6")
    assert not isinstance(caught.value, StageChoiceError)
    assert caught.value.message.startswith("the run's model: ")


def test_a_prompt_stage_always_calls_the_api_and_an_agent_names_its_backend() -> None:
    assert backend_of(Stage("ask", "prompt", {"backend": "cli"})) == "api"
    assert backend_of(Stage("ask", "prompt", {"backend": "shell"})) == "api"
    assert checked(Stage("ask", "prompt", {"backend": "shell"})) is not None  # not refused
    assert backend_of(Stage("work", "agent", {"backend": " CLI "})) == "cli"
    assert backend_of(Stage("work", "codergen")) == "api"
    assert effort_of(Stage("work", attrs={"reasoning_effort": " High"})) == "high"


def test_check_stages_resolves_any_stage_nodes() -> None:
    nodes = [Stage("plan", "prompt", {"model": "opus"}), Stage("work", attrs={"model": "sonnet"})]
    targets = check_stages(nodes, model=None, provider=None, fallbacks=None, env=KEYS)
    assert targets == {
        "plan": Target("anthropic", "claude-opus-4-7"),
        "work": Target("anthropic", "claude-sonnet-4-6"),
    }


def test_a_child_workflows_mistake_points_at_the_child_file_not_a_namesake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parent and child each have a stage called `work`: only the child's is wrong.
    (tmp_path / "wf.fabro").write_text(
        "digraph P {\n"
        "    start [shape=Mdiamond]\n"
        "    exit [shape=Msquare]\n"
        '    work [shape=box, prompt="Parent work"]\n'
        '    child [shape=house, stack.child_workflow="child.fabro"]\n'
        "    start -> work -> child -> exit\n"
        "}\n"
    )
    (tmp_path / "child.fabro").write_text(
        "digraph C {\n"
        "    start [shape=Mdiamond]\n"
        "    exit [shape=Msquare]\n"
        "    work [shape=box,\n"
        '          reasoning_effort="extreme"]\n'
        "    start -> work -> exit\n"
        "}\n"
    )
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(WorkflowError) as caught:
        check_options(Options(), load(tmp_path / "wf.fabro"))
    assert Path(caught.value.path).name == "child.fabro"
    assert caught.value.line == 5
    assert caught.value.detail == (
        "node 'work': reasoning_effort='extreme' is not one of low, medium, high"
    )
