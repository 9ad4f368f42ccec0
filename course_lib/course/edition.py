"""The learner's edition: English, or French where the learner reads it.

``COURSE_EDITION=fr`` makes the strings a learner reads (quiz prompts, hints
and verdicts, widget labels, the summary's verdict words) come from
``locale/fr.json``: a catalog keyed by the English text, gettext's idea
without its compiled files. The switch is not ``LANG``: a French-speaking
learner's shell sets it already, and the English edition must stay English
there. Reports, JSON keys, CLI flags and log lines stay English.

``tr("...")`` marks a string for the catalog; ``tests/test_edition.py``
collects every marked literal (as xgettext would) with the quiz's prompts and
hints, and fails when the catalog misses one or keeps one that is gone.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from course_lib.course import typography

ENV = "COURSE_EDITION"
EDITIONS = ("en", "fr")
DEFAULT = "en"
LOCALE = Path(__file__).with_name("locale")


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
    return json.loads((LOCALE / f"{edition}.json").read_text(encoding="utf-8"))


def tr(text: str) -> str:
    """``text`` in the current edition, French set with French typography
    (``typography``); English where the catalog lacks it (the test keeps the
    catalog complete)."""
    edition = current()
    found = catalog(edition).get(text)
    if found is None:
        return text
    return typography.french(found) if edition == "fr" else found


def number(value: float, spec: str = ",") -> str:
    """``value`` as the edition writes numbers, ``spec`` as ``format`` takes
    it: English 112,480 and 2.5; French 112 480 (a narrow no-break space)
    and 2,5. Reports, JSON and the CLI keep Python's own format."""
    text = format(value, spec)
    if current() != "fr":
        return text
    return text.replace(",", typography.NNBSP).replace(".", ",")
