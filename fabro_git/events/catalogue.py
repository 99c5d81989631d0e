"""Typed properties for every event git fabro emits, named exactly as the seed names them.

One Struct per event, in the seed's order, with the seed's property names and field
order. The rules that keep the JSON faithful to the contract:

- A property the seed marks required has **no default**. Encoding with `omit_defaults`
  drops a field equal to its default, so a default would silently drop a required empty
  list (`suggested_next_ids: []`) or `in_place: false`. Without a default the caller
  must pass it and it is always written.
- A `T?` property is `T | None = None`, so it is omitted when unset, never `null`.
- An array the seed says is "omitted when empty" (`causes`, `tools`) defaults to an empty
  list, which `omit_defaults` drops: exactly the documented behaviour.
- A string whose values the seed enumerates is a `Literal`.

`tests/events/test_event_catalogue.py` reads the seed and checks every Struct here against it,
so a change on either side that breaks the contract fails the tests.

Not modelled, on the seed's own word: `cli.ensure.*` (legacy, no longer emitted) and
`agent.skill.expanded` (no longer a durable run event). The tests' contract checks
still accept them in old logs.
"""

from typing import ClassVar, Literal

import msgspec

from fabro_git.events.envelope import EventProps
from fabro_git.jsondata import JsonObject, JsonValue

__all__ = [
    "CATALOGUE",
    "NOT_EMITTED",
    "AgentCompactionCompleted",
    "AgentCompactionStarted",
    "AgentError",
    "AgentFailover",
    "AgentInput",
    "AgentLlmRetry",
    "AgentLoopDetected",
    "AgentMcpFailed",
    "AgentMcpReady",
    "AgentMemoryLoaded",
    "AgentMessage",
    "AgentOutputReplace",
    "AgentOutputStart",
    "AgentProcessingEnd",
    "AgentReasoningDelta",
    "AgentSessionActivated",
    "AgentSessionDeactivated",
    "AgentSessionEnded",
    "AgentSessionStarted",
    "AgentSkillActivated",
    "AgentSkillsDiscovered",
    "AgentSteeringInjected",
    "AgentSubClosed",
    "AgentSubCompleted",
    "AgentSubFailed",
    "AgentSubSpawned",
    "AgentTextDelta",
    "AgentToolCompleted",
    "AgentToolOutputDelta",
    "AgentToolStarted",
    "AgentTurnLimit",
    "AgentWarning",
    "AssetCaptured",
    "CheckpointCompleted",
    "CheckpointFailed",
    "EdgeSelected",
    "FailureClass",
    "GitCommit",
    "GitFetch",
    "GitPush",
    "GitReset",
    "InterviewCompleted",
    "InterviewStarted",
    "InterviewTimeout",
    "LoopRestart",
    "McpToolSummary",
    "MemoryFile",
    "MetadataSnapshotCompleted",
    "MetadataSnapshotFailed",
    "MetadataSnapshotStarted",
    "NoticeLevel",
    "ParallelBranchCompleted",
    "ParallelBranchResult",
    "ParallelBranchStarted",
    "ParallelCompleted",
    "ParallelStarted",
    "PullRequestCreated",
    "PullRequestFailed",
    "PullRequestLinked",
    "PullRequestRef",
    "PullRequestUnlinked",
    "RunCompleted",
    "RunCreated",
    "RunFailed",
    "RunInterrupt",
    "RunNotice",
    "RunStarted",
    "RunSteer",
    "SandboxCleanupCompleted",
    "SandboxCleanupFailed",
    "SandboxCleanupStarted",
    "SandboxFailed",
    "SandboxGitCompleted",
    "SandboxGitFailed",
    "SandboxGitStarted",
    "SandboxInitialized",
    "SandboxInitializing",
    "SandboxReady",
    "SandboxSnapshotCreating",
    "SandboxSnapshotFailed",
    "SandboxSnapshotPulling",
    "SandboxSnapshotReady",
    "SetupCommandCompleted",
    "SetupCommandStarted",
    "SetupCompleted",
    "SetupFailed",
    "SetupStarted",
    "SkillSource",
    "SkillSummary",
    "SnapshotFailureKind",
    "SnapshotPhase",
    "SshReady",
    "StageCompleted",
    "StageFailed",
    "StagePrompt",
    "StageRetrying",
    "StageStarted",
    "StageStatus",
    "StageUsage",
    "SubgraphCompleted",
    "SubgraphStarted",
    "TokenUsage",
    "WatchdogTimeout",
]

