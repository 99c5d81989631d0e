"""The outputs seed (`seeds/000_71ab562b2090f4a2.txt`), statement by statement, and the
test that shows each one. Tests named here without a file are in this file.

Response capture
- response.md and status.json (status, context updates, directives) per LLM stage:
  engine/test_llm_stages.py::test_a_prompt_reply_routes_the_run,
  engine/test_cli_agents.py::test_each_profile_runs_its_cli_and_routes_on_the_reply
Context updates
- last_stage, last_response (first 200 characters), response.<node> (full text):
  engine/test_offload.py::test_a_large_response_is_offloaded_and_a_later_preamble_points_to_it,
  test_every_routing_field_of_a_reply_takes_effect
Routing directives
- every balanced object, fenced/inline/nested, braces in strings, last one wins:
  outputs/test_directives.py::test_fenced_inline_nested_and_last_wins,
  ::test_a_directive_is_found_whatever_prose_surrounds_it (hypothesis)
- a stray brace does not hide a later object: outputs/test_directives.py::
  test_a_stray_brace_does_not_hide_a_later_object,
  engine/test_directives_e2e.py::test_a_directive_after_a_stray_brace_routes
- the five fields and their effects (outcome, failure_reason, preferred_next_label,
  suggested_next_ids, context_updates merged into the context):
  test_every_routing_field_of_a_reply_takes_effect, test_a_fail_outcome_fails_with_its_reason
- JSON without recognised fields is ignored:
  outputs/test_directives.py::test_json_without_recognised_fields_is_ignored,
  test_a_reply_without_directives_routes_by_conditions_then_weights
- status.json fallback, the reply wins: outputs/test_directives.py::test_status_file_fallback,
  engine/test_directives_e2e.py::test_status_json_is_the_fallback_and_the_reply_wins
- no directive: conditions, then unconditional edges, then weights:
  test_a_reply_without_directives_routes_by_conditions_then_weights,
  engine/inprocess/test_routing_inprocess.py::
  test_edge_weights_then_the_lexical_tiebreak_choose_the_edge
Output logging
- prompt.md (preamble + prompt), response.md, status.json per stage; a repeat visit
  appends the visit count to the directory name: test_a_repeat_visit_writes_its_own_node_files
- a retried stage writes them too (the last attempt's):
  test_a_retried_prompt_stage_writes_its_node_files
- routing JSON is never asked for unless the prompt asks:
  test_a_repeat_visit_writes_its_own_node_files
File tracking
- API backend (write_file/edit_file confirmed on success, failed calls discarded):
  agent/test_agent_loop.py, engine/test_llm_stages.py::test_an_agent_reads_edits_and_creates_files
- CLI backend (snapshots before/after, diffed): store/test_touched_snapshots.py,
  engine/test_cli_agents.py::test_each_profile_runs_its_cli_and_routes_on_the_reply,
  engine/test_cli_touched_checkpoint.py (the "before" read from the last checkpoint's
  scan and the "after" from the stage's own, or both snapshots, with the same result)
- command stages from their tree diff: engine/test_offload.py::test_files_touched_of_a_command_stage
- where files_touched appears (stage.completed, preambles, retros per stage and in
  aggregate, status.json), in every scope:
  outputs/test_files_touched_scopes.py::test_every_scope_reports_the_files_its_stages_touched
Artifact offloading
- over 100 KB offloaded to a file:// pointer, command output included:
  engine/test_offload.py::test_a_large_command_output_is_offloaded_to_the_meta_ref_and_the_scratch_dir
- 100 KB or less inline: engine/test_offload.py::test_a_value_under_the_threshold_stays_inline,
  outputs/test_artifacts.py::test_only_values_over_the_threshold_are_offloaded
- layout artifacts/values/<key>.json: engine/test_offload.py (both tests above)
- ArtifactStore reads, writes, cleans up: outputs/test_artifacts.py::
  test_prune_removes_what_nothing_points_to, ::test_materialise_makes_the_store_hold_exactly_the_given_files,
  cli/test_artifact_cmd.py::test_a_later_stage_setting_the_same_key_keeps_the_earlier_value
- preamble rendering ("See: <path>", model, tokens, files, script, stdout):
  engine/test_offload.py::test_a_stage_summary_follows_the_completed_stages_layout,
  ::test_a_large_response_is_offloaded_and_a_later_preamble_points_to_it
Git storage
- manifest.json, graph.fabro, checkpoint.json, artifacts/ on the meta ref:
  test_the_meta_ref_holds_the_layout_the_seed_shows,
  engine/test_offload.py::test_a_large_command_output_is_offloaded_to_the_meta_ref_and_the_scratch_dir
Remote sandbox syncing (here: from git into the scratch dir on resume or in a clone)
- engine/test_offload.py::test_resume_in_a_fresh_clone_writes_the_artifacts_into_its_scratch_dir,
  documented: test_the_readme_documents_what_remote_sandbox_syncing_is_here
Asset capture
- baseline and re-scan, new or changed files, manifest fields, asset.captured:
  outputs/test_assets.py::test_new_and_changed_assets_are_copied_with_a_manifest_and_one_event_each
- only files modified since the command started:
  outputs/test_assets.py::test_only_files_new_or_modified_since_the_command_started_are_collected
- 10 MB per file, 50 MB in all:
  outputs/test_assets.py::test_files_over_10_mb_are_skipped_and_the_collection_stops_past_50_mb
- assets/<node_slug>/retry_<n>/: outputs/test_assets.py::test_a_repeat_visit_has_its_own_node_slug,
  ::test_each_attempt_of_an_agent_stage_keeps_its_own_retry_directory
Observability
- stage.completed files_touched, retros, preambles, status.json:
  outputs/test_files_touched_scopes.py
- run.completed.artifact_count: engine/test_offload.py::
  test_parallel_branches_offload_the_same_key_to_their_own_files (2),
  ::test_a_value_under_the_threshold_stays_inline (0)
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import (
    ROOT,
    fresh_clone,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)
from llm_server import LlmServer, Reply, provider_env


def dot(text: str) -> str:
    """`text` as a DOT attribute value's inside (quotes and backslashes escaped)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def completed(events: list[dict], node: str) -> dict:
    return next(e for e in events if e["event"] == "stage.completed" and e["node_id"] == node)


