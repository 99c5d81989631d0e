"""Every event type of the catalogue is emitted by a real run somewhere in this suite and
checked there against the events contract, except those no local tool can emit.

Where each type is shown is read from the tests themselves: the scenarios of
`engine/test_event_contract_e2e.py` (each asserts that its expected events were emitted,
and checks every event it reads), the agent scenarios of
`engine/test_agent_event_coverage.py` (which must emit exactly its share of `agent.*`),
and, for the rest, a named test that mentions the event and reads the run's events
through `helpers.run_events` (which checks each one against the contract) or
`check_event` itself. Renaming or deleting one of those tests fails this one.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from event_contract.seed import load_contract

TESTS = Path(__file__).resolve().parent.parent

# Events this tool cannot emit, and why.
EXEMPT_PREFIXES = {
    "sandbox.snapshot.": "needs a remote sandbox provider (sandbox snapshots)",
    "sandbox.git.": "needs a remote sandbox provider (cloning into it)",
    "pull_request.": "needs GitHub",
    "cli.ensure.": "legacy: installing a CLI into a remote sandbox",
}
EXEMPT = {
    "ssh.ready": "needs a remote sandbox reached over SSH",
    "agent.skill.expanded": "legacy: skills expand through agent.skill.activated",
}

# Events shown by one named test each: (file under tests/, test function).
NAMED = {
    "run.interrupt": ("engine/test_control.py", "test_interrupt_stops_a_live_run_at_a_checkpoint"),
    "run.steer": ("engine/test_control.py", "test_steer_with_no_agent_stage_says_so"),
    "agent.steering.injected": (
        "engine/test_llm_stages.py",
        "test_steering_reaches_the_agent_in_flight",
    ),
    "git.push": (
        "engine/test_live_push.py",
        "test_a_remote_that_refuses_is_a_warning_and_the_run_succeeds",
    ),
    "git.fetch": ("engine/test_live_push.py", "test_a_teammate_follows_the_run_and_takes_it_over"),
    "asset.captured": (
        "outputs/test_assets.py",
        "test_new_and_changed_assets_are_copied_with_a_manifest_and_one_event_each",
    ),
    "agent.sub.spawned": (
        "engine/test_subagents.py",
        "test_a_sub_agent_edits_a_file_and_reports_back",
    ),
    "agent.sub.completed": (
        "engine/test_subagents.py",
        "test_a_sub_agent_edits_a_file_and_reports_back",
    ),
    "agent.sub.closed": (
        "engine/test_subagents.py",
        "test_a_sub_agent_edits_a_file_and_reports_back",
    ),
    "agent.sub.failed": (
        "engine/test_subagents.py",
        "test_a_failed_sub_agent_is_an_error_result_for_its_parent",
    ),
    "agent.mcp.ready": (
        "engine/test_mcp.py",
        "test_the_agent_calls_a_stdio_servers_tool_in_its_worktree",
    ),
    "agent.mcp.failed": ("engine/test_mcp.py", "test_a_server_that_fails_to_start_is_left_out"),
}


def _exempt(name: str) -> bool:
    return name in EXEMPT or name.startswith(tuple(EXEMPT_PREFIXES))


def _scenario_events() -> set[str]:
    module = importlib.import_module("engine.test_event_contract_e2e")
    return set().union(*(scenario.expected for scenario in module.SCENARIOS))


def _agent_scenario_events() -> set[str]:
    module = importlib.import_module("engine.test_agent_event_coverage")
    return set(module._expected())


def _named_test_shows(path: Path, function: str, event: str) -> str | None:
    """Why the named test does not show `event` (None: it does)."""
    if not path.exists():
        return f"{path} is gone"
    text = path.read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            body = ast.get_source_segment(text, node) or ""
            if f'"{event}"' not in body:
                return f"{function} does not mention {event}"
            if "run_events" not in text and "check_event" not in text:
                return f"{path.name} does not check the events it reads against the contract"
            return None
    return f"{path.name} has no test {function}"


def test_every_catalogue_event_is_shown_by_a_real_run() -> None:
    catalogue = set(load_contract())
    wanted = {name for name in catalogue if not _exempt(name)}
    shown = _scenario_events() | _agent_scenario_events() | set(NAMED)
    assert sorted(wanted - shown) == [], "no test emits these from a real run"
    assert sorted(shown - catalogue) == [], "not in the catalogue"


def test_each_named_test_shows_its_event() -> None:
    problems = [
        problem
        for event, (path, function) in NAMED.items()
        if (problem := _named_test_shows(TESTS / path, function, event)) is not None
    ]
    assert problems == []


def test_the_exemptions_are_real_catalogue_events() -> None:
    catalogue = set(load_contract())
    assert set(EXEMPT) <= catalogue
    for prefix in EXEMPT_PREFIXES:
        assert any(name.startswith(prefix) for name in catalogue), prefix
    # Nothing exempt is emitted by the code after all.
    emitted = importlib.import_module("events.test_emitted_events").emitted_in_code()
    assert sorted({e.event for e in emitted if _exempt(e.event)}) == []
