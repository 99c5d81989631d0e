"""One adapter per wire protocol, and the translation of SDK failures into `LlmError`s.

Every adapter is `async def stream(connection, target, request, sink) -> Response`: it
opens a streaming call through the official SDK (with the SDK's own retries off: the
retry loop in `fabro_git.llm.client` owns them, so every wait goes through trio and
is reported), forwards normalised events to `sink`, and returns the final response. A
stream that ends without the provider's closing event is a dropped stream.
"""

from __future__ import annotations

import email.utils
import functools
import os
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypeVar

import msgspec
import trio

from fabro_git import redact
from fabro_git.jsondata import JsonObject
from fabro_git.llm import catalogue
from fabro_git.llm.errors import (
    README_SECTION,
    AuthenticationFailed,
    ConnectionFailed,
    ContentFiltered,
    ContextTooLong,
    InvalidRequest,
    LlmError,
    MissingCredentials,
    QuotaExhausted,
    RateLimited,
    ServerError,
    StreamDropped,
    Timeout,
)
from fabro_git.llm.types import EventSink, Request, Response, Target, ToolCall

if TYPE_CHECKING:
    import ssl

    import httpx2

_Item = TypeVar("_Item")
# An SDK's open event stream: read inside `async with`, which closes its response.
_Events = TypeVar("_Events", bound=AbstractAsyncContextManager[object, bool | None])

# A local server ignores the key, but the OpenAI client insists on one.
_PLACEHOLDER_KEY = "unused"


class Connection(msgspec.Struct, frozen=True, kw_only=True):
    provider: catalogue.ProviderInfo
    api_key: str
    base_url: str | None

    def __repr__(self) -> str:  # never print the key
        return f"Connection({self.provider.name}, base_url={self.base_url!r})"


def connect(target: Target, env: Mapping[str, str]) -> Connection:
    """The credentials and endpoint for `target`, or `MissingCredentials` naming the variable."""
    info = catalogue.PROVIDERS[target.provider]
    key = catalogue.api_key(info, env)
    url = catalogue.base_url(info, env)
    if info.key_required and key is None:
        raise MissingCredentials(info.name, info.key_env)
    if url is None and info.default_base_url is None and info.api == "chat-completions":
        raise MissingCredentials(info.name, (info.base_url_env,), what="server URL")
    return Connection(provider=info, api_key=key or _PLACEHOLDER_KEY, base_url=url)


def load_sdk(api: catalogue.Api) -> None:
    """Import the SDK a protocol needs. The first import takes a second or more of CPU;
    a caller that must not stall its trio loop (or that times calls) does it up front,
    in a thread or before the loop starts."""
    if api == "anthropic":
        import anthropic  # noqa: F401
    else:
        import openai  # noqa: F401


async def ensure_sdk(api: catalogue.Api) -> None:
    """`load_sdk` in a worker thread the first time, so the trio loop keeps running."""
    import sys

    if ("anthropic" if api == "anthropic" else "openai") not in sys.modules:
        await trio.to_thread.run_sync(load_sdk, api)


async def read_to_end(
    items: AsyncIterable[_Item], handle: Callable[[_Item], Awaitable[None]]
) -> None:
    """Give each item of a stream to `handle`, and raise the first `LlmError` it raises
    once the stream has ended: after a failure the rest is read without being handled,
    so the SDK's async generators finish instead of being abandoned (trio reports
    those)."""
    failure: LlmError | None = None
    async for item in items:
        if failure is not None:
            continue
        try:
            await handle(item)
        except LlmError as err:
            failure = err
    if failure is not None:
        raise failure


def http_client(default: Callable[..., httpx2.AsyncClient], request: Request) -> httpx2.AsyncClient:
    """The HTTP client for one SDK client: the SDK's own default (`default`, its
    `DefaultAsyncHttpxClient`: its timeouts, connection limits and keep-alive), with the
    request's timeout and the process's TLS settings (`tls_settings`)."""
    return default(timeout=client_timeout(request), verify=tls_settings())


