"""The environment every process a run starts for its work gets: one function for all.

Command stages, setup commands, the agent's shell tool, agent CLIs, lifecycle hooks
that run in the worktree and MCP stdio servers all run with `stage_environment`: the
host's environment without

- a variable whose name looks secret, by the redactor's one rule
  (`fabro_git.redact.is_secret_name`: `*_API_KEY`, `*_TOKEN`, `*_SECRET`, `*PASSWORD*`,
  `*_CREDENTIAL(S)`, `*_KEY`, ..., less the few names in `redact.NOT_SECRET` that
  locate a tool rather than hold a secret), so a stage cannot print, commit or send a
  key it was not given; every other variable passes, `PATH`, `HOME`, `LANG`, `TERM`,
  `SSH_AUTH_SOCK` (a socket, no secret: `git push` over ssh keeps working) and the rest;
- a variable that would point git at another repository than the worktree's;

plus what the run's `[run.sandbox.env]` names (literal values, or `{{ env.NAME }}`
references resolved from the host environment when the stage starts, so a secret is
passed on only where the user says so), plus, for an agent CLI, its own provider's
key, and the process mark by which what the stage starts is found and killed when the
stage ends (`fabro_git.engine.reaper`).

A script that mentions a variable it will not get (`$NAME` or `${NAME}`) is told of in
a `run.notice` (`mentioned_stripped`), so a missing key is no mystery; only names are
ever reported, never values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from fabro_git.config.run_config import resolve_env_references
from fabro_git.engine.reaper import MARK_VARIABLE
from fabro_git.redact import is_secret_name
from fabro_git.store._gitcli import GIT_LOCATION_VARIABLES

NOTICE_CODE = "env_stripped"


def stripped_names(environ: Mapping[str, str]) -> list[str]:
    """The names of `environ` a stage does not get unless `[run.sandbox.env]` passes
    them, sorted."""
    return sorted(name for name in environ if is_secret_name(name))


def stage_environment(
    environ: Mapping[str, str] | None = None,
    *,
    sandbox: Mapping[str, str] | None = None,
    keys: Iterable[str] = (),
    mark: str | None = None,
) -> dict[str, str]:
    """`environ` (the host's by default) without secret-named and git location
    variables, with the host's values of `keys` (an agent CLI's provider key), then
    `sandbox` (`[run.sandbox.env]`, its references resolved from `environ`: an unset one
    is a `ConfigError` naming the field), and `mark` as `FABRO_PROCESS_MARK`."""
    host = os.environ if environ is None else environ
    env = {
        name: value
        for name, value in host.items()
        if not is_secret_name(name) and name not in GIT_LOCATION_VARIABLES
    }
    env.pop(MARK_VARIABLE, None)
    env.update((name, host[name]) for name in keys if name in host)
    env.update(resolve_sandbox(sandbox or {}, host))
    if mark is not None:
        env[MARK_VARIABLE] = mark
    return env


def resolve_sandbox(table: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """`[run.sandbox.env]` with its `{{ env.NAME }}` references filled in."""
    return {
        name: resolve_env_references(value, environ, f"run.sandbox.env.{name}")
        for name, value in table.items()
    }


# `$NAME`, `${NAME}` and `${NAME...}` (a default, a length, ...).
_REFERENCE = re.compile(r"\$\{?#?([A-Za-z_][A-Za-z0-9_]*)")


def mentioned_stripped(
    script: str, environ: Mapping[str, str], sandbox: Mapping[str, str] | None = None
) -> list[str]:
    """The variables `script` mentions (`$NAME`, `${NAME}`) that the host has but the
    stage's environment leaves out, sorted."""
    passed = set(sandbox or {})
    named = {m.group(1) for m in _REFERENCE.finditer(script)}
    return sorted(
        name for name in named if name in environ and is_secret_name(name) and name not in passed
    )


def stripped_notice(names: list[str], where: str) -> str:
    """The `run.notice` message for variables a script mentions but will not get."""
    listed = ", ".join(names)
    return (
        f"{where} mentions {listed}, which it does not get: variables whose names look "
        "secret are kept from stages; pass one on with [run.sandbox.env] in the run "
        f'config, e.g. {names[0]} = "{{{{ env.{names[0]} }}}}"'
    )
