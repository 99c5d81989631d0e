"""MCP servers' tools for an agent session, through the official `mcp` SDK.

`open_servers` starts (stdio) or reaches (HTTP) each configured server in turn, does
the protocol handshake and lists its tools within the server's startup timeout, and
yields them as agent `Tool`s named `mcp__<server>__<tool>`. A server that cannot be
started or does not answer is reported (`agent.mcp.failed`) and left out, so the stage
goes on with the tools it has, unless the server is marked required: then
`McpRequiredError` ends the stage. Every server that did start is reported with its
tool count (`agent.mcp.ready`). A server's tools are capped (`MAX_SERVER_TOOLS`,
`MAX_SERVER_TOOL_BYTES` of schemas), the rest named in an `agent.warning`.

A server that goes away during a tool call (its process exits, its connection
closes) makes that call a tool error the model reads, and is started again once for
the calls after it.

Each server lives in a task of its own that owns its transport and session from start
to close, so its cancel scopes nest properly; the agent's tool calls reach it through
the session's streams. Leaving the block closes the sessions and stops stdio servers'
process groups, on cancellation (Ctrl-C, the stage's timeout) too.

A stdio server's environment is the SDK's short list of safe variables (PATH, HOME,
...) and the server's own `env`: the run's provider keys are not passed on. Its stderr
goes to a file in the stage's scratch dir, never onto the terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from fabro_git.agent.tools import Tool, ToolContext, ToolOutcome
from fabro_git.agent.workspace import ToolError
from fabro_git.events.catalogue import (
    AgentMcpFailed,
    AgentMcpReady,
    AgentWarning,
    McpToolSummary,
)
from fabro_git.jsondata import JsonValue
from fabro_git.llm.types import ToolSpec

if TYPE_CHECKING:
    from mcp.client.session import ClientSession
    from mcp.types import CallToolResult, PaginatedRequestParams
    from mcp.types import Tool as McpTool

    from fabro_git.agent.session import AgentSession, ToolSet
    from fabro_git.events.envelope import EventProps

# Provider tool names are at most 64 characters of [A-Za-z0-9_-].
MAX_TOOL_NAME = 64
# What one server may add to every model request: a server offering thousands of tools
# would otherwise send megabytes of schemas with each call. Tools past either bound are
# left out, in the server's order, and named in an `agent.warning`.
MAX_SERVER_TOOLS = 128
MAX_SERVER_TOOL_BYTES = 256 * 1024
# Names of left-out tools listed in that warning (the count is always given).
_LEFT_OUT_SHOWN = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class McpRequiredError(Exception):
    """A server the configuration marks required did not start."""


@dataclass(frozen=True)
class McpServerSpec:
    """One server, its configuration resolved (`{{ env.NAME }}` references filled in)."""

    name: str
    transport: str  # "stdio" or "http"
    argv: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 10.0
    tool_timeout: float = 60.0
    required: bool = False


def qualified_name(server: str, tool: str) -> str:
    """`mcp__<server>__<tool>`, other characters as `_`, cut to the providers' limit
    (with a hash of the whole, so two long names stay apart)."""
    name = f"mcp__{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"


def result_text(result: CallToolResult) -> str:
    """A tool result's content blocks as text: text as it is, other media as a marker."""
    from mcp.types import TextContent

    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif kind == "image":
            parts.append("[image content]")
        elif kind == "audio":
            parts.append("[audio content]")
        else:
            parts.append("[resource content]")
    if not parts and result.structured_content is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _error_text(exc: BaseException) -> str:
    """What went wrong, in one line: the innermost of a group, and its message."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass
class _Running:
    """One started process (or connection) of a server: its session and tools, and the
    scope that stops it."""

    session: ClientSession
    tools: list[McpTool]
    scope: trio.CancelScope


class _Server:
    """A started server, as the agent's tool calls reach it. A server that goes away
    during a call (its process exited, its connection closed) makes that call a tool
    error, and is started again once, in the same nursery, for the calls after it."""

    def __init__(
        self,
        spec: McpServerSpec,
        running: _Running,
        *,
        nursery: trio.Nursery,
        cwd: Path,
        errlog: Path | None,
        emit: Callable[[EventProps], object],
    ) -> None:
        self.spec = spec
        self.tools = running.tools
        self._running: _Running | None = running
        self._nursery = nursery
        self._cwd = cwd
        self._errlog = errlog
        self._emit = emit
        self._restarted = False
        self._lock = trio.Lock()

    async def call(
        self, name: str, tool: str, arguments: Mapping[str, JsonValue]
    ) -> CallToolResult:
        """The server's result for one call; `ToolError` if it failed to give one."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        running = self._running
        if running is None:
            raise ToolError(
                f"{name}: the MCP server {self.spec.name!r} exited earlier and was not "
                "restarted again; do without its tools"
            )
        try:
            return await running.session.call_tool(tool, dict(arguments))
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(f"{name}: the MCP server refused the call: {exc}") from exc
            lost: BaseException = exc
        except Exception as exc:
            # A broken transport, or a reply the SDK cannot read: the server's fault.
            lost = exc
        return await self._lost(name, running, _error_text(lost))

    async def _lost(self, name: str, running: _Running, error: str) -> CallToolResult:
        """The server went away during a call: start it again (once), then fail the call."""
        async with self._lock:
            if self._running is running:  # not yet handled by a concurrent call
                running.scope.cancel()
                self._running = None
                if not self._restarted:
                    self._restarted = True
                    try:
                        self._running = await self._nursery.start(
                            _serve, self.spec, self._cwd, self._errlog
                        )
                    except Exception as exc:
                        self._emit(
                            AgentMcpFailed(
                                server_name=self.spec.name,
                                error=f"exited during a tool call ({error}) and did not "
                                f"start again: {_error_text(exc)}",
                            )
                        )
                    else:
                        self._emit(
                            AgentWarning(
                                kind="mcp_server_restarted",
                                message=f"MCP server {self.spec.name!r} exited during a tool "
                                f"call ({error}); it was restarted",
                                details={"server_name": self.spec.name, "error": error},
                            )
                        )
        state = (
            "it was restarted for later calls"
            if self._running is not None
            else "it is not available for later calls"
        )
        raise ToolError(
            f"{name}: the MCP server {self.spec.name!r} went away during the call "
            f"({error}); the call may have partly run, and {state}"
        )


