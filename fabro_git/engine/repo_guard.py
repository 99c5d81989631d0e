"""The user's repository stays the user's: what a stage may not change behind the run.

A run's worktrees are linked worktrees of the user's repository, so a stage's program
shares its config, hooks, `info/` files and refs. `RepoGuard.around` takes the state of
those before a stage and compares it after: a change fails the stage with a message
naming each change, and is put back (the config and `hooks/` files as their bytes were;
a ref by compare-and-swap, only if it is still where the stage left it). The run's own
refs (`fabro/<kind>/<run id>`) are the run's business and are not compared, but the
run branch and the meta ref are checked against what the recorder holds: a stage that
deleted or moved them sees them restored (or the stage fails with the `git update-ref`
line that does it).

Races with the user's own git, which the man page documents: a change the user makes
in their checkout while a stage runs is seen as the stage's. Two things are let be:
another run's refs while that run is live (each run owns its refs), and remote-tracking
refs (`refs/remotes/`, which every fetch rewrites; an editor fetches in the
background), which are reported as a notice. The branch checked out in one of the
user's own worktrees is reported but not moved back when it only moved forward: it may
be the user's commit, and the message gives the line that moves it back.

Stages cannot push unless the workflow says `allow_push=true` (on the node or the
graph): `push_environment` rewrites every push URL to a path that names the setting,
through git's environment config, so a push fails as an ordinary git error the stage
sees. A stage that clears its environment can get round it; the guard is against the
agent that pushes because it was told to "ship it", not against a hostile program.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import trio

from fabro_git.engine import lock
from fabro_git.engine.outcome import DETERMINISTIC, FAILED, Outcome
from fabro_git.errors import FabroError
from fabro_git.events.catalogue import NoticeLevel, RunNotice
from fabro_git.store import repo_state
from fabro_git.store.repo_state import RepoState, StateReader

if TYPE_CHECKING:
    from fabro_git.engine.ledger import Ledger
    from fabro_git.engine.stage import StageRequest
    from fabro_git.workflow import Graph, Node

ALLOW_PUSH = "allow_push"
# Where a refused push goes: a path no repository is at, whose name says why.
REFUSED_PUSH_URL = "/git fabro refused this push: the stage has allow_push off/"


def allows_push(graph: Graph, node: Node) -> bool:
    """`allow_push` of the node, else of the graph; off unless the workflow says so."""
    return node.get_bool(ALLOW_PUSH, graph.get_bool(ALLOW_PUSH, False))


def push_environment(
    env: Mapping[str, str], git_dir: Path | None, *, allow_push: bool
) -> dict[str, str]:
    """The variables to add to a stage's environment `env` so that its pushes fail
    (none when `allow_push`). They are git's environment config entries, added after any
    `env` already holds: a `pushInsteadOf` for every remote's URL (the whole URL, so it
    wins over a shorter rewrite of the user's) and for any URL at all, and an
    `insteadOf` for every explicit `pushurl`, which git rewrites with those."""
    if allow_push:
        return {}
    try:
        config = (git_dir / "config").read_bytes() if git_dir is not None else b""
    except OSError:
        config = b""
    urls, pushurls = repo_state.remote_push_urls(config)
    entries = [("pushInsteadOf", url) for url in ["", *urls]]
    # Not a pushurl that is also some remote's url: `insteadOf` would break its fetch.
    entries += [("insteadOf", url) for url in pushurls if url not in urls]
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        count = 0
    added: dict[str, str] = {}
    for key, value in entries:
        added[f"GIT_CONFIG_KEY_{count}"] = f"url.{REFUSED_PUSH_URL}.{key}"
        added[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    added["GIT_CONFIG_COUNT"] = str(count)
    return added


def _owned_pattern(run_id: str) -> re.Pattern[str]:
    """A ref of the run's own: `refs/heads/fabro/run/<id>`, `refs/fabro/<kind>/<id>…`,
    and their remote-tracking copies."""
    return re.compile(rf"(^|/)fabro/[^/]+/{re.escape(run_id)}(/|$)")


_RUN_OF_REF = re.compile(r"(?:^|/)fabro/[^/]+/([^/]+)")


class RepoGuard:
    """One per run: the state before the first of the stages in flight, and the checks
    after each."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.git_dir = Path(ledger.repo.git_dir)
        self.reader = StateReader(self.git_dir)
        self._owned = _owned_pattern(ledger.run_id)
        # Stages running side by side (parallel branches, a parallel node around them)
        # share one baseline, taken when the first of them started.
        self._baseline: RepoState | None = None
        self._in_flight = 0
        # The look before the next stage, taken on the checkpoint's trip (`look_ahead`).
        self._ahead: LookAhead | None = None

    def look_ahead(self, node_id: str, work: Callable[[], object] | None) -> None:
        """Blocking, on the trip that checkpoints the stage before `node_id`'s: the state
        its look before would take, and `work` (the caller's own look before it). The
        stage takes them (`ahead_of`) when nothing but the engine ran in between: no
        hook started, no other stage in flight. That spares it a trip to a worker
        thread. A change made in that moment (by the user, or by an event sink at the
        stage's `stage.started`) is then seen as the stage's, as one made while it runs
        is."""
        self._ahead = None
        hooks = self.ledger.hooks_seen()
        if hooks is None or self._in_flight:
            return
        try:
            state = self.reader.take()
            taken = work() if work is not None else None
        except Exception:  # the stage looks for itself, and meets it there
            return
        self._ahead = LookAhead(node_id, state, taken, hooks)

    def ahead_of(self, node_id: str) -> LookAhead | None:
        """The look before `node_id`'s stage taken at the last checkpoint, if it still
        stands; taken once (a retry looks again)."""
        ahead, self._ahead = self._ahead, None
        if (
            ahead is None
            or ahead.node_id != node_id
            or self._in_flight
            or self.ledger.hooks_seen() != ahead.hooks
        ):
            return None
        return ahead

    async def around(
        self,
        request: StageRequest,
        call: Callable[[], Awaitable[Outcome]],
        *,
        before: Callable[[], object] | None = None,
        after: Callable[[], object] | None = None,
        ahead: LookAhead | None = None,
    ) -> Outcome:
        """Run the stage (`call`), then fail it if it changed the user's repository.

        `before` and `after` are blocking work of the caller's (what an attempt takes of
        the worktree around the stage), done on the worker thread that takes the state
        before and after: a trip to a worker thread costs a hand-off each way, which a
        loaded machine makes dear. `after` is done only when the stage ended (not when
        it was cut off), and its exception, if any, is raised once the check is done.
        With `ahead` (see `ahead_of`) the state before is the one it holds, and no trip
        is made before the stage."""
        self._ahead = None
        if ahead is not None and self._in_flight == 0:
            self._baseline = ahead.state
        elif self._in_flight == 0 or self._baseline is None:
            self._baseline = await trio.to_thread.run_sync(self._take_then, before)
        elif before is not None:
            await trio.to_thread.run_sync(before)
        self._in_flight += 1
        try:
            result = await call()
        except BaseException:
            self._in_flight -= 1
            with trio.CancelScope(shield=True):
                # Cut off (Ctrl-C, the watchdog): still put the config and hooks back.
                problems, _ = await self._check(request)
            if problems:
                self._notice(request, problems)
            raise
        self._in_flight -= 1
        problems, after_error = await self._check(request, after)
        try:
            own = self._own_refs(request)
        except RunRefLost as err:
            problems.append(str(err))
        else:
            if own:
                self._notice(request, own, level="warn")
        if after_error is not None:
            raise after_error
        if not problems:
            return result
        message = f"{request.node_id} changed the user's repository: " + "; ".join(problems)
        if result.status == FAILED and result.error:
            message = f"{result.error}\n{message}"
        return Outcome.failure(message, DETERMINISTIC, notes=result.notes)

    def _take_then(self, work: Callable[[], object] | None) -> RepoState:
        """The state now, then `work` (on the same worker thread)."""
        state = self.reader.take()
        if work is not None:
            work()
        return state

    def _notice(
        self, request: StageRequest, problems: list[str], *, level: NoticeLevel = "error"
    ) -> None:
        request.emit(
            RunNotice(
                level=level,
                code="repository_changed",
                message=f"{request.node_id}: " + "; ".join(problems),
            )
        )

    async def _check(
        self, request: StageRequest, after: Callable[[], object] | None = None
    ) -> tuple[list[str], Exception | None]:
        """The changes found (and put back), and what `after` raised, if anything."""
        baseline = self._baseline
        assert baseline is not None

        def take() -> tuple[RepoState, Exception | None]:
            state = self.reader.take()
            if after is not None:
                try:
                    after()
                except Exception as err:  # raised once the check is done
                    return state, err
            return state, None

        state, after_error = await trio.to_thread.run_sync(take)
        if state == baseline:
            return [], after_error
        try:
            return await self._compare(baseline, state, request), after_error
        except OSError as err:
            return [f"the repository changed, and putting it back failed: {err}"], after_error

    async def _compare(
        self, baseline: RepoState, after: RepoState, request: StageRequest
    ) -> list[str]:
        problems: list[str] = []
        config_changes = repo_state.config_changes(baseline.config, after.config)
        config_changes += [
            f"{change} (config.worktree)"
            for change in repo_state.config_changes(baseline.worktree_config, after.worktree_config)
        ]
        if config_changes:
            repo_state.put_back_file(self.git_dir / "config", baseline.config)
            repo_state.put_back_file(self.git_dir / "config.worktree", baseline.worktree_config)
            problems.append(
                "the repository's git config: " + ", ".join(config_changes) + " — put back"
            )
        for area, name in (
            ("hooks", "hooks"),
            ("info", "info/ files"),
            ("modules", "submodules' config and hooks"),
        ):
            before_tree: dict[str, repo_state.Entry] = getattr(baseline, area)
            after_tree: dict[str, repo_state.Entry] = getattr(after, area)
            if area == "modules":
                after_tree = repo_state.of_known_modules(before_tree, after_tree)
            changes = repo_state.tree_changes(before_tree, after_tree)
            if changes:
                repo_state.put_back_tree(self.git_dir / area, before_tree, after_tree)
                problems.append(f"the repository's {name}: " + ", ".join(changes) + " — put back")
        refs, remote_refs, kept = await self.ledger.call(
            self._ref_changes, baseline.refs, after.refs
        )
        if refs:
            problems.append("refs outside the run: " + ", ".join(refs))
        if remote_refs:
            self._notice(request, ["refs changed: " + ", ".join(remote_refs)], level="info")
        # What was let be is the new baseline for the stages still in flight.
        self._baseline = baseline if not kept else _with_refs(baseline, kept)
        if self._in_flight == 0:
            self._baseline = None
        return problems

    def _ref_changes(
        self, before: dict[str, str], after: dict[str, str]
    ) -> tuple[list[str], list[str], dict[str, str | None]]:
        """(changes to report, remote-tracking changes, refs let be at their new values)."""
        repo = self.ledger.repo
        reported: list[str] = []
        remote: list[str] = []
        kept: dict[str, str | None] = {}
        checked_out = self._checked_out_branches()
        for name in sorted(set(before) | set(after)):
            old, new = before.get(name), after.get(name)
            if old == new or self._owned.search(name):
                continue
            if name.startswith("refs/remotes/"):
                remote.append(f"{name} {_move(old, new)}")
                kept[name] = new
                continue
            other = _RUN_OF_REF.search(name.removeprefix("refs/"))
            if other is not None:
                # Another run's: its own process moves it, live or just finished, so it
                # is never put back; a change no fabro process logged is told of.
                if not self._by_fabro(other.group(1), name):
                    remote.append(f"{name} {_move(old, new)} (another run's ref)")
                kept[name] = new
                continue
            what = f"{name} {_move(old, new)}"
            if _symbolic(old) or _symbolic(new):
                reported.append(f"{what} (not put back: a symbolic ref)")
                kept[name] = new
                continue
            if (
                name in checked_out
                and old is not None
                and new is not None
                and _is_ancestor(repo, old, new)
            ):
                reported.append(
                    f"{what} (left as it is: it is checked out and moved forward, which may "
                    f"be your own commit; if not, `{shlex.join(['git', 'update-ref', name, old, new])}`)"
                )
                kept[name] = new
                continue
            if old is None:
                # Not deleted: it may hold the stage's work (a branch it checked out).
                reported.append(
                    f"{what} (left; `{shlex.join(['git', 'update-ref', '-d', name])}` removes it)"
                )
                kept[name] = new
                continue
            try:
                repo.update_ref(
                    name, old, old=new, message="fabro: put back after a stage moved it"
                )
            except FabroError as err:
                line = f"git update-ref {name} {old}"
                reported.append(f"{what} (could not put it back: {err.message}; `{line}` does)")
                kept[name] = new
                continue
            reported.append(f"{what} — put back")
        return reported, remote, kept

    def _checked_out_branches(self) -> set[str]:
        """The branches checked out in worktrees that are not one of fabro's runs."""
        heads = [self.git_dir / "HEAD", *self.git_dir.glob("worktrees/*/HEAD")]
        found: set[str] = set()
        for head in heads:
            try:
                text = head.read_text().strip()
            except OSError:
                continue
            if text.startswith("ref: refs/heads/") and "/fabro/" not in text:
                found.add(text.removeprefix("ref: "))
        return found

    def _by_fabro(self, run_id: str, ref: str) -> bool:
        """Whether another run's ref was last moved by a fabro process: the run is
        live, or the ref's newest reflog line is one of ours."""
        if lock.is_live(self.git_dir, run_id):
            return True
        try:
            with open(self.git_dir / "logs" / ref, "rb") as log:
                log.seek(0, 2)
                log.seek(max(0, log.tell() - 4096))
                last = log.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        except OSError:
            return False
        return b"\tfabro" in last

    # -- the run's own refs ------------------------------------------------------------

    def _own_refs(self, request: StageRequest) -> list[str]:
        """Put back the run branch and the meta ref if the stage deleted them, or moved
        the meta ref; what was done, for a notice. A put-back that fails raises, naming
        the `git update-ref` line."""
        recorder = self.ledger.recorder
        repo = self.ledger.repo
        done: list[str] = []
        wanted = (
            (recorder.meta_ref, recorder.meta_tip, True),
            (recorder.run_ref, recorder.run_tip, False),
        )
        for ref, expected, exact in wanted:
            if expected is None:
                continue
            found = repo.read_ref(ref)
            if found == expected or (found is not None and not exact):
                continue  # the run branch may move on: the checkpoint adopts or refuses
            try:
                repo.update_ref(
                    ref, expected, old=found, message=f"fabro: put back after {request.node_id}"
                )
            except FabroError as err:
                raise RunRefLost(
                    f"{request.node_id} {'deleted' if found is None else 'moved'} {ref}, and "
                    f"it could not be put back: {err.message}",
                    hint=f"put it back with `git update-ref {ref} {expected}`, then "
                    f"`git fabro resume {self.ledger.run_id}`",
                ) from err
            done.append(
                f"{ref} was {'deleted' if found is None else 'moved to ' + found[:12]} "
                f"by the stage; put back at {expected[:12]}"
            )
        return done


