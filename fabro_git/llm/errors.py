"""Errors of a model call, classified by what should happen next.

Each error says whether retrying the same call can help (`retryable`: rate limits, 5xx,
timeouts, dropped streams), whether another provider can (`failover`: everything
retryable plus an exhausted quota), and its `failure_class` in the engine's vocabulary.
They are `FabroError`s: a missing key or a rejected one is something the user fixes.
"""

from __future__ import annotations

from fabro_git.errors import ConfigError, FabroError
from fabro_git.jsondata import JsonObject

README_SECTION = 'README section "Using a real model"'


class LlmError(FabroError):
    """A model call failed. `str()` names the provider and model and quotes its error."""

    kind = "llm_error"
    failure_class = "deterministic"
    retryable = False
    failover = False

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        model: str,
        status: int | None = None,
        retry_after: float | None = None,
        hint: str | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.status = status
        self.retry_after = retry_after
        self.detail = message
        where = f"{provider}/{model}"
        status_text = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{where}{status_text}: {message}", hint=hint)

    def to_dict(self) -> JsonObject:
        """The serialised form carried by `agent.llm.retry` and `agent.error`."""
        data: JsonObject = {
            "kind": self.kind,
            "message": self.detail,
            "provider": self.provider,
            "model": self.model,
            "failure_class": self.failure_class,
            "retryable": self.retryable,
        }
        if self.status is not None:
            data["status"] = self.status
        if self.retry_after is not None:
            data["retry_after"] = self.retry_after
        return data


class TransientError(LlmError):
    """Worth another try: the same call may succeed in a moment."""

    failure_class = "transient_infra"
    retryable = True
    failover = True


class RateLimited(TransientError):
    kind = "rate_limited"


class ServerError(TransientError):
    kind = "server_error"


class Timeout(TransientError):
    kind = "timeout"


class ConnectionFailed(TransientError):
    kind = "connection_error"


class StreamDropped(TransientError):
    kind = "stream_dropped"


class QuotaExhausted(LlmError):
    """The account's quota or credit is spent: it will not come back within a retry,
    but another provider has its own."""

    kind = "quota_exhausted"
    failure_class = "budget_exhausted"
    failover = True


class ContextTooLong(LlmError):
    kind = "context_length"
    failure_class = "budget_exhausted"


class AuthenticationFailed(LlmError):
    """The provider refused the key (401/403)."""

    kind = "authentication"


class InvalidRequest(LlmError):
    kind = "invalid_request"


class ContentFiltered(LlmError):
    kind = "content_filter"


class MissingCredentials(ConfigError):
    """No key for a provider that needs one, or no URL for a local server."""

    failure_class = "deterministic"

    def __init__(self, provider: str, variables: tuple[str, ...], *, what: str = "API key") -> None:
        self.provider = provider
        self.variables = variables
        names = " or ".join(variables)
        super().__init__(
            f"no {what} for provider {provider!r}: set {names}",
            hint=f"see the {README_SECTION}; `git fabro model test` checks the setup",
        )


class UnknownModel(ConfigError):
    """A model or provider name that is not in the catalogue."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        self.suggestions = suggestions
        hint = "did you mean " + ", ".join(suggestions) + "?" if suggestions else None
        super().__init__(message, hint=hint or "`git fabro model list` shows the catalogue")