async def _serve(
    spec: McpServerSpec,
    cwd: Path,
    errlog: Path | None,
    *,
    task_status: trio.TaskStatus[_Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start one server and hold it open until cancelled (the stage ends, or the handed
    over scope is cancelled); `started` hands it over once its tools are listed. A
    failure before that propagates to `nursery.start`."""
    from mcp.client.session import ClientSession

    with (
        trio.CancelScope() as own,
        contextlib.ExitStack() as files,
        trio.CancelScope() as startup,
    ):
        startup.deadline = trio.current_time() + spec.startup_timeout
        async with contextlib.AsyncExitStack() as stack:
            if spec.transport == "stdio":
                from mcp.client.stdio import StdioServerParameters, stdio_client

                log = files.enter_context(open(errlog or os.devnull, "a", encoding="utf-8"))
                params = StdioServerParameters(
                    command=spec.argv[0], args=list(spec.argv[1:]), env=dict(spec.env), cwd=cwd
                )
                read, write = await stack.enter_async_context(stdio_client(params, errlog=log))
            else:
                import httpx2
                from mcp.client.streamable_http import streamable_http_client

                from fabro_git.llm.providers import tls_settings

                # The SDK's advice: a long read timeout, as a server may hold a stream. The
                # trust store is the one the model clients read, once a process.
                client = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers=dict(spec.headers),
                        timeout=httpx2.Timeout(30.0, read=300.0),
                        verify=tls_settings(),
                    )
                )
                read, write = await stack.enter_async_context(
                    streamable_http_client(spec.url, http_client=client)
                )
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            tools: list[McpTool] = []
            cursor: str | None = None
            while True:
                listed = await (
                    session.list_tools(params=_page(cursor)) if cursor else session.list_tools()
                )
                tools += listed.tools
                cursor = listed.next_cursor
                if not cursor:
                    break
            startup.deadline = math.inf
            task_status.started(_Running(session, tools, own))
            await trio.sleep_forever()
    if startup.cancelled_caught:
        raise TimeoutError(f"no answer within {spec.startup_timeout:g}s")


def _page(cursor: str) -> PaginatedRequestParams:
    from mcp.types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _tool(server: _Server, listed: McpTool, name: str) -> Tool:
    original = listed.name
    timeout = server.spec.tool_timeout
    schema = dict(listed.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})

    async def run(arguments: Mapping[str, JsonValue], context: ToolContext) -> ToolOutcome:
        with trio.move_on_after(timeout) as scope:
            result = await server.call(name, original, arguments)
        if scope.cancelled_caught:
            raise ToolError(f"{name}: the MCP server did not answer within {timeout:g}s")
        return ToolOutcome(output=result_text(result), is_error=bool(result.is_error))

    description = (
        listed.description or ""
    ).strip() or f"{original} (MCP server {server.spec.name})"
    return Tool(ToolSpec(name=name, description=description, parameters=schema), run)


@contextlib.asynccontextmanager
async def open_servers(
    specs: Sequence[McpServerSpec],
    *,
    emit: Callable[[EventProps], object],
    cwd: Path,
    log_dir: Path | None,
    visit: int = 1,
) -> AsyncIterator[list[Tool]]:
    """The tools of every server that starts, while the block runs."""
    try:
        async with trio.open_nursery() as nursery:
            tools, refused = await _start_all(nursery, specs, emit, cwd, log_dir, visit)
            if refused is None:
                try:
                    yield tools
                finally:
                    nursery.cancel_scope.cancel()
            else:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The nursery wraps what the block raised; hand it on as it was raised.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if refused is not None:
        raise McpRequiredError(refused)


async def _start_all(
    nursery: trio.Nursery,
    specs: Sequence[McpServerSpec],
    emit: Callable[[EventProps], object],
    cwd: Path,
    log_dir: Path | None,
    visit: int,
) -> tuple[list[Tool], str | None]:
    """Start the servers one after another: their tools, and why a required one failed."""
    tools: list[Tool] = []
    names: set[str] = set()
    for spec in specs:
        errlog = log_dir / f"mcp-{_UNSAFE.sub('_', spec.name)}.stderr.log" if log_dir else None
        try:
            running = await nursery.start(_serve, spec, cwd, errlog)
        except Exception as exc:
            error = _error_text(exc)
            emit(AgentMcpFailed(server_name=spec.name, error=error))
            if spec.required:
                return tools, f"MCP server {spec.name!r} is required and did not start: {error}"
            continue
        server = _Server(spec, running, nursery=nursery, cwd=cwd, errlog=errlog, emit=emit)
        announced: list[McpToolSummary] = []
        left_out: list[str] = []
        size = 0
        for listed in server.tools:
            name = qualified_name(spec.name, listed.name)
            if name in names:
                continue
            tool = _tool(server, listed, name)
            cost = len(msgspec.json.encode(tool.spec))
            if len(announced) >= MAX_SERVER_TOOLS or size + cost > MAX_SERVER_TOOL_BYTES:
                left_out.append(listed.name)
                continue
            size += cost
            names.add(name)
            tools.append(tool)
            announced.append(McpToolSummary(name=name, original_name=listed.name))
        if left_out:
            emit(
                AgentWarning(
                    kind="mcp_tools_capped",
                    message=f"MCP server {spec.name!r} offers {len(announced) + len(left_out)} "
                    f"tools; {len(left_out)} were left out (at most {MAX_SERVER_TOOLS} tools "
                    f"and {MAX_SERVER_TOOL_BYTES // 1024} KiB of schemas per server), "
                    f"from {left_out[0]!r} on",
                    details={
                        "server_name": spec.name,
                        "offered": len(announced) + len(left_out),
                        "kept": len(announced),
                        "left_out_count": len(left_out),
                        "left_out": [*left_out[:_LEFT_OUT_SHOWN]],
                    },
                )
            )
        emit(
            AgentMcpReady(
                server_name=spec.name, tool_count=len(announced), tools=announced, visit=visit
            )
        )
    return tools, None


def toolset(specs: Sequence[McpServerSpec], *, log_dir: Path | None) -> ToolSet:
    """The servers as an agent session's tool set: started when a run of the session
    starts, in its worktree, and stopped when it ends."""

    @contextlib.asynccontextmanager
    async def open_for(session: AgentSession) -> AsyncIterator[Mapping[str, Tool]]:
        async with open_servers(
            specs, emit=session.emit, cwd=session.worktree, log_dir=log_dir, visit=session.visit
        ) as tools:
            yield {tool.spec.name: tool for tool in tools}

    return open_for
