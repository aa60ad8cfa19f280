"""The nearest of the allowed words ("did you mean"), for messages about a typo.

One helper for every such message (flags, config keys, dtype/level/axis values, ``-k``
words, platforms), so they all read alike.

Example::

    >>> did_you_mean("--platfrom", ["--platform", "--plain", "--python"])
    " (did you mean '--platform'?)"
    >>> did_you_mean("float32", ["fp64", "fp32"], aliases=DTYPE_ALIASES)
    " (did you mean 'fp32'? torch's float32 is fp32 here)"
    >>> did_you_mean("zzz", ["fp64"])
    ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["DTYPE_ALIASES", "closest", "did_you_mean", "suggestion"]

#: torch's spellings of the dtype axis' values (and their ``torch.`` forms).
DTYPE_ALIASES: Final = {
    **{name: short for short, names in {
        "fp64": ("float64", "double"), "fp32": ("float32", "float"),
        "bf16": ("bfloat16",), "fp16": ("float16", "half")}.items() for name in names},
}
DTYPE_ALIASES.update({f"torch.{k}": v for k, v in list(DTYPE_ALIASES.items())})


def closest(word: str, choices: Iterable[str], *, n: int = 1) -> list[str]:
    """The ``n`` allowed words nearest to ``word`` (case-insensitive; none too far)."""
    pool = list(dict.fromkeys(choices))
    lowered = {c.lower(): c for c in pool}
    hits = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.6)
    # A word that is a prefix of exactly one choice is meant for it ("--plat").
    if not hits:
        prefixed = [c for c in lowered if c.startswith(word.lower()) and word]
        hits = prefixed if len(prefixed) == 1 else []
    return [lowered[h] for h in hits]


def suggestion(word: str, choices: Iterable[str], *,
               aliases: Mapping[str, str] | None = None) -> str:
    """``"did you mean 'x'?"`` for the nearest allowed word, or ``""``; an alias (a torch
    dtype spelling) names what it stands for."""
    if aliases and word in aliases:
        return f"did you mean {aliases[word]!r}? torch's {word} is {aliases[word]} here"
    hit = closest(word, choices)
    return f"did you mean {hit[0]!r}?" if hit else ""


def did_you_mean(word: str, choices: Iterable[str], *,
                 aliases: Mapping[str, str] | None = None) -> str:
    """:func:`suggestion` in parentheses, after a space (``""`` when there is none)."""
    hint = suggestion(word, choices, aliases=aliases)
    return f" ({hint})" if hint else ""
