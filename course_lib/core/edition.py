"""The learner's edition: English, or French where the learner reads it.

``COURSE_EDITION=fr`` makes the strings a learner reads (quiz prompts, hints
and verdicts, widget labels, the summary's verdict words) come from
``locale/fr.json``: a catalog keyed by the English text, gettext's idea
without its compiled files. The switch is not ``LANG``: a French-speaking
learner's shell sets it already, and the English edition must stay English
there. Reports, JSON keys, CLI flags and log lines stay English.

``number`` writes a count and ``decimal`` a float the learner reads, as the
edition writes numbers (112 480, 2,5000 in French).

``tr("...")`` marks a string for the catalog; ``tests/test_edition.py``
collects every marked literal (as xgettext would) with the quiz's prompts and
hints, and fails when the catalog misses one or keeps one that is gone.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

from course_lib.core import typography

ENV = "COURSE_EDITION"
EDITIONS = ("en", "fr")
DEFAULT = "en"
# The catalog lives with what the learner reads (course/); the jobs' reports
# describe themselves through it too, so the lookup sits down here.
LOCALE = Path(__file__).parents[1] / "course" / "locale"


class EditionError(ValueError):
    """A COURSE_EDITION that names no edition."""


def current() -> str:
    """The edition the environment asks for (English by default)."""
    edition = os.environ.get(ENV, "").strip().lower() or DEFAULT
    if edition not in EDITIONS:
        raise EditionError(f"{ENV}={edition!r}: choose one of {', '.join(EDITIONS)}")
    return edition


@cache
def catalog(edition: str) -> dict[str, str]:
    """English text -> this edition's text (empty for English)."""
    if edition == DEFAULT:
        return {}
    found: dict[str, str] = json.loads((LOCALE / f"{edition}.json").read_text(encoding="utf-8"))
    return found


def tr(text: str) -> str:
    """``text`` in the current edition, French set with French typography
    (``typography``); English where the catalog lacks it (the test keeps the
    catalog complete)."""
    edition = current()
    found = catalog(edition).get(text)
    if found is None:
        return text
    return typography.french(found) if edition == "fr" else found


def reword(text: str, templates: Iterable[str],
           inner: Callable[[str], str] | None = None) -> str:
    """``text``, which one of the English ``templates`` wrote (its fields
    filled in), in the edition: that template through ``tr``, each field as
    ``inner`` rewords it (as written without it). What an English record
    says (an error, a check's note, a job's name) is read in the learner's
    language when shown, and stays English where it is kept. The text as it
    is in English, or when no template wrote it."""
    if current() == DEFAULT:
        return text
    for template in templates:
        found = _written_by(template).fullmatch(text)
        if found:
            fields = {k: inner(v) if inner else v for k, v in found.groupdict().items()}
            return tr(template).format(**fields)
    return text


@cache
def _written_by(template: str) -> re.Pattern[str]:
    """What ``template`` writes, as a pattern: each field matches any text
    (the same text where a field comes back)."""
    parts, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(f"(?P={field})" if field in seen else f"(?P<{field}>.*?)")
            seen.add(field)
    return re.compile("".join(parts), re.DOTALL)


# A format spec, cut where a thousands separator goes: [[fill]align][sign][z][#][0][width]
# (grouping)(.precision)(type).
_SPEC = re.compile(r"^(?P<head>(?:.?[<>=^])?[-+ ]?z?#?0?\d*)(?P<group>[,_]?)"
                   r"(?P<tail>(?:\.\d+)?[a-zA-Z%]?)$")


def number(value: float, spec: str = ",") -> str:
    """A count as the edition writes it, ``spec`` as ``format`` takes it for
    English: English 112,480 and 2.5; French 112 480 (a narrow no-break
    space, thousands always grouped), 2,5 and 25 %. Reports, JSON and the
    CLI keep Python's own format."""
    if current() != "fr":
        return format(value, spec)
    found = _SPEC.match(spec)
    if found and not found["group"]:
        spec = found["head"] + "," + found["tail"]  # French groups every count
    return marks(format(value, spec))


# A number's sign, not a hyphen: "-0.5", "= -6e-03", "(-1"; never an
# exponent's ("e-03") nor a hyphen between words or before a space.
_SIGN = re.compile(r"(?<![\w.,])-(?=\d)")


def marks(text: str) -> str:
    """A number written as Python writes it (112,480, 2.5, 25%, -0.5) with
    the edition's marks: French 112 480, 2,5, 25 % and −0,5 (U+2212)."""
    if current() != "fr":
        return text
    text = text.replace(",", typography.NNBSP).replace(".", ",")
    return _SIGN.sub(typography.MINUS, text.replace("%", typography.NBSP + "%"))


def device(name: str) -> str:
    """A device as the edition names it: French writes CPU; a GPU's name stays."""
    return tr("cpu") if name == "cpu" else name


_MONTHS = ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août",
           "septembre", "octobre", "novembre", "décembre")


def date(iso: str) -> str:
    """A day stored as 2026-12-05, as the edition writes it: English keeps
    the ISO form, French writes 5 décembre 2026 (1er for the first)."""
    if current() != "fr":
        return iso
    try:
        year, month, day = (int(part) for part in iso.split("-"))
        name = _MONTHS[month - 1]
    except (ValueError, IndexError):
        return iso  # not a day: as stored
    return f"{'1er' if day == 1 else day}{typography.NBSP}{name}{typography.NBSP}{year}"


def decimal(value: float, places: int = 4) -> str:
    """A float the learner reads, to ``places`` decimals, as the edition
    writes it: 2.5000 in English, 2,5000 in French; never -0.0000."""
    spec = f".{places}f"
    if float(format(value, spec)) == 0:
        value = 0.0  # -1e-12 would print -0.0000
    return number(value, spec)