def tls_settings() -> ssl.SSLContext:
    """The TLS settings the SDKs' HTTP layer makes for a client that is given none: the
    trust store of `SSL_CERT_FILE` or `SSL_CERT_DIR` when set, else the system's, with
    certificates and host names verified. Made once a process for each trust store
    named: reading a trust store (about 150 certificates) is most of what a new client
    costs, about 60 ms of CPU on every model call.

    The HTTP layer sets the protocols it offers on the context at each connection;
    every client given it speaks HTTP/1.1 only (the SDKs' default), so all set the same."""
    return _tls_settings(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_settings(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    # `cafile` and `capath` are the cache key: the HTTP layer reads them from the
    # environment itself, as it always does.
    from httpcore2 import default_ssl_context

    return default_ssl_context()


def client_timeout(request: Request) -> float | httpx2.Timeout | None:
    """The SDK client's timeout: the request's, with reads bounded by its idle timeout."""
    if request.idle_timeout is None:
        return request.timeout
    import httpx2

    return httpx2.Timeout(request.timeout, read=request.idle_timeout)


def translate(exc: BaseException, target: Target, *, streaming: bool = False) -> LlmError | None:
    """The `LlmError` an SDK or transport exception stands for, or None if it is a bug."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    if isinstance(status, int) or ("APIError" in names and body is not None):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        # An error event inside a stream arrives on a 200 response: its body decides.
        return from_status(
            target,
            status=status if isinstance(status, int) and status >= 400 else None,
            code=error_code(body),
            message=error_message(body) or getattr(exc, "message", None) or str(exc),
            headers=headers,
        )
    if isinstance(exc, UnicodeDecodeError):
        # The SDKs decode each SSE line strictly: bytes that are not UTF-8 spoil the line.
        return StreamDropped(
            f"the response stream is not UTF-8 text: {exc}",
            provider=target.provider,
            model=target.model,
        )
    if "APITimeoutError" in names or "TimeoutException" in names:
        return Timeout("the request timed out", provider=target.provider, model=target.model)
    if "APIConnectionError" in names or "TransportError" in names:
        cause = exc.__cause__ or exc
        if streaming or "RemoteProtocolError" in {c.__name__ for c in type(cause).__mro__}:
            return StreamDropped(
                f"the response stream broke off: {_reason(cause)}",
                provider=target.provider,
                model=target.model,
            )
        return ConnectionFailed(
            f"cannot reach the provider: {_reason(cause)}",
            provider=target.provider,
            model=target.model,
        )
    return None


def _reason(exc: BaseException) -> str:
    """What the chain of causes says first: a transport error's own message is often
    empty, where its cause's (a certificate refused, a connection refused) is not."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        text = str(link).strip()
        if text:
            return text
        link = link.__cause__ or link.__context__
    return type(exc).__name__


_QUOTA_CODES = {"insufficient_quota", "billing_error", "billing_hard_limit_reached"}
_CONTEXT_CODES = {"context_length_exceeded", "request_too_large", "string_above_max_length"}
_AUTH_CODES = {"authentication_error", "permission_error", "invalid_api_key"}
_RATE_CODES = {"rate_limit_error", "rate_limit_exceeded", "rate_limited"}
_SERVER_CODES = {"overloaded_error", "api_error", "server_error", "internal_error"}


def from_status(
    target: Target,
    *,
    status: int | None,
    code: str | None,
    message: str,
    headers: Mapping[str, str],
) -> LlmError:
    """Classify a provider's error by its error code first, then its HTTP status."""
    retry_after = parse_retry_after(headers)
    error_type: type[LlmError]
    hint: str | None = None
    if code in _QUOTA_CODES or status == 402 or "credit balance is too low" in message:
        error_type = QuotaExhausted
    elif code in _CONTEXT_CODES or status == 413:
        error_type = ContextTooLong
    elif code in _AUTH_CODES or status in (401, 403):
        error_type = AuthenticationFailed
        info = catalogue.PROVIDERS[target.provider]
        hint = f"check {' or '.join(info.key_env)}; see the {README_SECTION}"
    elif code in _RATE_CODES or status == 429:
        error_type = RateLimited
    elif code in _SERVER_CODES or status is None or status >= 500 or status == 408:
        error_type = ServerError
    elif code == "content_filter":
        error_type = ContentFiltered
    else:
        error_type = InvalidRequest
    return error_type(
        message,
        provider=target.provider,
        model=target.model,
        status=status,
        retry_after=retry_after if error_type.retryable else None,
        hint=hint,
    )


def error_code(body: object) -> str | None:
    """`error.type`/`error.code` of the providers' error bodies (the SDKs pass either the
    whole body or its `error` member)."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    for source in (inner, body) if isinstance(inner, dict) else (body,):
        for key in ("code", "type"):
            value = source.get(key)
            if isinstance(value, str) and value not in ("error", "invalid_request_error"):
                return value
    return None


def error_message(body: object) -> str | None:
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    source = inner if isinstance(inner, dict) else body
    message = source.get("message")
    return message if isinstance(message, str) and message else None


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def tool_call(call_id: str, name: str, raw: str, *, extra: JsonObject | None = None) -> ToolCall:
    """A tool call from the model's raw arguments text. Arguments that are not one JSON
    object of UTF-8 text (broken JSON, a lone surrogate escape such as `\\udc80`) make
    a call marked `unreadable`: the agent answers it with a tool error the model can
    correct, instead of the stage failing. Names and ids are made safe to store."""
    arguments: JsonObject = {}
    unreadable: str | None = None
    if raw.strip():
        try:
            value = msgspec.json.decode(raw)
        except (msgspec.DecodeError, UnicodeError) as exc:
            shown = _storable(raw if len(raw) <= 200 else redact.clip(raw, 200) + "...")
            unreadable = f"{_storable(str(exc))}; the arguments were: {shown}"
        else:
            arguments = value if isinstance(value, dict) else {"value": value}
    return ToolCall(
        id=_storable(call_id),
        name=_storable(name),
        arguments=arguments,
        extra=extra,
        unreadable=unreadable,
    )


def _storable(text: str) -> str:
    """`text` with what UTF-8 cannot hold (lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


async def stream_events(
    events: _Events,
    target: Target,
    sink: EventSink,
    consume: Callable[[_Events, Target, EventSink], Awaitable[Response]],
) -> Response:
    """Consume an SDK's open event stream: say output starts, read it to its end, and
    turn what the SDK raises into an `LlmError` (a dropped stream stays what it is)."""
    from fabro_git.llm.errors import StreamDropped
    from fabro_git.llm.types import OutputStart

    await sink(OutputStart(target))
    try:
        async with events:
            return await consume(events, target, sink)
    except StreamDropped:
        raise
    except Exception as exc:
        translated = stream_failure(exc, target)
        if translated is None:
            raise
        raise translated from exc


def stream_failure(exc: Exception, target: Target) -> LlmError | None:
    """The `LlmError` a failure while reading a response stream stands for, or None if
    it is not the stream's doing. Besides what `translate` knows, a line that is not
    the provider's format (JSON cut short, or JSON of another shape) is a broken stream:
    what an endpoint sends is untrusted, and noise in it is retried, then fails the
    stage saying so, never a crash."""
    import msgspec

    from fabro_git.llm.errors import StreamDropped

    translated = translate(exc, target, streaming=True)
    if translated is not None:
        return translated
    if not isinstance(exc, ValueError | msgspec.DecodeError | AttributeError | TypeError):
        return None  # a disk, a sink or a cancellation: not the stream's doing
    return StreamDropped(
        f"the response stream is not in the provider's format: {type(exc).__name__}: {exc}",
        provider=target.provider,
        model=target.model,
    )
