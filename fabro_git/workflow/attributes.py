"""Every attribute name a workflow may write, by where it is written.

A misspelt attribute (`scrpt="make test"`) is otherwise silent: DOT accepts any name, and
the stage just runs without it. The validator's `unknown_attribute` rule warns about a
name that is in none of these sets, with a "did you mean" from them.

Three sources feed the sets, and a name belongs here if any of them uses it:

- what git fabro's own code reads (a handler, the engine, the validator, `graph`); a test
  scans the source for literal reads and fails when one is missing here, so a new
  attribute cannot be added without registering it;
- what Fabro's and Attractor's documents define, even where this version does not act
  on it yet (`reasoning_effort`, `manager.stop_condition`), so a workflow written for
  Fabro validates cleanly;
- Graphviz's presentational attributes, which authors put in workflows so that the
  same file draws nicely; the engine ignores them.
"""

from __future__ import annotations

# Read by git fabro or defined by Fabro/Attractor ---------------------------------------

FABRO_GRAPH: frozenset[str] = frozenset(
    {
        "goal",
        "label",
        "rankdir",
        "model_stylesheet",
        "default_max_retries",
        "default_max_retry",
        "retry_target",
        "fallback_retry_target",
        "default_fidelity",
        "default_thread",
        "max_node_visits",
        "stall_timeout",
        "loop_restart_signature_limit",
        "setup",
        "stack.child_dotfile",
        "allow_push",
    }
)

FABRO_NODE: frozenset[str] = frozenset(
    {
        # Every node.
        "label",
        "shape",
        "type",
        "class",
        "timeout",
        "max_visits",
        "max_retries",
        "retry_policy",
        "retry_target",
        "fallback_retry_target",
        "goal_gate",
        "auto_status",
        "allow_partial",
        "allow_push",
        "selection",
        "goal",
        # LLM stages (agent, prompt).
        "prompt",
        "reasoning_effort",
        "max_tokens",
        "max_turns",
        "fidelity",
        "thread_id",
        "model",
        "provider",
        "llm_model",
        "llm_provider",
        "project_memory",
        "backend",
        "speed",
        "max_subagent_depth",
        "permissions",
        "dry_run.response",
        # Commands.
        "script",
        "tool_command",
        "language",
        # Parallel fan-out and fan-in.
        "join_policy",
        "max_parallel",
        # Wait.
        "duration",
        # Human gates.
        "question",
        "human.default_choice",
        "human.timeout",
        # Sub-workflows.
        "stack.child_workflow",
        "stack.child_dot_source",
        "stack.child_autostart",
        "manager.poll_interval",
        "manager.max_cycles",
        "manager.stop_condition",
        "manager.actions",
    }
)

FABRO_EDGE: frozenset[str] = frozenset(
    {"label", "condition", "weight", "fidelity", "thread_id", "loop_restart", "freeform"}
)

# Graphviz's presentational attributes -----------------------------------------------------

_GRAPHVIZ_COMMON: frozenset[str] = frozenset(
    {
        "label",
        "color",
        "fontcolor",
        "fontname",
        "fontsize",
        "style",
        "tooltip",
        "URL",
        "href",
        "target",
        "id",
        "class",
        "comment",
        "penwidth",
        "xlabel",
        "labelloc",
    }
)

GRAPHVIZ_GRAPH: frozenset[str] = _GRAPHVIZ_COMMON | frozenset(
    {
        "rankdir",
        "bgcolor",
        "fillcolor",
        "pencolor",
        "nodesep",
        "ranksep",
        "rank",
        "splines",
        "compound",
        "concentrate",
        "newrank",
        "ordering",
        "labeljust",
        "margin",
        "pad",
        "size",
        "ratio",
        "dpi",
        "center",
        "layout",
        "overlap",
        "outputorder",
        "forcelabels",
        "charset",
        "clusterrank",
        "searchsize",
        "remincross",
        "mclimit",
        "nslimit",
        "rotate",
        "landscape",
        "peripheries",
    }
)

GRAPHVIZ_NODE: frozenset[str] = _GRAPHVIZ_COMMON | frozenset(
    {
        "shape",
        "fillcolor",
        "width",
        "height",
        "fixedsize",
        "peripheries",
        "margin",
        "image",
        "imagescale",
        "group",
        "sides",
        "skew",
        "distortion",
        "orientation",
        "regular",
        "nojustify",
        "ordering",
        "sortv",
        "gradientangle",
        "pos",
    }
)

GRAPHVIZ_EDGE: frozenset[str] = _GRAPHVIZ_COMMON | frozenset(
    {
        "weight",
        "arrowhead",
        "arrowtail",
        "arrowsize",
        "dir",
        "constraint",
        "minlen",
        "headlabel",
        "taillabel",
        "labelfontsize",
        "labelfontcolor",
        "labelfontname",
        "labelangle",
        "labeldistance",
        "labelfloat",
        "decorate",
        "headport",
        "tailport",
        "headclip",
        "tailclip",
        "lhead",
        "ltail",
        "samehead",
        "sametail",
        "fillcolor",
        "edgetooltip",
        "labeltooltip",
    }
)

# What the validator accepts -------------------------------------------------------------

GRAPH_ATTRIBUTES: frozenset[str] = FABRO_GRAPH | GRAPHVIZ_GRAPH
NODE_ATTRIBUTES: frozenset[str] = FABRO_NODE | GRAPHVIZ_NODE
EDGE_ATTRIBUTES: frozenset[str] = FABRO_EDGE | GRAPHVIZ_EDGE

KNOWN: dict[str, frozenset[str]] = {
    "graph": GRAPH_ATTRIBUTES,
    "node": NODE_ATTRIBUTES,
    "edge": EDGE_ATTRIBUTES,
}
