"""`git fabro completion bash|zsh|fish`: shell completion scripts.

The commands and their options are written into the script from the CLI's own
definition when it is printed, so they cannot drift from it; only what lives in the
repository (run ids, workflow names, a run's checkpoints, remotes) is asked for while
completing, through the hidden `git fabro __complete KIND`, which reads refs and a
commit per run and never opens the engine.

`git fabro <TAB>` goes through git's own completion: git's bash script calls
`_git_fabro`, zsh's `_git` calls `_git-fabro`, and fish's git completion is given
conditions on the `fabro` token. `git-fabro <TAB>` is completed too.
"""

from __future__ import annotations

import sys
from typing import Any

SHELLS = ("bash", "zsh", "fish")
# Positional arguments that name a run, a workflow file or a fixed word.
RUN_COMMANDS = ("resume", "attach", "logs", "log", "inspect", "fork", "rewind", "dump", "diff")
CHECKPOINT_COMMANDS = ("fork", "rewind", "diff")
WORKFLOW_COMMANDS = ("run", "validate", "graph")
REMOTE_COMMANDS = ("fetch", "push")
# Options whose value is a path.
PATH_OPTIONS = ("-o", "--output", "--goal-file")


def run(shell: str) -> int:
    from fabro_git.errors import ConfigError

    if shell not in SHELLS:
        raise ConfigError(f"no completion for {shell!r}; the shells are bash, zsh and fish")
    surface = _surface()
    script = {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](surface)
    sys.stdout.write(script)
    return 0


def words(kind: str, arg: str | None = None) -> int:
    """Print completion words of `kind`, one a line. Errors print nothing: a completion
    must never put a message in the middle of the user's command line."""
    try:
        found = _words(kind, arg)
    except Exception:  # see the docstring
        return 0
    sys.stdout.write("".join(f"{w}\n" for w in found))
    return 0


def _words(kind: str, arg: str | None) -> list[str]:
    if kind == "examples":
        from fabro_git.cli._examples import example_names

        return example_names()
    from pathlib import Path

    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    if kind == "runs":
        ids = list(reversed(runrefs.list_run_ids(repo)))
        names: dict[str, None] = {}
        for run_id in ids:
            sha = repo.read_ref(runrefs.meta_ref(run_id))
            if sha is not None:
                name = repo.commit_info(sha).trailers.get("Fabro-Workflow")
                if name:
                    names[name] = None
        return ids + list(names)
    if kind == "checkpoints" and arg:
        from fabro_git.cli._timeline import timeline

        run_id = runrefs.resolve_run_id(repo, arg, remote=None)
        return list(dict.fromkeys(e.label for e in timeline(repo, run_id, base_sha=None)))
    return []


# -- the CLI's shape --------------------------------------------------------------------


def _surface() -> dict[str, list[str]]:
    """command (or `group sub`) -> its options, for every visible command."""
    import typer.main

    from fabro_git.cli.app import app

    group: Any = typer.main.get_command(app)
    out: dict[str, list[str]] = {}
    for name, command in sorted(group.commands.items()):
        if getattr(command, "hidden", False):
            continue
        subs = getattr(command, "commands", None)
        if subs:
            out[name] = []
            for sub_name, sub in sorted(subs.items()):
                if not getattr(sub, "hidden", False):
                    out[f"{name} {sub_name}"] = _options(sub)
        else:
            out[name] = _options(command)
    return out


def _options(command: Any) -> list[str]:
    opts = ["-h", "--help"]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        opts += [o for o in param.opts if o.startswith("-")]
    return opts


def _top(surface: dict[str, list[str]]) -> list[str]:
    return [name for name in surface if " " not in name]


def _subs(surface: dict[str, list[str]], group: str) -> list[str]:
    return [name.split(" ", 1)[1] for name in surface if name.startswith(group + " ")]


def _examples() -> list[str]:
    from fabro_git.cli._examples import example_names

    return example_names()


# -- bash ---------------------------------------------------------------------------------


