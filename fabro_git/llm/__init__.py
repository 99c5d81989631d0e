"""The LLM provider layer: one request and stream shape over every provider.

Prompt and agent stages build a `Request`, pick a `Target` (provider and model) with
`resolve.resolve_target`, and call `client.complete`, which streams typed events to a
callback, retries transient failures and fails over along a fallback chain. The
provider SDKs (`anthropic`, `openai`) are imported only when a call is made, so
importing this package stays cheap.
"""
