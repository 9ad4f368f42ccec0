"""The configurations people train with (``--with``), as a chapter shows them.

``describe()`` prints the committed table, ``data/frameworks-configurations.json``
(``benchmarks/frameworks_matrix.py --configurations``): every option of
``frameworks/options.py`` on every model and flag set, measured or not run
with its reason. Rows a learner measured on their own versions
(``audit_frameworks(..., uses=[...])``) replace the committed ones and are
marked ``live``. The table itself is ``Configurations.lines``, which the
site's page shows too; ``grouped=True`` reads the same rows as a chapter
does, a line per configuration, against the plain framework's rows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from course_lib.core.edition import date, number, reword, tr
from course_lib.frameworks import options
from course_lib.frameworks.evidence import (
    CONFIGURATION_HEAD,
    UNMEASURED,
    Configurations,
    FrameworkRow,
    Matrix,
    _key,
    finding,
)
from course_lib.jobs.frameworks import MISSING, FrameworksReport


def describe(live: FrameworksReport | Sequence[FrameworkRow] | None = None,
             framework: str | None = None, grouped: bool = False) -> str:
    """The configurations' table as text: one line per configuration, state
    and flag set (the models merged where their rows say the same), marked
    live (measured here, on the versions installed) or committed.
    ``grouped``: a line per configuration that trains what the plain
    framework trains, the others in detail (``_grouped``)."""
    doc = Configurations.committed()
    rows = list(live.rows if isinstance(live, FrameworksReport) else live or ())
    if grouped:
        return _grouped(doc, rows, framework)
    lines = doc.lines(rows, framework)
    cells = [tuple(tr(h) for h in CONFIGURATION_HEAD), *(line.cells for line in lines)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(CONFIGURATION_HEAD) - 1)]
    versions = sorted({f"{p} {v}" for r in doc.rows for p, v in r.stack.items()})
    mine = [r for r in rows if r.uses]
    here = sorted({f"{p} {v}" for r in mine for p, v in r.stack.items()})
    tally = Counter(re.sub(r" [x×]\S+$", "", line.verdict) for line in lines)  # no factor
    head = [tr("The configurations (--with), each on the skewed window: the gradient of the "
               "first optimizer step vs the token mean. {count} lines: {tally}.").format(
        count=len(lines), tally=", ".join(f"{n} {v}" for v, n in tally.items())),
            tr("committed: {file} ({date}; {versions})").format(
        file=Configurations.path().name, date=date(doc.date), versions=", ".join(versions)),
            tr("live: {rows} rows ({versions})").format(rows=len(mine), versions=", ".join(
                here)) if mine else
            tr("live: none ({call} measures them here)").format(  # code, as typed
                call="audit_frameworks(..., uses=[...])")]
    table = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  "
             + row[-1] for row in cells]
    return "\n".join([*head, *table])


# --- grouped: what a configuration changes, against the plain framework ---------------

PACKAGE = {"hf": "transformers"}


def _plain(framework: str) -> str:
    """The framework without any configuration, in the learner's language."""
    return {"hf": tr("the plain Trainer"), "trl": tr("the plain SFTTrainer")}.get(
        framework) or tr("plain {framework}").format(framework=framework)


def _said(row: FrameworkRow) -> tuple[str, str]:
    """(verdict, formula) as the table writes them."""
    return row.said, finding(row)


def _own_flags(row: FrameworkRow) -> str:
    """The framework's own flags: those no option of the row set."""
    set_by: set[str] = set()
    for name, state in row.uses.items():
        if name in options.OPTIONS:
            set_by |= set(options.OPTIONS[name].flags(state))
    own = {k: v for k, v in row.flags.items() if k not in set_by}
    return "; ".join(f"{k}={v}" for k, v in own.items()) or "defaults"


def _short(reason: str) -> str:
    """A not-run reason in a few words: the missing package, or its first clause."""
    if reason.startswith(MISSING):
        package = re.search(r"([A-Za-z][\w.-]*)\s*>=", reason)
        return (tr("{package} not installed").format(package=package.group(1)) if package
                else tr("a package not installed"))
    head, _, rest = reason.partition(": ")
    text = rest if rest and " " not in head else reason
    return reword(text.split(": ")[0], (options.UNSHARDED,))


