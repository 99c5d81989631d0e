"""`git fabro completion bash|zsh|fish`: shell completion scripts.

The commands and their options are written into the script from the CLI's own
definition when it is printed, so they cannot drift from it; only what lives in the
repository (run ids, batch ids, workflow names, a run's checkpoints, remotes) is asked
for while completing, through the hidden `git fabro __complete KIND`
(`complete_words.py`), which starts without the CLI's app and lists refs through git.

`git fabro <TAB>` goes through git's own completion: git's bash script calls
`_git_fabro`, zsh's `_git` calls `_git-fabro`, and fish's git completion is given
conditions on the `fabro` token. `git-fabro <TAB>` is completed too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import typer
from typer import _click  # the click that typer vendors and its classes speak

SHELLS = ("bash", "zsh", "fish")
# What an argument's metavar names, and so what completes it: a run, one of its stages
# (`NODE[@VISIT]`, completed with the checkpoints of the run before it), a remote, a
# workflow file or name, a shell. Every command whose help says RUN gets run ids, and any
# option whose help says BATCH batch ids. `batch`'s words are a workflow, or `status`
# and then a batch id.
KINDS = {
    "RUN": "runs",
    "RUN...": "runs",
    "RUN[:PATH]": "runs",
    "NODE[@VISIT]": "checkpoints",
    "REMOTE": "remotes",
    "WORKFLOW": "workflows",
    "WORKFLOW | status BATCH": "workflow-or-batch",
    "BATCH": "batches",
    "FILE": "workflows",
    "FILE...": "workflows",
    "SHELL": "shells",
}
# Options whose value is a path.
PATH_OPTIONS = ("-o", "--output", "--goal-file", "--inputs")


def run(shell: str, cli: _click.Command) -> int:
    """Print the script for `shell`, written from `cli`, the click group of `git fabro`."""
    from fabro_git.errors import ConfigError

    if shell not in SHELLS:
        raise ConfigError(f"no completion for {shell!r}; the shells are bash, zsh and fish")
    commands = _commands(cli)
    script = {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](_surface(commands), commands)
    sys.stdout.write(script)
    return 0


# -- the CLI's shape --------------------------------------------------------------------


def _surface(commands: dict[str, _click.Command]) -> dict[str, list[str]]:
    """command (or `group sub`) -> its options, for every visible command."""
    return {
        name: [] if _subcommands(command) else _options(command)
        for name, command in commands.items()
    }


def _commands(group: _click.Command) -> dict[str, _click.Command]:
    """command (or `group sub`) -> its click command, for every visible command."""
    out: dict[str, _click.Command] = {}
    for name, command in sorted(_subcommands(group).items()):
        if command.hidden:
            continue
        out[name] = command
        for sub_name, sub in sorted(_subcommands(command).items()):
            if not sub.hidden:
                out[f"{name} {sub_name}"] = sub
    return out


def _subcommands(command: _click.Command) -> Mapping[str, _click.Command]:
    """A group's commands by name; {} for a plain command."""
    return command.commands if isinstance(command, typer.core.TyperGroup) else {}


def _positions(commands: dict[str, _click.Command]) -> list[tuple[str, str, str]]:
    """(command, position, kind) for each positional argument that completes to
    something: position is its index among the positional words after the command, or
    `N*` for a list that takes every word from N on. Exact positions come first, so a
    shell's first matching pattern wins."""
    exact, rest = [], []
    for name, command in commands.items():
        index = 0
        for param in command.params:
            if param.param_type_name != "argument":
                continue
            kind = KINDS.get(str(param.metavar or ""))
            if kind and param.nargs == -1:
                rest.append((name, f"{index}*", kind))
            elif kind:
                exact.append((name, str(index), kind))
            index += 1
    return exact + rest


def _option_values(commands: dict[str, _click.Command]) -> tuple[list[str], dict[str, str]]:
    """The options that take a value (so the word after one is no positional), and
    those whose value completes to something, with its kind."""
    valued: set[str] = set()
    kinds: dict[str, str] = {}
    for command in commands.values():
        for param in command.params:
            if not isinstance(param, typer.core.TyperOption) or param.is_flag or param.count:
                continue
            valued.update(param.opts)
            kind = KINDS.get(str(param.metavar or ""))
            if kind in ("runs", "remotes", "batches"):
                kinds.update(dict.fromkeys(param.opts, kind))
    return sorted(valued), kinds


def _options(command: _click.Command) -> list[str]:
    opts = ["-h", "--help"]
    for param in command.params:
        if isinstance(param, typer.core.TyperOption) and param.hidden:
            continue
        opts += [o for o in param.opts if o.startswith("-")]
    return opts


def _top(surface: dict[str, list[str]]) -> list[str]:
    return [name for name in surface if " " not in name]