def _bash(surface: dict[str, list[str]]) -> str:
    groups = sorted({name.split(" ", 1)[0] for name in surface if " " in name})
    option_cases = "\n".join(
        f'        "{name}") opts="{" ".join(opts)}" ;;' for name, opts in surface.items()
    )
    group_cases = "\n".join(f'        {g}) subs="{" ".join(_subs(surface, g))}" ;;' for g in groups)
    return _BASH.format(
        commands=" ".join(_top(surface)),
        groups="|".join(groups) or "__none__",
        option_cases=option_cases,
        group_cases=group_cases,
        examples=" ".join(_examples()),
        run_commands="|".join(RUN_COMMANDS),
        checkpoint_commands="|".join(CHECKPOINT_COMMANDS),
        workflow_commands="|".join(WORKFLOW_COMMANDS),
        remote_commands="|".join(REMOTE_COMMANDS),
        path_options="|".join(PATH_OPTIONS),
        shells=" ".join(SHELLS),
    )


_BASH = r"""# bash completion for git fabro; generated by `git fabro completion bash`.
# Load it from ~/.bashrc:  source <(git fabro completion bash)
# or save it as ~/.local/share/bash-completion/completions/git-fabro

# $1: the index of the first word after `fabro`; $2: how to call git fabro.
__git_fabro_complete() {{
    local start=$1 call=$2
    local cur=${{words[cword]}} prev=${{words[cword-1]}}
    local cmd="" sub="" i positional=0 key opts subs list
    for ((i = start; i < cword; i++)); do
        case ${{words[i]}} in
        -*) ;;
        *)
            if [[ -z $cmd ]]; then
                cmd=${{words[i]}}
            elif [[ -z $sub && $cmd == @({groups}) ]]; then
                sub=${{words[i]}}
            else
                case ${{words[i-1]}} in
                {path_options}|--format|--direction|--goal|-V|--input|--answer|--label|--model|--provider|-n|--tail|--since) ;;
                *) ((positional++)) ;;
                esac
            fi
            ;;
        esac
    done
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "{commands} -h --help --version" -- "$cur"))
        return
    fi
    if [[ $cmd == @({groups}) && -z $sub ]]; then
        case $cmd in
{group_cases}
        esac
        COMPREPLY=($(compgen -W "$subs -h --help" -- "$cur"))
        return
    fi
    case $prev in
    {path_options})
        compopt -o filenames 2>/dev/null
        __git_fabro_files=1
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    esac
    if [[ $cur == -* ]]; then
        key=$cmd${{sub:+ $sub}}
        opts=""
        case $key in
{option_cases}
        esac
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi
    case $cmd in
    {run_commands})
        if ((positional == 0)); then
            list=$($call __complete runs 2>/dev/null)
        elif [[ $cmd == @({checkpoint_commands}) ]] && ((positional == 1)); then
            list=$($call __complete checkpoints "${{words[cword-1]}}" 2>/dev/null)
        fi
        COMPREPLY=($(compgen -W "$list" -- "$cur"))
        ;;
    {workflow_commands})
        compopt -o filenames 2>/dev/null
        __git_fabro_files=1
        COMPREPLY=($(compgen -W "{examples}" -- "$cur") $(compgen -f -- "$cur"))
        ;;
    {remote_commands})
        if ((positional == 0)); then
            COMPREPLY=($(compgen -W "$(git remote 2>/dev/null)" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$($call __complete runs 2>/dev/null)" -- "$cur"))
        fi
        ;;
    completion)
        COMPREPLY=($(compgen -W "{shells}" -- "$cur"))
        ;;
    esac
}}

# Called by git's own completion for `git fabro ...`. git completes with `-o nospace`
# and ends each word with a space itself; so do we, except after file names.
_git_fabro() {{
    local start=$(( ${{__git_cmd_idx:-1}} + 1 )) __git_fabro_files=0
    __git_fabro_complete "$start" "__git fabro"
    if ((!__git_fabro_files && ${{#COMPREPLY[@]}})); then
        COMPREPLY=("${{COMPREPLY[@]/%/ }}")
    fi
}}

# For `git-fabro ...` typed directly.
_git_fabro_standalone() {{
    local cur prev words cword
    if declare -F _get_comp_words_by_ref >/dev/null; then
        _get_comp_words_by_ref -n =: cur prev words cword
    else
        words=("${{COMP_WORDS[@]}}")
        cword=$COMP_CWORD
    fi
    local __git_fabro_files=0
    __git_fabro_complete 1 "git-fabro"
}}

# `__git` is git's helper that keeps `git -C DIR` in effect; without git's script
# loaded, call git directly.
if ! declare -F __git >/dev/null; then
    __git() {{ git "$@"; }}
fi
complete -o bashdefault -o default -F _git_fabro_standalone git-fabro
"""


