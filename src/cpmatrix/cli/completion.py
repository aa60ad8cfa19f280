"""``cpmatrix completion bash|zsh``: shell completion for commands, flags and cell ids.

The script completes the commands and each command's flags from the parser (as they are
when it is written), and cell ids for ``show``/``repro`` by asking ``cpmatrix completion
--ids PREFIX`` (the project's matrix, or ``--matrix`` if given on the line). A cell id
holds ``=`` and ``:`` (word breaks for bash), so the script completes the whole word
typed so far and hands bash only the part after its last break.

Example::

    $ eval "$(cpmatrix completion bash)"     # in ~/.bashrc
    $ cpmatrix repro allreduce_sum[unit,2x2<TAB>
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

from cpmatrix.cli.common import add_command, add_matrix, load_and_expand
from cpmatrix.errors import ExitCode, UsageError

__all__ = ["add_parsers", "run", "script"]

SHELLS: Final = ("bash", "zsh")

_BASH: Final = r'''# cpmatrix completion (bash): eval "$(cpmatrix completion bash)"
_cpmatrix_complete() {
    local line="${COMP_LINE:0:$COMP_POINT}"
    local word="${line##*[[:space:]]}"
    word="${word#\'}"; word="${word#\"}"
    local cmd="${COMP_WORDS[1]}"
    local -a found=()
    if [ "$COMP_CWORD" -le 1 ]; then
        found=($(compgen -W "__COMMANDS__" -- "$word"))
    elif [[ "$word" == -* ]]; then
        case "$cmd" in
__FLAGS__
        esac
    elif [ "$cmd" = show ] || [ "$cmd" = repro ]; then
        local matrix="" i
        for ((i = 2; i < COMP_CWORD; i++)); do
            if [ "${COMP_WORDS[i]}" = --matrix ]; then matrix="${COMP_WORDS[i+1]}"; fi
        done
        local IFS=$'\n'
        found=($(cpmatrix completion --ids "$word" ${matrix:+--matrix "$matrix"} 2>/dev/null))
    else
        found=($(compgen -f -- "$word"))
    fi
    # bash replaces only the text after the last word break ('=' or ':') in the word
    local cut="${word%[=:]*}"
    if [ "$cut" != "$word" ]; then
        local n=$(( ${#cut} + 1 )) k
        for k in "${!found[@]}"; do found[k]="${found[k]:$n}"; done
    fi
    COMPREPLY=("${found[@]}")
}
complete -o default -F _cpmatrix_complete cpmatrix
'''

_ZSH_HEAD: Final = ("# cpmatrix completion (zsh): eval \"$(cpmatrix completion zsh)\"\n"
                    "autoload -U +X bashcompinit && bashcompinit\n")


def script(shell: str, parsers: dict[str, argparse.ArgumentParser]) -> str:
    """The completion script for ``shell`` over these commands and their flags."""
    if shell not in SHELLS:
        raise UsageError(f"completion: unknown shell {shell!r} (allowed: {', '.join(SHELLS)})")
    cases = []
    for name, parser in parsers.items():
        flags = sorted(o for a in parser._actions for o in a.option_strings
                       if a.help != argparse.SUPPRESS)
        cases.append(f'            {name}) found=($(compgen -W "{" ".join(flags)}" '
                     f'-- "$word"));;')
    text = (_BASH.replace("__COMMANDS__", " ".join(parsers))
            .replace("__FLAGS__", "\n".join(cases)))
    return (_ZSH_HEAD + text) if shell == "zsh" else text


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "completion", "print a shell completion script (bash, zsh)",
        "Print the completion script for a shell: commands, flags, and cell ids for show "
        "and repro (from the project's matrix).",
        ['eval "$(cpmatrix completion bash)"      # e.g. in ~/.bashrc',
         'eval "$(cpmatrix completion zsh)"       # e.g. in ~/.zshrc'])
    p.add_argument("shell", nargs="?", choices=SHELLS)
    p.add_argument("--ids", metavar="PREFIX", default=None, help=argparse.SUPPRESS)
    add_matrix(p, shown=False)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.ids is not None:  # the script asks: cell ids starting with PREFIX
        if not args.matrix:
            return ExitCode.NOTHING_SELECTED
        _, expansion = load_and_expand(args.matrix)
        hits = [c.id for c in expansion.cells if c.id.startswith(args.ids)]
        sys.stdout.write("".join(f"{h}\n" for h in hits))
        return ExitCode.OK if hits else ExitCode.NOTHING_SELECTED
    if args.shell is None:
        raise UsageError("completion: name a shell (bash or zsh)")
    sys.stdout.write(script(args.shell, args.parsers))
    return ExitCode.OK