def _subs(surface: dict[str, list[str]], group: str) -> list[str]:
    return [name.split(" ", 1)[1] for name in surface if name.startswith(group + " ")]


# -- bash ---------------------------------------------------------------------------------


def _bash(surface: dict[str, list[str]], commands: dict[str, _click.Command]) -> str:
    groups = sorted({name.split(" ", 1)[0] for name in surface if " " in name})
    option_cases = "\n".join(
        f'        "{name}") opts="{" ".join(opts)}" ;;' for name, opts in surface.items()
    )
    group_cases = "\n".join(f'        {g}) subs="{" ".join(_subs(surface, g))}" ;;' for g in groups)
    valued, option_kinds = _option_values(commands)
    return _BASH.format(
        commands=" ".join(_top(surface)),
        groups="|".join(groups) or "__none__",
        option_cases=option_cases,
        group_cases=group_cases,
        position_cases=_position_cases('        "{name}:{index}"{rest}) kind={kind} ;;', commands),
        option_kind_cases="\n".join(
            f"    {option}) kind={kind} ;;" for option, kind in option_kinds.items()
        ),
        valued_options="|".join(valued),
        path_options="|".join(PATH_OPTIONS),
        shells=" ".join(SHELLS),
    )


def _position_cases(pattern: str, commands: dict[str, _click.Command]) -> str:
    """One shell `case` branch per completing argument, from `pattern` with the
    command's name, the argument's index (the first one for a list), `*` after a list's
    index, and its kind."""
    rows = []
    for name, position, kind in _positions(commands):
        index, rest = (position[:-1], "*") if position.endswith("*") else (position, "")
        if rest:
            index = ""  # exact positions come first: a list takes the others
        rows.append(pattern.format(name=name, index=index, rest=rest, kind=kind))
    return "\n".join(rows)