# -- zsh ----------------------------------------------------------------------------------


def _zsh(surface: dict[str, list[str]]) -> str:
    groups = sorted({name.split(" ", 1)[0] for name in surface if " " in name})
    option_cases = "\n".join(
        f"        ({_zsh_quote(name)}) opts=({' '.join(opts)}) ;;" for name, opts in surface.items()
    )
    group_cases = "\n".join(
        f"        ({g}) subs=({' '.join(_subs(surface, g))}) ;;" for g in groups
    )
    return _ZSH.format(
        commands=" ".join(_top(surface)),
        groups="|".join(groups) or "__none__",
        option_cases=option_cases,
        group_cases=group_cases,
        examples=" ".join(_examples()),
        run_commands="|".join(RUN_COMMANDS),
        checkpoint_commands="|".join(CHECKPOINT_COMMANDS),
        workflow_commands="|".join(WORKFLOW_COMMANDS),
        remote_commands="|".join(REMOTE_COMMANDS),
        path_options="|".join(PATH_OPTIONS),
        shells=" ".join(SHELLS),
    )


def _zsh_quote(name: str) -> str:
    return name.replace(" ", "\\ ")


_ZSH = r"""#compdef git-fabro
# zsh completion for git fabro; generated by `git fabro completion zsh`.
# Load it from ~/.zshrc (after compinit):  source <(git fabro completion zsh)
# or save it as _git-fabro in a directory of $fpath.
# zsh's git completion calls _git-fabro for `git fabro ...`.

_git-fabro() {{
    local cmd="" sub="" key i positional=0
    local -a opts subs list
    for ((i = 2; i < CURRENT; i++)); do
        case ${{words[i]}} in
        (-*) ;;
        (*)
            if [[ -z $cmd ]]; then
                cmd=${{words[i]}}
            elif [[ -z $sub && $cmd == ({groups}) ]]; then
                sub=${{words[i]}}
            else
                case ${{words[i-1]}} in
                ({path_options}|--format|--direction|--goal|-V|--input|--answer|--label|--model|--provider|-n|--tail|--since) ;;
                (*) (( positional++ )) ;;
                esac
            fi
            ;;
        esac
    done
    local cur=${{words[CURRENT]}} prev=${{words[CURRENT-1]}}
    if [[ -z $cmd ]]; then
        compadd -- {commands} -h --help --version
        return
    fi
    if [[ $cmd == ({groups}) && -z $sub ]]; then
        case $cmd in
{group_cases}
        esac
        compadd -- $subs -h --help
        return
    fi
    case $prev in
    ({path_options}) _files; return ;;
    esac
    if [[ $cur == -* ]]; then
        key="$cmd${{sub:+ $sub}}"
        case $key in
{option_cases}
        esac
        compadd -- $opts
        return
    fi
    case $cmd in
    ({run_commands})
        if (( positional == 0 )); then
            list=(${{(f)"$(git fabro __complete runs 2>/dev/null)"}})
        elif [[ $cmd == ({checkpoint_commands}) ]] && (( positional == 1 )); then
            list=(${{(f)"$(git fabro __complete checkpoints ${{words[CURRENT-1]}} 2>/dev/null)"}})
        fi
        compadd -- $list
        ;;
    ({workflow_commands})
        compadd -- {examples}
        _files
        ;;
    ({remote_commands})
        if (( positional == 0 )); then
            compadd -- ${{(f)"$(git remote 2>/dev/null)"}}
        else
            compadd -- ${{(f)"$(git fabro __complete runs 2>/dev/null)"}}
        fi
        ;;
    (completion) compadd -- {shells} ;;
    esac
}}

# Saved in $fpath as `_git-fabro`, this file is the autoloaded function's body: do the
# completion. Sourced, register it.
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _git-fabro "$@"
elif (( $+functions[compdef] )); then
    compdef _git-fabro git-fabro
fi
"""


