"""A stage's model choice gone wrong, pointed at the workflow file.

`fabro_git.llm.choice` sits below the workflow model and knows a node only by its id
and attributes: what it refuses names the node and the attribute key. Both places that
choose a stage's model (the check before a run, and the stage itself) turn that into an
error at the attribute's line here, so the two say the same thing.
"""

from __future__ import annotations

from fabro_git.errors import FabroError, WorkflowError
from fabro_git.llm.choice import StageChoiceError
from fabro_git.workflow.model import Node


def located(err: StageChoiceError) -> FabroError:
    """`err` at the line of the attribute it names (the node's own line when the file
    does not set it, as when the model stylesheet did)."""
    node = err.node
    if not isinstance(node, Node):  # a node from no workflow file: nowhere to point
        return err
    line, column = node.positions.get(err.key, (node.line, node.column))
    return WorkflowError(err.message, path=node.path, line=line, column=column, hint=err.hint)
