"""French typography, applied where French text is made: the chapters' prose
at build time (``translation.build``) and the catalog's strings (``tr``).

French sets a space before the high punctuation and inside guillemets, and
that space must not break, or a colon wraps to the start of a line:

- U+202F (narrow no-break space) before ``;``, ``?`` and ``!``;
- U+00A0 (no-break space) before ``:`` and ``%``, after ``«`` and before ``»``;
- ``×`` for an ``x`` between two numbers (``2 x 3``), ``…`` for ``...``.

Only a space already there is made unbreakable: "http://", "a:b" or a
Python slice stay as they are. Code (fenced blocks, ``code`` spans),
LaTeX (``$...$``, ``$$...$$``), HTML tags and link targets are left alone.
"""

from __future__ import annotations

import re

NNBSP = "\u202f"  # narrow no-break space
NBSP = "\u00a0"  # no-break space

# What typography must not touch: fenced code, code spans, LaTeX, a tag, a link's target.
_PROTECTED = re.compile(
    r"```.*?```|~~~.*?~~~|`[^`\n]*`|\$\$.*?\$\$|(?<!\\)\$[^$\n]+\$|<[^<>\n]+>|\]\([^)\s]*\)",
    re.DOTALL)

_RULES = (
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]+([;?]|!(?!\[))"), NNBSP + r"\1"),
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]+([:%])"), NBSP + r"\1"),
    (re.compile(r"«[ \t\u00a0\u202f]*"), "«" + NBSP),
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]*»"), NBSP + "»"),
    (re.compile(r"(?<=\d) x (?=\d)"), " × "),
    (re.compile(r"(?<!\.)\.\.\.(?!\.)"), "…"),
)


# A plain space where French needs one that does not break.
_BREAKABLE = re.compile(r".{0,12}(?:(?<=\S)[ \t]+(?:[:;?%»]|!(?!\[))|«[ \t]).{0,6}")


def _plain(text: str) -> str:
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


# Stands for the code span before a chunk of prose: "`x` :" needs its
# no-break space too, and the rules look behind for a non-space.
_CODE = "\ue000"


def _chunks(text: str) -> list[tuple[str, str | None]]:
    """(prose, the protected text after it or None), prose that follows a
    protected span starting with _CODE."""
    out: list[tuple[str, str | None]] = []
    last = 0
    for found in _PROTECTED.finditer(text):
        prose = text[last:found.start()]
        out.append(((_CODE if last else "") + prose, found.group(0)))
        last = found.end()
    out.append(((_CODE if last else "") + text[last:], None))
    return out


def french(text: str) -> str:
    """``text`` with French typography, its code and formulas untouched."""
    return "".join(_plain(prose).removeprefix(_CODE) + (kept or "")
                   for prose, kept in _chunks(text))


def breakable(text: str) -> list[str]:
    """The places in ``text`` (outside code and formulas) where a plain
    space stands before high punctuation or inside guillemets: what
    ``french`` fixes. Empty for a text set as French sets it."""
    return [m.group(0).replace(_CODE, "`…`") for prose, _ in _chunks(text)
            for m in _BREAKABLE.finditer(prose)]