def _states(states: list[str]) -> str:
    """Several states of one setting as one: use_reentrant=default|True|False."""
    keys = {state.partition("=")[0] for state in states}
    if len(states) > 1 and len(keys) == 1 and all(
            "=" in state and ";" not in state and "," not in state for state in states):
        return f"{keys.pop()}=" + "|".join(state.partition("=")[2] for state in states)
    return " | ".join(states)


def _grouped(doc: Configurations, live: Sequence[FrameworkRow],
             framework: str | None) -> str:
    """A line per configuration whose every row says what the plain
    framework's row says on the same version, model and flags (the live
    rows, else the committed version matrix); the others a line per state
    and flag set, with the window's counts (a collator changes the data);
    not run, with its reason in a few words."""
    plain = {(r.framework, r.version, r.model, _own_flags(r)): _said(r)
             for r in [*Matrix.committed().rows, *live] if not r.uses}
    found: dict[tuple[str, str, str, str], FrameworkRow] = {_key(r): r for r in doc.rows}
    found.update({_key(r): r for r in live if r.uses})
    groups: dict[tuple[str, str], dict[str, list[FrameworkRow]]] = {}
    for r in found.values():
        if framework is None or r.framework == framework:
            states = groups.setdefault((r.framework, "+".join(r.uses)), {})
            state = "; ".join(",".join(f"{k}={v}" for k, v in s.items())
                              if isinstance(s, dict) else str(s) for s in r.uses.values())
            states.setdefault(state, []).append(r)
    every = [r for rs in groups.values() for state in rs.values() for r in state]
    models = sorted({r.model for r in every})
    flags = sorted({_own_flags(r) for r in every})
    versions = sorted({f"{PACKAGE.get(r.framework, r.framework)} {r.version}" for r in every})
    mine = sum(r.uses != {} for r in live)
    live_rows = tr(", {rows} rows live").format(rows=mine) if mine else ""
    lines = [tr("The --with configurations on the skewed window ({versions}; committed "
                "{date}{live}),").format(versions=", ".join(versions), date=date(doc.date),
                                         live=live_rows),
             tr("against the plain framework's rows: {models} models ({names}) x {flags} "
                "flag settings").format(models=len(models), names=", ".join(models),
                                        flags=len(flags))]
    width = max((len(c) for _, c in groups), default=0)

    def same(rows: list[FrameworkRow]) -> bool:  # as the plain framework's rows say
        return all(r.verdict not in UNMEASURED and plain.get(
            (r.framework, r.version, r.model, _own_flags(r))) == _said(r) for r in rows)

    def unrun(rows: list[FrameworkRow]) -> bool:
        return all(r.verdict in UNMEASURED for r in rows)

    # the verdict column of the detailed lines as wide as this edition's words (English: 15)
    in_groups = [[r for rs in states.values() for r in rs] for states in groups.values()]
    said = max([15, *(len(_said(r)[0]) for rows in in_groups
                      if not same(rows) and not unrun(rows) for r in rows)])
    for (fw, configuration), states in groups.items():
        rows = [r for rs in states.values() for r in rs]
        head = f"  {configuration:<{width}}  "
        if same(rows):
            both = tr("on {models} models and {flags} flag settings").format(
                models=tr("both") if len(models) == 2 else tr("all"),
                flags=tr("both") if len(flags) == 2 else tr("all"))
            lines.append(head + tr("{states}: same as {plain} {both}").format(
                states=_states(list(states)), plain=_plain(fw), both=both))
            continue
        if unrun(rows):
            why = dict.fromkeys(_short(r.reason) if r.reason else tr("no reason recorded")
                                for r in rows)
            lines.append(head + tr("{states}: {verdict}, {why}").format(
                states=_states(list(states)), verdict=_said(rows[0])[0],
                why="; ".join(why)))
            continue
        for state, rs in states.items():
            counts = dict.fromkeys(f"N = {number(r.counts.N, 'd')}, "
                                   f"R = {number(r.counts.R, 'd')}" for r in rs if r.counts)
            lines.append(f"{head}{state}{tr(': ')}" + " | ".join(counts))
            for flag in dict.fromkeys(_own_flags(r) for r in rs):
                by_said: dict[tuple[str, str], list[str]] = {}
                for r in rs:
                    if _own_flags(r) == flag:
                        by_said.setdefault(_said(r), []).append(r.model)
                for i, ((verdict, formula), ms) in enumerate(by_said.items()):
                    lines.append(f"    {flag if i == 0 else '':<{max(map(len, flags))}}  "
                                 f"{', '.join(ms):<11} {verdict:<{said}} {formula}")
    return "\n".join(lines)