# -- fish ---------------------------------------------------------------------------------


def _fish(surface: dict[str, list[str]]) -> str:
    lines = [
        "# fish completion for git fabro; generated by `git fabro completion fish`.",
        "# Load it:  git fabro completion fish | source",
        "# or save it as ~/.config/fish/completions/git-fabro.fish",
        "",
        "# The words after `fabro` (or `git-fabro`) on the command line, without the current one.",
        "function __git_fabro_args",
        "    set -l tokens (commandline -opc)",
        "    set -l index (contains -i -- fabro $tokens; or contains -i -- git-fabro $tokens)",
        "    or return 1",
        "    # fish reverses a range whose start is past its end: test first",
        "    if test $index -lt (count $tokens)",
        "        printf '%s\\n' $tokens[(math $index + 1)..-1]",
        "    end",
        "end",
        "",
        "function __git_fabro_in",
        "    set -l args (__git_fabro_args)",
        "    or return 1",
        "    set -l words (string match -v -- '-*' $args)",
        "    test (count $words) -eq 0; and test (count $argv) -eq 0; and return 0",
        "    test (count $words) -gt 0; and contains -- $words[1] $argv",
        "end",
        "",
        "function __git_fabro_positional",
        "    set -l words (string match -v -- '-*' (__git_fabro_args))",
        "    math (count $words) - 1",
        "end",
        "",
        "function __git_fabro_last_word",
        "    set -l words (string match -v -- '-*' (__git_fabro_args))",
        "    echo $words[-1]",
        "end",
        "",
    ]
    top = _top(surface)
    lines.append("complete -c git-fabro -f  # files only where a command takes one")
    for target in ("git-fabro", "git"):
        guard = (
            "__git_fabro_in"
            if target == "git-fabro"
            else "__git_fabro_in; and __fish_seen_subcommand_from fabro"
        )
        lines.append(f"complete -c {target} -f -n '{guard}' -a '{' '.join(top)}'")
        for name, opts in surface.items():
            head, _, sub = name.partition(" ")
            condition = f"__git_fabro_in {head}"
            if target == "git":
                condition += "; and __fish_seen_subcommand_from fabro"
            if sub:
                condition += f"; and __fish_seen_subcommand_from {sub}"
            elif head in {n.split(" ", 1)[0] for n in surface if " " in n}:
                lines.append(
                    f"complete -c {target} -f -n '{condition}; and test (__git_fabro_positional) -eq 0'"
                    f" -a '{' '.join(_subs(surface, head))}'"
                )
            for opt in opts:
                flag = f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
                takes_path = " -r -F" if opt in PATH_OPTIONS else ""
                lines.append(f"complete -c {target} -n '{condition}' {flag}{takes_path}")
        fabro = "; and __fish_seen_subcommand_from fabro" if target == "git" else ""
        call = "git fabro"
        lines += [
            f"complete -c {target} -f -n '__git_fabro_in {' '.join(RUN_COMMANDS)}{fabro};"
            f" and test (__git_fabro_positional) -eq 0' -a '({call} __complete runs 2>/dev/null)'",
            f"complete -c {target} -f -n '__git_fabro_in {' '.join(CHECKPOINT_COMMANDS)}{fabro};"
            f" and test (__git_fabro_positional) -eq 1'"
            f" -a '({call} __complete checkpoints (__git_fabro_last_word) 2>/dev/null)'",
            f"complete -c {target} -F -n '__git_fabro_in {' '.join(WORKFLOW_COMMANDS)}{fabro}' -a '{' '.join(_examples())}'",
            f"complete -c {target} -f -n '__git_fabro_in {' '.join(REMOTE_COMMANDS)}{fabro};"
            f" and test (__git_fabro_positional) -eq 0' -a '(git remote 2>/dev/null)'",
            f"complete -c {target} -f -n '__git_fabro_in completion{fabro}' -a '{' '.join(SHELLS)}'",
        ]
    return "\n".join(lines) + "\n"