StageStatus = Literal["succeeded", "failed", "partially_succeeded", "skipped"]
FailureClass = Literal[
    "transient_infra",
    "deterministic",
    "budget_exhausted",
    "compilation_loop",
    "canceled",
    "structural",
]
NoticeLevel = Literal["info", "warn", "error"]
SnapshotPhase = Literal["init", "checkpoint", "finalize"]
SnapshotFailureKind = Literal["load_state", "write", "push"]
SkillSource = Literal["slash", "tool"]


class _Nested(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Base of nested property objects (`usage`, branch results, …)."""


# ---------------------------------------------------------------------------- nested


class TokenUsage(_Nested, kw_only=True):
    """Aggregate usage (`run.completed.usage`) and per-message usage (`agent.message`)."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    reasoning_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    speed: str | None = None
    raw: JsonObject | None = None


class StageUsage(_Nested, kw_only=True):
    """Usage of one stage (`stage.completed.usage`): carries the model and cost."""

    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    speed: str | None = None
    cost: float | None = None


class ParallelBranchResult(_Nested, kw_only=True):
    """One entry of `parallel.completed.results`: id, status, isolated context updates."""

    id: str
    status: StageStatus
    context_updates: JsonObject


class McpToolSummary(_Nested, kw_only=True):
    name: str
    original_name: str


class MemoryFile(_Nested, kw_only=True):
    path: str
    byte_count: int
    loaded_bytes: int
    truncated: bool


class SkillSummary(_Nested, kw_only=True):
    name: str
    description: str


class PullRequestRef(_Nested, kw_only=True):
    provider: str
    html_url: str
    number: int
    owner: str | None = None
    repo: str | None = None
    title: str | None = None
    base_branch: str | None = None
    head_branch: str | None = None


# ---------------------------------------------------------------------------- run


class RunCreated(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.created"
    settings: JsonObject
    graph: JsonObject
    workflow_source: str | None = None
    workflow_config: str | None = None
    labels: dict[str, str]
    run_dir: str
    source_directory: str | None = None
    repo_origin_url: str | None = None
    base_branch: str | None = None
    workflow_slug: str | None = None
    db_prefix: str | None = None
    provenance: JsonObject
    manifest_blob: str | None = None
    pre_run_git: JsonObject | None = None
    fork_source_ref: JsonObject | None = None
    in_place: bool


class RunStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.started"
    name: str
    base_branch: str | None = None
    base_sha: str | None = None
    run_branch: str | None = None
    worktree_dir: str | None = None
    goal: str | None = None


class RunCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.completed"
    duration_ms: int
    artifact_count: int
    status: StageStatus
    total_cost: float | None = None
    final_git_commit_sha: str | None = None
    usage: TokenUsage | None = None


class RunFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.failed"
    error: str
    duration_ms: int
    git_commit_sha: str | None = None


class RunNotice(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.notice"
    level: NoticeLevel
    code: str
    message: str


class RunInterrupt(EventProps, kw_only=True):
    """No properties; the requester goes in the envelope's `actor`."""

    NAME: ClassVar[str] = "run.interrupt"


class RunSteer(EventProps, kw_only=True):
    NAME: ClassVar[str] = "run.steer"
    text: str


class MetadataSnapshotStarted(EventProps, kw_only=True):
    """Checkpoint snapshots are stage-scoped (node_id, node_label, stage_id); others not."""

    NAME: ClassVar[str] = "metadata.snapshot.started"
    phase: SnapshotPhase
    branch: str


class MetadataSnapshotCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "metadata.snapshot.completed"
    phase: SnapshotPhase
    branch: str
    duration_ms: int
    entry_count: int
    bytes: int
    commit_sha: str


class MetadataSnapshotFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "metadata.snapshot.failed"
    phase: SnapshotPhase
    branch: str
    duration_ms: int
    failure_kind: SnapshotFailureKind
    error: str
    causes: list[str] = msgspec.field(default_factory=list)
    commit_sha: str | None = None
    entry_count: int | None = None
    bytes: int | None = None


# ---------------------------------------------------------------------------- stage


class StageStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "stage.started"
    index: int
    handler_type: str
    attempt: int
    max_attempts: int


class StageCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "stage.completed"
    index: int
    duration_ms: int
    status: StageStatus
    preferred_label: str | None = None
    suggested_next_ids: list[str]
    usage: StageUsage | None = None
    error: str | None = None
    failure_class: FailureClass | None = None
    failure_signature: str | None = None
    context_updates: JsonObject | None = None
    jump_to_node: str | None = None
    context_values: JsonObject | None = None
    node_visits: dict[str, int] | None = None
    loop_failure_signatures: dict[str, int] | None = None
    restart_failure_signatures: dict[str, int] | None = None
    response: str | None = None
    notes: str | None = None
    files_touched: list[str]
    attempt: int
    max_attempts: int


class StageFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "stage.failed"
    index: int
    error: str
    failure_class: FailureClass
    failure_signature: str | None = None
    will_retry: bool


class StageRetrying(EventProps, kw_only=True):
    NAME: ClassVar[str] = "stage.retrying"
    index: int
    attempt: int
    max_attempts: int
    delay_ms: int


class StagePrompt(EventProps, kw_only=True):
    NAME: ClassVar[str] = "stage.prompt"
    text: str


# ---------------------------------------------------------------------------- parallel


class ParallelStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "parallel.started"
    visit: int
    branch_count: int


class ParallelBranchStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "parallel.branch.started"
    index: int


class ParallelBranchCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "parallel.branch.completed"
    index: int
    duration_ms: int
    status: StageStatus


class ParallelCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "parallel.completed"
    visit: int
    duration_ms: int
    success_count: int
    failure_count: int
    results: list[ParallelBranchResult]


# ---------------------------------------------------------------------------- interview


class InterviewStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "interview.started"
    question: str
    question_type: str


class InterviewCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "interview.completed"
    question: str
    answer: str
    duration_ms: int


class InterviewTimeout(EventProps, kw_only=True):
    NAME: ClassVar[str] = "interview.timeout"
    question: str
    duration_ms: int


# ---------------------------------------------------------------------------- checkpoint


class CheckpointCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "checkpoint.completed"
    status: StageStatus
    git_commit_sha: str | None = None
    diff: str | None = None


class CheckpointFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "checkpoint.failed"
    error: str


# ---------------------------------------------------------------------------- git


class GitCommit(EventProps, kw_only=True):
    NAME: ClassVar[str] = "git.commit"
    sha: str


class GitPush(EventProps, kw_only=True):
    NAME: ClassVar[str] = "git.push"
    branch: str
    success: bool


class GitFetch(EventProps, kw_only=True):
    NAME: ClassVar[str] = "git.fetch"
    branch: str
    success: bool


class GitReset(EventProps, kw_only=True):
    NAME: ClassVar[str] = "git.reset"
    sha: str


# ---------------------------------------------------------------------------- routing


class EdgeSelected(EventProps, kw_only=True):
    NAME: ClassVar[str] = "edge.selected"
    from_node: str
    to_node: str
    label: str | None = None
    condition: str | None = None
    reason: str
    preferred_label: str | None = None
    suggested_next_ids: list[str]
    stage_status: StageStatus
    is_jump: bool


class LoopRestart(EventProps, kw_only=True):
    NAME: ClassVar[str] = "loop.restart"
    from_node: str
    to_node: str


# ---------------------------------------------------------------------------- agent
# Stage-scoped agent events carry node_id, node_label, stage_id, session_id and
# parent_session_id in the envelope; session lifecycle events carry only the session ids.

# The agent events that are not stage-scoped: they omit node_id, node_label, stage_id.
UNSCOPED_EVENTS = frozenset({"agent.session.started", "agent.session.ended"})


class AgentSessionStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.session.started"
    provider: str | None = None
    model: str | None = None


class AgentSessionActivated(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.session.activated"
    thread_id: str | None = None
    provider: str | None = None
    model: str | None = None
    capabilities: list[str] | None = None
    visit: int | None = None


class AgentSessionDeactivated(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.session.deactivated"
    visit: int | None = None


class AgentSessionEnded(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.session.ended"


class AgentProcessingEnd(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.processing.end"


class AgentInput(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.input"
    text: str


class AgentOutputStart(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.output.start"


class AgentOutputReplace(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.output.replace"
    text: str
    reasoning: str | None = None


class AgentMessage(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.message"
    text: str
    model: str
    usage: TokenUsage
    tool_call_count: int


# Characters of one reply's text that its events carry at most. A longer reply (a 50 MB
# plan) would otherwise be written into the event log twice more, as deltas and as
# agent.message, beside its response.md and its offloaded context value.
EVENT_TEXT_LIMIT = 100_000
# Characters of one tool call's output its deltas carry at most (its whole output, cut to
# a head and tail, is in agent.tool.completed).
TOOL_OUTPUT_STREAM_LIMIT = 1_000_000


class AgentTextDelta(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.text.delta"
    STREAMED: ClassVar[bool] = True
    STREAM_LIMIT: ClassVar[int | None] = EVENT_TEXT_LIMIT
    delta: str


class AgentReasoningDelta(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.reasoning.delta"
    STREAMED: ClassVar[bool] = True
    delta: str


class AgentToolStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.tool.started"
    tool_name: str
    tool_call_id: str
    arguments: JsonObject


class AgentToolOutputDelta(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.tool.output.delta"
    STREAMED: ClassVar[bool] = True
    STREAM_LIMIT: ClassVar[int | None] = TOOL_OUTPUT_STREAM_LIMIT
    delta: str


class AgentToolCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.tool.completed"
    tool_name: str
    tool_call_id: str
    output: JsonValue
    is_error: bool


class AgentError(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.error"
    error: JsonObject


class AgentWarning(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.warning"
    kind: str
    message: str
    details: JsonObject


class AgentLoopDetected(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.loop.detected"


class AgentTurnLimit(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.turn.limit"
    max_turns: int


class AgentSteeringInjected(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.steering.injected"
    text: str


class AgentCompactionStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.compaction.started"
    estimated_tokens: int
    context_window_size: int


class AgentCompactionCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.compaction.completed"
    original_turn_count: int
    preserved_turn_count: int
    summary_token_estimate: int
    tracked_file_count: int


class AgentLlmRetry(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.llm.retry"
    provider: str
    model: str
    attempt: int
    delay_secs: float
    error: JsonObject


class AgentSubSpawned(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.sub.spawned"
    agent_id: str
    depth: int
    task: str


class AgentSubCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.sub.completed"
    agent_id: str
    depth: int
    success: bool
    turns_used: int


class AgentSubFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.sub.failed"
    agent_id: str
    depth: int
    error: JsonObject


class AgentSubClosed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.sub.closed"
    agent_id: str
    depth: int


class AgentMcpReady(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.mcp.ready"
    server_name: str
    tool_count: int
    tools: list[McpToolSummary] = msgspec.field(default_factory=list)
    visit: int


class AgentMcpFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.mcp.failed"
    server_name: str
    error: str


class AgentMemoryLoaded(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.memory.loaded"
    provider_profile: str
    files: list[MemoryFile]
    total_loaded_bytes: int
    budget_bytes: int
    visit: int


class AgentSkillsDiscovered(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.skills.discovered"
    provider_profile: str
    source_dirs: list[str]
    skills: list[SkillSummary]
    visit: int


class AgentSkillActivated(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.skill.activated"
    skill_name: str
    source: SkillSource
    visit: int


class AgentFailover(EventProps, kw_only=True):
    NAME: ClassVar[str] = "agent.failover"
    from_provider: str
    from_model: str
    to_provider: str
    to_model: str
    error: str


# ---------------------------------------------------------------------------- subgraph


class SubgraphStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "subgraph.started"
    start_node: str


class SubgraphCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "subgraph.completed"
    steps_executed: int
    status: StageStatus
    duration_ms: int


# ---------------------------------------------------------------------------- sandbox


class SandboxInitializing(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.initializing"
    provider: str


class SandboxReady(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.ready"
    provider: str
    duration_ms: int
    name: str | None = None
    cpu: float | None = None
    memory: float | None = None
    url: str | None = None


class SandboxFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.failed"
    provider: str
    error: str
    duration_ms: int


class SandboxInitialized(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.initialized"
    working_directory: str
    provider: str
    identifier: str | None = None
    repo_cloned: bool | None = None
    clone_origin_url: str | None = None
    clone_branch: str | None = None


class SandboxCleanupStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.cleanup.started"
    provider: str


class SandboxCleanupCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.cleanup.completed"
    provider: str
    duration_ms: int


class SandboxCleanupFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.cleanup.failed"
    provider: str
    error: str


class SandboxSnapshotPulling(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.snapshot.pulling"
    name: str


class SandboxSnapshotCreating(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.snapshot.creating"
    name: str


class SandboxSnapshotReady(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.snapshot.ready"
    name: str
    duration_ms: int


class SandboxSnapshotFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.snapshot.failed"
    name: str
    error: str
    causes: list[str] = msgspec.field(default_factory=list)


class SandboxGitStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.git.started"
    url: str
    branch: str | None = None


class SandboxGitCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.git.completed"
    url: str
    duration_ms: int


class SandboxGitFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "sandbox.git.failed"
    url: str
    error: str


# ---------------------------------------------------------------------------- setup


class SetupStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "setup.started"
    command_count: int


class SetupCommandStarted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "setup.command.started"
    command: str
    index: int


class SetupCommandCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "setup.command.completed"
    command: str
    index: int
    exit_code: int
    duration_ms: int


class SetupCompleted(EventProps, kw_only=True):
    NAME: ClassVar[str] = "setup.completed"
    duration_ms: int


class SetupFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "setup.failed"
    command: str
    index: int
    exit_code: int
    stderr: str


# ---------------------------------------------------------------------------- pull requests


class PullRequestCreated(EventProps, kw_only=True):
    NAME: ClassVar[str] = "pull_request.created"
    pr_url: str
    pr_number: int
    draft: bool


class PullRequestLinked(EventProps, kw_only=True):
    NAME: ClassVar[str] = "pull_request.linked"
    pull_request: PullRequestRef


class PullRequestUnlinked(EventProps, kw_only=True):
    NAME: ClassVar[str] = "pull_request.unlinked"
    pull_request: PullRequestRef


class PullRequestFailed(EventProps, kw_only=True):
    NAME: ClassVar[str] = "pull_request.failed"
    error: str


# ---------------------------------------------------------------------------- misc


class AssetCaptured(EventProps, kw_only=True):
    NAME: ClassVar[str] = "asset.captured"
    attempt: int
    node_slug: str
    path: str
    mime: str
    content_md5: str
    content_sha256: str
    bytes: int


class SshReady(EventProps, kw_only=True):
    NAME: ClassVar[str] = "ssh.ready"
    ssh_command: str


class WatchdogTimeout(EventProps, kw_only=True):
    NAME: ClassVar[str] = "watchdog.timeout"
    idle_seconds: int


CATALOGUE: dict[str, type[EventProps]] = {
    cls.NAME: cls
    for cls in (
        RunCreated,
        RunStarted,
        RunCompleted,
        RunFailed,
        RunNotice,
        RunInterrupt,
        RunSteer,
        MetadataSnapshotStarted,
        MetadataSnapshotCompleted,
        MetadataSnapshotFailed,
        StageStarted,
        StageCompleted,
        StageFailed,
        StageRetrying,
        StagePrompt,
        ParallelStarted,
        ParallelBranchStarted,
        ParallelBranchCompleted,
        ParallelCompleted,
        InterviewStarted,
        InterviewCompleted,
        InterviewTimeout,
        CheckpointCompleted,
        CheckpointFailed,
        GitCommit,
        GitPush,
        GitFetch,
        GitReset,
        EdgeSelected,
        LoopRestart,
        AgentSessionStarted,
        AgentSessionActivated,
        AgentSessionDeactivated,
        AgentSessionEnded,
        AgentProcessingEnd,
        AgentInput,
        AgentOutputStart,
        AgentOutputReplace,
        AgentMessage,
        AgentTextDelta,
        AgentReasoningDelta,
        AgentToolStarted,
        AgentToolOutputDelta,
        AgentToolCompleted,
        AgentError,
        AgentWarning,
        AgentLoopDetected,
        AgentTurnLimit,
        AgentSteeringInjected,
        AgentCompactionStarted,
        AgentCompactionCompleted,
        AgentLlmRetry,
        AgentSubSpawned,
        AgentSubCompleted,
        AgentSubFailed,
        AgentSubClosed,
        AgentMcpReady,
        AgentMcpFailed,
        AgentMemoryLoaded,
        AgentSkillsDiscovered,
        AgentSkillActivated,
        AgentFailover,
        SubgraphStarted,
        SubgraphCompleted,
        SandboxInitializing,
        SandboxReady,
        SandboxFailed,
        SandboxInitialized,
        SandboxCleanupStarted,
        SandboxCleanupCompleted,
        SandboxCleanupFailed,
        SandboxSnapshotPulling,
        SandboxSnapshotCreating,
        SandboxSnapshotReady,
        SandboxSnapshotFailed,
        SandboxGitStarted,
        SandboxGitCompleted,
        SandboxGitFailed,
        SetupStarted,
        SetupCommandStarted,
        SetupCommandCompleted,
        SetupCompleted,
        SetupFailed,
        PullRequestCreated,
        PullRequestLinked,
        PullRequestUnlinked,
        PullRequestFailed,
        AssetCaptured,
        SshReady,
        WatchdogTimeout,
    )
}

# Documented in the seed, deliberately without a Struct (see the module docstring).
NOT_EMITTED: frozenset[str] = frozenset(
    {"cli.ensure.started", "cli.ensure.completed", "cli.ensure.failed", "agent.skill.expanded"}
)
