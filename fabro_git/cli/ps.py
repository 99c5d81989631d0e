"""`git fabro ps`: every run in this repository, read from the meta refs' trailers.

The meta ref's tip commit says almost everything (status, workflow, node, times); a
run's labels are in its manifest, one blob more, read only when a run has any to show
or a `--filter label=...` asks. Listing a thousand runs stays well under a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fabro_git.cli import _colour as colour
from fabro_git.cli._runs import RunRow, all_rows, format_ms, format_tokens

FILTER_KEYS = ("status", "workflow", "label")


def parse_filters(filters: list[str]) -> list[tuple[str, str]]:
    """`--filter KEY=VALUE` as (key, value) pairs; `label.NAME=VALUE` is `label=NAME=VALUE`."""
    from fabro_git.errors import ConfigError

    parsed = []
    for text in filters:
        key, sep, value = text.partition("=")
        if key.startswith("label."):
            key, value = "label", f"{key[6:]}={value}"
        if not sep or key not in FILTER_KEYS or not value:
            raise ConfigError(
                f"--filter {text!r}: expected KEY=VALUE with KEY one of {', '.join(FILTER_KEYS)}",
                hint="for example --filter status=failed, --filter workflow=hello, --filter label=team=core",
            )
        if key == "label" and "=" not in value:
            raise ConfigError(f"--filter {text!r}: a label filter is label=NAME=VALUE")
        if key == "status":
            value = _statuses(text, value)
        parsed.append((key, value))
    return parsed


def _statuses(text: str, value: str) -> str:
    """The statuses `status=A,B` names, each checked: a typo would match no run, and
    say nothing."""
    from fabro_git.engine.reader import RUN_STATUSES
    from fabro_git.errors import ConfigError
    from fabro_git.suggest import close_names

    hint = f"use one or more of {', '.join(RUN_STATUSES)}, separated by commas"
    wanted = [part.strip() for part in value.split(",") if part.strip()]
    if not wanted:
        raise ConfigError(f"--filter {text!r}: no status given", hint=hint)
    for status in wanted:
        if status not in RUN_STATUSES:
            close = close_names(status, RUN_STATUSES)
            raise ConfigError(
                f"--filter {text!r}: unknown status {status!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                hint=hint,
            )
    return ",".join(wanted)


def matches(row: RunRow, filters: list[tuple[str, str]], labels: dict[str, str]) -> bool:
    """All filters hold (AND): status is one of a comma list, the workflow contains the
    text, each label has the value."""
    for key, value in filters:
        if key == "status" and row.status not in value.split(","):
            return False
        if key == "workflow" and value not in row.workflow:
            return False
        if key == "label":
            name, _, wanted = value.partition("=")
            if labels.get(name) != wanted:
                return False
    return True


def run(*, json_output: bool, filters: list[str] | None = None) -> int:
    from fabro_git.events.render import format_cost
    from fabro_git.store.repo import GitRepo

    wanted = parse_filters(filters or [])
    repo = GitRepo.discover(Path.cwd())
    rows = []
    labels: dict[str, dict[str, str]] = {}
    for row in all_rows(repo, labels=True):
        labels[row.run_id] = row.labels
        if matches(row, wanted, row.labels):
            rows.append(row)
    out = sys.stdout
    if json_output:
        for row in rows:
            out.write(json.dumps({**row.to_json(), "labels": labels[row.run_id]}) + "\n")
        return 0
    if not rows:
        if wanted:
            print("no run matches the filters", file=sys.stderr)
        else:
            print(
                "no runs in this repository; start one with `git fabro run WORKFLOW`",
                file=sys.stderr,
            )
        return 0
    spent = sum(r.cost or 0.0 for r in rows)
    table = _table(rows, labels, spent=spent)
    # Every cell may come from a fetched run: shown through the one sanitiser, on one line.
    from fabro_git.terminal import printable

    table = [tuple(printable(cell, one_line=True) for cell in line) for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    on = colour.wanted(out)
    for number, line in enumerate(table):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(line)]
        if number == 0:
            cells = [colour.paint(cell, "bold", on) for cell in cells]
        else:
            cells[2] = colour.status(line[2], on, width=widths[2])
        out.write("  ".join(cells).rstrip() + "\n")
    if spent:
        # What the runs listed cost together, under the table.
        out.write(
            f"total {format_cost(spent)} over {len(rows)} run{'s' if len(rows) != 1 else ''}\n"
        )
    return 0


def _table(
    rows: list[RunRow], labels: dict[str, dict[str, str]], *, spent: float
) -> list[tuple[str, ...]]:
    """The listing's header and rows: tokens, cost and labels only when a run has any."""
    from fabro_git.events.render import format_cost

    header: tuple[str, ...] = ("RUN ID", "WORKFLOW", "STATUS", "NODE", "STARTED", "DURATION")
    table: list[tuple[str, ...]] = [header] + [
        (
            r.run_id,
            r.workflow,
            r.status,
            r.node or "-",
            r.started[:19].replace("T", " "),
            format_ms(r.duration_ms),
        )
        for r in rows
    ]
    if any(any(r.tokens) for r in rows):
        table = [(*table[0], "TOKENS")] + [
            (*line, format_tokens(sum(r.tokens)) if any(r.tokens) else "-")
            for line, r in zip(table[1:], rows, strict=True)
        ]
    if spent:
        table = [(*table[0], "COST")] + [
            (*line, format_cost(r.cost) if r.cost else "-")
            for line, r in zip(table[1:], rows, strict=True)
        ]
    if any(labels[r.run_id] for r in rows):
        table = [table[0] + ("LABELS",)] + [
            (*line, ",".join(f"{k}={v}" for k, v in labels[r.run_id].items()) or "-")
            for line, r in zip(table[1:], rows, strict=True)
        ]
    return table
