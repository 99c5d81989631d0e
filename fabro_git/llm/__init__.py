"""The LLM provider layer: one request and stream shape over every provider.

Prompt and agent stages build a `types.Request`, pick a `types.Target` (provider and
model) with `resolve.resolve_target`, and call `client.complete`, which streams typed
events to a callback, retries transient failures and fails over along a fallback
chain. The provider SDKs (`anthropic`, `openai`) are imported only when a call is
made, in a worker thread, so importing this package stays cheap. In a stage:

    target = resolve_target([node_choice, stylesheet_choice, cli_choice, config_choice], env)
    response = await complete(
        request, target, fallbacks=fallback_targets(config_fallbacks),
        sink=forward,              # emits usage.stream_event(event) when it is not None
        on_retry=emit, on_failover=emit,  # agent.llm.retry, agent.failover
    )
    emit(usage.message_event(response))   # agent.message

An `errors.LlmError` carries the engine's `failure_class` and `to_dict()` for
`agent.error`; `errors.MissingCredentials` and `errors.UnknownModel` are user errors.
"""

# Where a run finds the LLM slot limiter its batch serves (`fabro_git.llm.slots`); named
# here so that a run without one never imports that module.
SLOTS_VARIABLE = "FABRO_LLM_SLOTS"
