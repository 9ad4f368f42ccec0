"""French typography, applied where French text is made: the chapters' prose
at build time (``translation.build``) and the catalog's strings (``tr``).

French sets a space before the high punctuation and inside guillemets, and
that space must not break, or a colon wraps to the start of a line:

- U+202F (narrow no-break space) before ``;``, ``?`` and ``!``;
- U+00A0 (no-break space) before ``:`` and ``%``, after ``«`` and before ``»``;
- ``×`` for an ``x`` between two numbers (``2 x 3``), ``…`` for ``...``;
- U+202F between the groups of a count (``16 971``), as ``edition.number``
  writes it, so that a count never wraps in two; U+00A0 between a duration
  and its unit (``5 s``, ``30 ms``).

``french_code`` sets a French code cell's messages and comments the same
way, one character for one, so that a padded column keeps its width.

Only a space already there is made unbreakable: "http://", "a:b" or a
Python slice stay as they are. Code (fenced blocks, ``code`` spans),
LaTeX (``$...$``, ``$$...$$``), HTML tags and link targets are left alone.
"""

from __future__ import annotations

import re

NNBSP = "\u202f"  # narrow no-break space
NBSP = "\u00a0"  # no-break space
MINUS = "\u2212"  # a number's sign, as French sets it (edition.marks)

# What typography must not touch: fenced code, code spans, LaTeX, a tag, a link's target.
_PROTECTED = re.compile(
    r"```.*?```|~~~.*?~~~|`[^`\n]*`|\$\$.*?\$\$|(?<!\\)\$[^$\n]+\$|<[^<>\n]+>|\]\([^)\s]*\)",
    re.DOTALL)

# A space between a number (or a template's field) and a unit of time.
_UNIT = r"(?<=[{before}])[ \t](?=(?:s|ms|min)\b(?![\'’]))"
# A count written in groups of three: 1 to 3 digits, then groups of 3,
# outside a decimal's digits. Its spaces become U+202F, one for one.
_COUNT = re.compile(r"(?<![\d.,])\d{1,3}(?:[ \t\u00a0]\d{3})+(?!\d)")


def _grouped(found: re.Match[str]) -> str:
    return re.sub(r"[ \t\u00a0]", NNBSP, found.group(0))


_RULES = (
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]+([;?]|!(?!\[))"), NNBSP + r"\1"),
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]+([:%])"), NBSP + r"\1"),
    (re.compile(r"«[ \t\u00a0\u202f]*"), "«" + NBSP),
    (re.compile(r"(?<=\S)[ \t\u00a0\u202f]*»"), NBSP + "»"),
    (re.compile(r"(?<=\d) x (?=\d)"), " × "),
    (re.compile(r"(?<!\.)\.\.\.(?!\.)"), "…"),
    (_COUNT, _grouped),
    # a duration's unit stays with its number: 5 s, 30 ms ("{seconds} s" in a template)
    (re.compile(_UNIT.format(before=r"\d}")), NBSP),
)


# A plain space where French needs one that does not break.
_BREAKABLE = re.compile(r".{0,12}(?:(?<=\S)[ \t]+(?:[:;?%»]|!(?!\[))|«[ \t]"
                        r"|(?<![\d.,])\d{1,3}(?:[ \t\u00a0\u202f]\d{3})*[ \t\u00a0]\d{3}(?!\d)"
                        r"|\d[ \t](?:s|ms|min)\b(?![\'’]))"
                        r".{0,6}")


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


# In a code cell's messages, one character for one: a padded label
# ("moyennes locales        :") keeps its column, only the space that
# touches the sign stops breaking. An f-string's fields are code and stay.
_CODE_RULES = (
    (re.compile(r" (?=[;?])"), NNBSP),
    (re.compile(r" (?=[:%»])"), NBSP),
    (re.compile(r"(?<=«) "), NBSP),
    (_COUNT, _grouped),
    (re.compile(_UNIT.format(before="\\d" + _CODE)), NBSP),  # "{t:.1f} s"
)


def _literal_parts(token: str) -> list[tuple[int, int]]:
    """The (start, end) spans of a string token's text that is not code: the
    whole body of a plain string, the text between the fields of an f-string."""
    prefix = len(token) - len(token.lstrip("rRbBuUfF"))
    if "b" in token[:prefix].lower():
        return []  # bytes are data
    quote = 3 if token[prefix:prefix + 3] in ('"""', "'''") else 1
    start, end = prefix + quote, len(token) - quote
    if "f" not in token[:prefix].lower():
        return [(start, end)]
    spans, depth, here, i = [], 0, start, start
    while i < end:
        ch = token[i]
        if depth == 0 and token[i:i + 2] in ("{{", "}}"):
            i += 2
            continue
        if ch == "{":
            if depth == 0:
                spans.append((here, i))
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            here = i + 1
        i += 1
    if depth == 0:
        spans.append((here, end))
    return spans


def french_code(source: str) -> str:
    """A French code cell with its messages and comments set as French sets
    them (the no-break spaces of ``french``, one character for one), so that
    what it prints matches what the catalog prints. Code, an f-string's
    fields and a cell that does not tokenize (a magic, a shell line) stay."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    starts = [0]
    for line in io.StringIO(source):
        starts.append(starts[-1] + len(line))
    text = list(source)
    shell = {n for n, line in enumerate(source.splitlines(), 1)
             if line.lstrip().startswith(("!", "%"))}  # IPython's, not Python
    for tok in tokens:
        if tok.type not in (tokenize.STRING, tokenize.COMMENT) or tok.start[0] in shell:
            continue
        at = starts[tok.start[0] - 1] + tok.start[1]
        spans = ([(0, len(tok.string))] if tok.type == tokenize.COMMENT
                 else _literal_parts(tok.string))
        # the fields masked, not cut out: "{r} :" still has a sign after a word
        masked = [_CODE] * len(tok.string)
        for a, b in spans:
            masked[a:b] = tok.string[a:b]
        part = "".join(masked)
        for pattern, replacement in _CODE_RULES:
            part = pattern.sub(replacement, part)
        for a, b in spans:  # the same length: offsets hold
            text[at + a:at + b] = part[a:b]
    return "".join(text)