def edges(events: list[dict]) -> list[tuple[str, str]]:
    return [
        (e["properties"]["from_node"], e["properties"]["to_node"])
        for e in events
        if e["event"] == "edge.selected"
    ]


def test_every_routing_field_of_a_reply_takes_effect(repo: Path) -> None:
    # `pick` labels an edge that does not exist, so its suggested ids choose; `label`
    # names an edge by its label; the long form of an outcome is accepted.
    pick = dot(
        'Done.\n```json\n{"outcome": "partial_success", "suggested_next_ids": ["nope", "two"],'
        ' "preferred_next_label": "missing", "context_updates": {"tests_passed": true,'
        ' "coverage": 85}}\n```'
    )
    label = dot('Looks good {"preferred_next_label": "Approve", "outcome": "succeeded"}')
    write_workflow(
        repo,
        f"""
        digraph R {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            pick  [shape=tab, prompt="choose", dry_run.response="{pick}"]
            one   [shape=parallelogram, script="true"]
            two   [shape=tab, prompt="check", dry_run.response="{label}"]
            fix   [shape=parallelogram, script="true"]
            start -> pick
            pick -> one
            pick -> two
            two -> fix [label="Fix"]
            two -> exit [label="Approve"]
            one -> exit
            fix -> exit
        }}
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    assert edges(events) == [("start", "pick"), ("pick", "two"), ("two", "exit")]
    props = completed(events, "pick")["properties"]
    assert props["status"] == "partially_succeeded"
    assert props["suggested_next_ids"] == ["nope", "two"]
    assert props["preferred_label"] == "missing"
    assert completed(events, "two")["properties"]["preferred_label"] == "Approve"
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    context = checkpoint["context_values"]
    assert (context["tests_passed"], context["coverage"]) == (True, 85)
    assert context["last_stage"] == "two"
    reply = 'Looks good {"preferred_next_label": "Approve", "outcome": "succeeded"}'
    assert context["last_response"] == reply[:200] and context["response.two"] == reply
    status = json.loads(meta_file(repo, run_id, "nodes/pick/status.json"))
    assert status["status"] == "partially_succeeded"
    assert status["suggested_next_ids"] == ["nope", "two"]
    assert status["context_updates"]["coverage"] == 85


def test_a_fail_outcome_fails_with_its_reason(repo: Path) -> None:
    reply = dot('{"outcome": "fail", "failure_reason": "tests failed"}')
    write_workflow(
        repo,
        f"""
        digraph F {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            review [shape=tab, prompt="review", dry_run.response="{reply}"]
            start -> review -> exit
        }}
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert result["status"] == "failed"
    events = run_events(result["run_id"], repo)
    props = completed(events, "review")["properties"]
    assert (props["status"], props["error"]) == ("failed", "tests failed")
    status = json.loads(meta_file(repo, result["run_id"], "nodes/review/status.json"))
    assert status["status"] == "failed" and status["error"] == "tests failed"