class LookAhead(NamedTuple):
    """The look before a stage, taken early (`RepoGuard.look_ahead`): for the stage of
    `node_id`, the repository's `state`, what the caller's own work returned, and the
    count of hooks started then."""

    node_id: str
    state: RepoState
    taken: object
    hooks: int


class RunRefLost(FabroError):
    """A stage took away one of the run's own refs and it could not be put back."""


def _move(old: str | None, new: str | None) -> str:
    if old is None:
        return f"created at {_short(new)}"
    if new is None:
        return f"deleted (was {_short(old)})"
    return f"moved {_short(old)} → {_short(new)}"


def _short(value: str | None) -> str:
    return value if value is None or _symbolic(value) else value[:12]  # type: ignore[return-value]


def _symbolic(value: str | None) -> bool:
    return value is not None and value.startswith("ref: ")


def _is_ancestor(repo: object, old: str, new: str) -> bool:
    from fabro_git.store.repo import GitRepo

    assert isinstance(repo, GitRepo)
    try:
        return repo.is_ancestor(old, new)
    except FabroError:
        return False


def _with_refs(state: RepoState, kept: dict[str, str | None]) -> RepoState:
    import msgspec

    refs = dict(state.refs)
    for name, value in kept.items():
        if value is None:
            refs.pop(name, None)
        else:
            refs[name] = value
    return msgspec.structs.replace(state, refs=refs)