_BASH = r"""# bash completion for git fabro; generated by `git fabro completion bash`.
# Load it from ~/.bashrc:  source <(git fabro completion bash)
# or save it as ~/.local/share/bash-completion/completions/git-fabro

# $1: the index of the first word after `fabro`; $2: how to call git fabro.
__git_fabro_complete() {{
    local start=$1 call=$2
    local cur=${{words[cword]}} prev=${{words[cword-1]}}
    local cmd="" sub="" first="" i positional=0 key opts subs list kind="" also=""
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
                {valued_options}) ;;
                *)
                    ((positional == 0)) && first=${{words[i]}}
                    ((positional++))
                    ;;
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
    key=$cmd${{sub:+ $sub}}
    case $prev in
{option_kind_cases}
    esac
    if [[ -z $kind ]]; then
        case "$key:$positional" in
{position_cases}
        esac
    fi
    if [[ $kind == workflow-or-batch ]]; then
        kind=""
        if ((positional == 0)); then
            kind=workflows also=status
        elif ((positional == 1)) && [[ $first == status ]]; then
            kind=batches
        fi
    fi
    case $kind in
    runs) list=$($call __complete runs 2>/dev/null) ;;
    batches) list=$($call __complete batches 2>/dev/null) ;;
    checkpoints) list=$($call __complete checkpoints "$first" 2>/dev/null) ;;
    remotes) list=$(git remote 2>/dev/null) ;;
    shells) list="{shells}" ;;
    workflows)
        compopt -o filenames 2>/dev/null
        __git_fabro_files=1
        COMPREPLY=()
        __git_fabro_offer "$also"$'\n'"$($call __complete workflows 2>/dev/null)" "$cur"
        mapfile -t -O "${{#COMPREPLY[@]}}" COMPREPLY < <(compgen -f -- "$cur")
        return
        ;;
    esac
    COMPREPLY=()
    __git_fabro_offer "$list" "$cur"
}}

# The words of $1, one a line, that start with $2, added to COMPREPLY as they are.
# Not `compgen -W`, which expands each word, `$(...)` included: these come from a
# repository's refs and files, which a clone or a fetch brought.
__git_fabro_offer() {{
    local word
    while IFS= read -r word; do
        [[ -n $word && $word == "$2"* ]] && COMPREPLY+=("$word")
    done <<<"$1"
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


def _zsh(surface: dict[str, list[str]], commands: dict[str, _click.Command]) -> str:
    groups = sorted({name.split(" ", 1)[0] for name in surface if " " in name})
    option_cases = "\n".join(
        f"        ({_zsh_quote(name)}) opts=({' '.join(opts)}) ;;" for name, opts in surface.items()
    )
    group_cases = "\n".join(
        f"        ({g}) subs=({' '.join(_subs(surface, g))}) ;;" for g in groups
    )
    valued, option_kinds = _option_values(commands)
    return _ZSH.format(
        commands=" ".join(_top(surface)),
        groups="|".join(groups) or "__none__",
        option_cases=option_cases,
        group_cases=group_cases,
        position_cases=_position_cases('        ("{name}:{index}"{rest}) kind={kind} ;;', commands),
        option_kind_cases="\n".join(
            f"    ({option}) kind={kind} ;;" for option, kind in option_kinds.items()
        ),
        valued_options="|".join(valued),
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
    local cmd="" sub="" first="" key kind="" i positional=0
    local -a opts subs list also
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
                ({valued_options}) ;;
                (*)
                    (( positional == 0 )) && first=${{words[i]}}
                    (( positional++ ))
                    ;;
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
    key="$cmd${{sub:+ $sub}}"
    case $prev in
{option_kind_cases}
    esac
    if [[ -z $kind ]]; then
        case "$key:$positional" in
{position_cases}
        esac
    fi
    if [[ $kind == workflow-or-batch ]]; then
        kind=""
        if (( positional == 0 )); then
            kind=workflows also=(status)
        elif (( positional == 1 )) && [[ $first == status ]]; then
            kind=batches
        fi
    fi
    case $kind in
    (runs) compadd -- ${{(f)"$(git fabro __complete runs 2>/dev/null)"}} ;;
    (batches) compadd -- ${{(f)"$(git fabro __complete batches 2>/dev/null)"}} ;;
    (checkpoints) compadd -- ${{(f)"$(git fabro __complete checkpoints $first 2>/dev/null)"}} ;;
    (remotes) compadd -- ${{(f)"$(git remote 2>/dev/null)"}} ;;
    (shells) compadd -- {shells} ;;
    (workflows)
        compadd -- $also ${{(f)"$(git fabro __complete workflows 2>/dev/null)"}}
        _files
        ;;
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


def _fish_functions(valued: list[str]) -> list[str]:
    """The helper functions the fish completions call; `valued` are the options that
    take a value."""
    return [
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
        "# The words after `fabro` that are neither options nor an option's value.",
        "function __git_fabro_words",
        "    set -l skip 0",
        "    for word in (__git_fabro_args)",
        "        if test $skip -eq 1",
        "            set skip 0",
        "            continue",
        "        end",
        "        switch $word",
        f"            case {' '.join(valued)}",
        "                set skip 1",
        "            case '-*'",
        "            case '*'",
        "                echo $word",
        "        end",
        "    end",
        "end",
        "",
        "function __git_fabro_positional",
        "    set -l words (__git_fabro_words)",
        "    math (count $words) - 1",
        "end",
        "",
        "# The word after the command: the run a NODE[@VISIT] belongs to.",
        "function __git_fabro_first_word",
        "    set -l words (__git_fabro_words)",
        "    echo $words[2]",
        "end",
        "",
    ]


def _fish(surface: dict[str, list[str]], commands: dict[str, _click.Command]) -> str:
    valued, option_kinds = _option_values(commands)
    lines = _fish_functions(valued)
    top = _top(surface)
    words = {
        "runs": "(git fabro __complete runs 2>/dev/null)",
        "batches": "(git fabro __complete batches 2>/dev/null)",
        "checkpoints": "(git fabro __complete checkpoints (__git_fabro_first_word) 2>/dev/null)",
        "remotes": "(git remote 2>/dev/null)",
        "shells": " ".join(SHELLS),
        "workflows": "(git fabro __complete workflows 2>/dev/null)",
    }
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
                takes = " -r -F" if opt in PATH_OPTIONS else ""
                if opt in option_kinds:
                    takes = f" -r -f -a '{words[option_kinds[opt]]}'"
                lines.append(f"complete -c {target} -n '{condition}' {flag}{takes}")
        fabro = "; and __fish_seen_subcommand_from fabro" if target == "git" else ""
        for name, position, kind in _positions(commands):
            head, _, sub = name.partition(" ")
            condition = f"__git_fabro_in {head}{fabro}"
            if sub:
                condition += f"; and __fish_seen_subcommand_from {sub}"
            # fish counts a group's subcommand among the words after the command.
            index = int(position.rstrip("*")) + (1 if sub else 0)
            test = "-ge" if position.endswith("*") else "-eq"
            tests = [(f"test (__git_fabro_positional) {test} {index}", kind, "")]
            if kind == "workflow-or-batch":
                tests = [
                    (f"test (__git_fabro_positional) -eq {index}", "workflows", "status "),
                    (
                        f"test (__git_fabro_positional) -eq {index + 1};"
                        " and test (__git_fabro_first_word) = status",
                        "batches",
                        "",
                    ),
                ]
            for test_words, kind_here, also in tests:
                files = "-F" if kind_here == "workflows" else "-f"
                lines.append(
                    f"complete -c {target} {files} -n '{condition}; and {test_words}'"
                    f" -a '{also}{words[kind_here]}'"
                )
    return "\n".join(lines) + "\n"