def test_a_reply_without_directives_routes_by_conditions_then_weights(repo: Path) -> None:
    # JSON with no recognised field is no directive: the condition on `ask`'s outcome
    # decides, and among `then`'s unconditional edges the heavier one.
    plain = dot('Here is some data: {"name": "x", "items": [1, 2]}')
    write_workflow(
        repo,
        f"""
        digraph W {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            ask   [shape=tab, prompt="a", dry_run.response="{plain}"]
            then  [shape=tab, prompt="b", dry_run.response="{plain}"]
            light [shape=parallelogram, script="true"]
            heavy [shape=parallelogram, script="true"]
            other [shape=parallelogram, script="true"]
            start -> ask
            ask -> other [weight=9]
            ask -> then [condition="outcome=success"]
            then -> light [weight=1]
            then -> heavy [weight=5]
            light -> exit
            heavy -> exit
            other -> exit
        }}
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    assert ("ask", "then") in edges(events) and ("then", "heavy") in edges(events)
    selected = [e["properties"] for e in events if e["event"] == "edge.selected"]
    reasons = {(p["from_node"], p["to_node"]): p["reason"] for p in selected}
    assert reasons[("ask", "then")] == "condition"
    assert reasons[("then", "heavy")] == "unconditional"  # the heavier of the two
    props = completed(events, "ask")["properties"]
    assert props.get("preferred_label") is None and not props.get("suggested_next_ids")


# `check` fails on its first visit and sends the run back to `review`.
LOOP = """
digraph L {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    review [shape=tab, prompt="Review round {{ goal }}", dry_run.response="fine"]
    check [shape=parallelogram, script="test -f marker || { touch marker; exit 1; }"]
    start -> review -> check
    check -> review [condition="outcome=fail"]
    check -> exit [condition="outcome=success"]
}
"""


def test_a_repeat_visit_writes_its_own_node_files(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, LOOP)
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--goal", "two", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    clone, _ = fresh_clone(repo, tmp_path)
    for directory, visit in (("review", 1), ("review-2", 2)):
        prompt = meta_file(clone, run_id, f"nodes/{directory}/prompt.md")
        assert prompt.startswith("Goal: two\n") and "Review round two" in prompt
        # Nothing asks the model for routing JSON that the prompt did not ask for.
        assert "preferred_next_label" not in prompt and "json" not in prompt.lower()
        assert meta_file(clone, run_id, f"nodes/{directory}/response.md") == "fine"
        status = json.loads(meta_file(clone, run_id, f"nodes/{directory}/status.json"))
        assert status["visit"] == visit and status["status"] == "succeeded"
    # The second visit's preamble lists the stages before it.
    assert "- **check**: failed" in meta_file(clone, run_id, "nodes/review-2/prompt.md")
    assert meta_file(clone, run_id, "nodes/check-2/status.json")


def test_a_retried_prompt_stage_writes_its_node_files(repo: Path) -> None:
    # The first reply asks for a retry; the stage's files are those of the attempt
    # that ended it.
    server = LlmServer().start()
    try:
        server.script(Reply(text='{"outcome": "retry"}'), Reply(text="second time lucky"))
        write_workflow(
            repo,
            """
            digraph T {
                start [shape=Mdiamond]
                exit  [shape=Msquare]
                ask   [shape=tab, prompt="Say it", model="claude-sonnet-4-6", max_retries=1, retry_policy="standard"]
                start -> ask -> exit
            }
            """,
        )
        proc = run_fabro("run", "wf.fabro", "--json", cwd=repo, env=provider_env(server))
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    events = run_events(run_id, repo)
    assert [e["event"] for e in events if e["event"] == "stage.retrying"] == ["stage.retrying"]
    assert meta_file(repo, run_id, "nodes/ask/response.md") == "second time lucky"
    assert "Say it" in meta_file(repo, run_id, "nodes/ask/prompt.md")
    status = json.loads(meta_file(repo, run_id, "nodes/ask/status.json"))
    assert (status["status"], status["attempt"]) == ("succeeded", 2)


def test_the_meta_ref_holds_the_layout_the_seed_shows(repo: Path, tmp_path: Path) -> None:
    write_workflow(
        repo,
        """
        digraph G {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            big   [shape=parallelogram, script="head -c 300000 /dev/zero | tr '\\\\0' y"]
            start -> big -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    clone, _ = fresh_clone(repo, tmp_path)
    top = git(clone, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}").split()
    assert {"manifest.json", "graph.fabro", "checkpoint.json", "artifacts"} <= set(top)
    artifacts = git(
        clone, "ls-tree", "-r", "--name-only", f"refs/fabro/meta/{run_id}", "artifacts/"
    ).split()
    assert "artifacts/command.output.json" in artifacts
    assert json.loads(meta_file(clone, run_id, "artifacts/command.output.json")).startswith("yyy")


def test_the_readme_documents_what_remote_sandbox_syncing_is_here() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "remote sandbox syncing" in readme.lower()
