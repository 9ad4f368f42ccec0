"""The site's generated pages, each written from the one source the code keeps.

Run by ``make site`` with the course's own venv (it imports ``course_lib``),
before ``site/build.py`` runs Sphinx in the site's venv:

    .venv/bin/python site/generate.py build/site/gen

It writes Markdown fragments (and one figure) that the pages of ``site/pages/``
include; nothing here is typed in by hand:

- ``cli.md``: every ``course-lib`` command, its usage and options, from
  ``course_lib.cli.build_parser()``;
- ``checks-table.md``: each check's name and ``compares``, in ``checks.CHECKS``
  order;
- ``bug-catalog.md``: every step of every objective's catalog (its kind,
  description and why, from ``steps``), and which checks caught each built-in
  step in the committed report ``docs/cheatsheet-bugs.json``;
- ``recipes-table.md``: every recipe of ``steps.recipes.RECIPES``, its citation,
  formula, both measured verdicts (``docs/recipes-report.json``) and what its
  real code did (``data/frameworks-matrix.json``, ``data/trl-grpo-loss.json``);
- ``frameworks-matrix.md`` and ``frameworks-matrix.png``: the version matrix,
  table and heatmap, from ``data/frameworks-matrix.json``;
- ``frameworks-configurations.md``: the ``--with`` configurations, from
  ``data/frameworks-configurations.json`` (the table chapter 08 prints);
- ``frameworks-logging.md``: what the frameworks log, from
  ``data/frameworks-logging.json``.

Nothing launches: every report read is committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cell(text: object) -> str:
    """Text fit for a Markdown table cell (MyST: raw ``<`` would be HTML)."""
    return (str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " "))


def table(head: list[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the command line ---------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    return [(name, p, helps.get(name, "")) for name, p in sub.choices.items()]


def _option_key(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.dest


def _option_row(action: argparse.Action) -> list[object]:
    name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.metavar:
        name += f" `{action.metavar}`"
    default = "" if action.default in (None, False, argparse.SUPPRESS) else \
        f"`{action.default}`"
    choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
    return [name, action.help or "", default, choices]


def cli_page() -> str:
    """The CLI reference: the options every command shares, those of every
    command that launches torchrun, then each command with its own."""
    from course_lib import cli

    # argparse wraps usage lines at the terminal's width: fix it, so that the
    # page is the same from any shell
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        parser = cli.build_parser()
        commands = _subcommands(parser)
        usages = {name: p.format_usage().removeprefix("usage: ").rstrip()
                  for name, p, _ in commands}
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    head = ["option", "what it does", "default", "choices"]

    def options(p):
        return [a for a in p._actions if not isinstance(a, argparse._HelpAction)]

    keys = {name: {_option_key(a) for a in options(p)} for name, p, _ in commands}
    launchers = [(name, p) for name, p, _ in commands if "--backend" in keys[name]]
    common = set.intersection(*keys.values())
    launch = set.intersection(*(keys[n] for n, _ in launchers)) - common if launchers \
        else set()
    first = commands[0][1]
    out = [f"`course-lib <command>` (or `python -m course_lib <command>`): "
           f"{len(commands)} commands, written here from `course_lib.cli.build_parser()`.",
           "", "## Every command", "",
           table(head, [_option_row(a) for a in options(first) if _option_key(a) in common])]
    if launch:
        out += ["", "## Every command that launches torchrun", "",
                table(head, [_option_row(a) for a in options(launchers[0][1])
                             if _option_key(a) in launch])]
    out += ["", "## The commands"]
    for name, p, help_text in commands:
        usage = usages[name]
        own = [a for a in options(p) if _option_key(a) not in common | launch]
        out += ["", f"### `{name}`", "", cell(help_text).replace("\\|", "|") + ".", "",
                "```text", usage, "```"]
        if name in dict(launchers):
            out += ["", "It launches torchrun: it takes the options above."]
        if own:
            out += ["", table(head, [_option_row(a) for a in own])]
    return "\n".join(out) + "\n"


# --- the checks and the bug catalog ---------------------------------------------------


def check_table() -> str:
    """Each check's name and ``compares``, in ``checks.CHECKS`` order."""
    from course_lib import checks

    rows = [f"| `{c.name}` | {c.compares} |" for c in checks.CHECKS.values()]
    return "\n".join(["| check | what it compares |", "|---|---|", *rows]) + "\n"


def bug_catalog() -> str:
    from course_lib import checks
    from course_lib.course import cheatsheet
    from course_lib.steps.objectives import CATALOGS

    report = cheatsheet.committed()
    out = ["## Which check catches which step", "",
           f"The committed bug catalog (`docs/cheatsheet-bugs.json`, `course-lib bugs`: "
           f"{report.world_size} ranks, {report.backend} on {report.device}, "
           f"{report.dtype}, objective `{report.objective}`): **caught** where the "
           "check failed the step, `ok` where it passed. Every bug caught: "
           f"{report.every_bug_caught}; no false alarm: {report.no_false_alarm}.", ""]
    names = [c for c in report.checks]
    rows = []
    for step, row in report.steps.items():
        rows.append([f"`{step}`", row.kind] + [
            "n/a" if row.checks.get(c) is None else ("ok" if row.checks[c] else "**caught**")
            for c in names])
    out += [table(["step", "kind", *[f"`{c}`" for c in names]], rows)]
    known = set(checks.CHECKS)
    stale = [c for c in names if c not in known]
    if stale:
        out += ["", f"(The report names checks that are gone: {', '.join(stale)}.)"]
    for objective, catalog in CATALOGS.items():
        out += ["", f"## Objective `{objective}`", "",
                table(["step", "kind", "what it does", "why"],
                      [[f"`{s.name}`", s.kind, s.description, s.why]
                       for s in catalog.values()])]
    return "\n".join(out) + "\n"


# --- the recipes ----------------------------------------------------------------------------


RECIPE_HEAD = ["recipe", "framework, versions", "citation", "backprop", "reduction",
               "token mean: balanced \\| skewed", "claims", "its claim: balanced \\| skewed",
               "empty window", "the real code, run"]


def recipe_rows() -> list[list[str]]:
    """One row per recipe of ``RECIPES``, its last cell the real code's line."""
    from course_lib.course import recipes_page
    from course_lib.frameworks.evidence import LossRuns, Matrix, loss_code_text, real_code
    from course_lib.jobs.recipes import empty_text
    from course_lib.jobs.recipes import verdicts as verdict_pair
    from course_lib.steps.recipes import RECIPES

    report = recipes_page.committed()
    matrix = Matrix.committed()
    runs = LossRuns.committed()
    rows = []
    for name, r in RECIPES.items():
        row = report.recipes.get(name)
        real = loss_code_text(r, runs) if r.loss_runs else real_code(r, matrix).text()
        measured = [verdict_pair(row, False), row.claims, verdict_pair(row, True),
                    empty_text(row)] if row else \
            ["not measured: `make recipes-page`", r.claims, "-", "-"]
        rows.append([f"`{name}`", f"{r.framework}, {r.versions}", r.citation, r.backprop,
                     r.reduction, *measured, real])
    return rows


def recipes_table() -> str:
    from course_lib.course import recipes_page

    report = recipes_page.committed()
    rows = recipe_rows()
    lines = ["| " + " | ".join(RECIPE_HEAD) + " |", "|" + "---|" * len(RECIPE_HEAD)]
    lines += ["| " + " | ".join(c if i == 0 else cell(c) for i, c in enumerate(row)) + " |"
              for row in rows]
    return (f"{len(rows)} recipes. Verdicts from `docs/recipes-report.json` "
            f"({report.world_size} ranks, {report.backend} on {report.device}, "
            f"{report.dtype}; every prediction holds: {report.every_prediction_holds}); "
            "the last column from `data/frameworks-matrix.json` and "
            "`data/trl-grpo-loss.json`.\n\n" + "\n".join(lines) + "\n")


# --- the frameworks ---------------------------------------------------------------------


def matrix_table() -> str:
    from course_lib.frameworks.evidence import Matrix

    m = Matrix.committed()
    rows = []
    for r in m.rows:
        flags = ", ".join(f"`{k}={v}`" for k, v in r.flags.items())
        err = "" if r.relative_error is None else f"{r.relative_error:.2g}"
        factor = "" if r.factor is None else f"{r.factor:.4g}"
        rows.append([r.entry or f"{r.framework} {r.version}", r.model, flags, str(r.verdict),
                     factor, r.matches or r.reason, err])
    tried = [[name, e.status, e.reason] for name, e in m.entries.items() if e.reason]
    out = [f"`data/frameworks-matrix.json`: {len(m.rows)} rows, {m.date}, torch {m.torch}, "
           f"written by `{m.command}`." if getattr(m, "command", "") else
           f"`data/frameworks-matrix.json`: {len(m.rows)} rows, {m.date}, torch {m.torch}.",
           "", table(["entry", "model", "flags", "verdict", "factor",
                      "the gradient is that of", "relative error"], rows)]
    if tried:
        out += ["", "Entries tried and not measured, and why:", "",
                table(["entry", "status", "reason"], tried)]
    return "\n".join(out) + "\n"


def matrix_figure(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from course_lib.course import plots
    from course_lib.frameworks.evidence import Matrix

    fig = plots.framework_matrix(Matrix.committed())
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})


def configurations_table() -> str:
    """The --with configurations, committed: the chapter's table
    (``Configurations.lines``, what ``describe_configurations`` prints)."""
    from collections import Counter

    from course_lib.frameworks.evidence import CONFIGURATION_HEAD, Configurations

    doc = Configurations.committed()
    lines = doc.lines()
    tally = ", ".join(f"{n} {v}" for v, n in Counter(str(r.verdict) for r in doc.rows).items())
    versions = ", ".join(f"{p} {v}" for p, v in doc.rows[0].stack.items()) if doc.rows else ""
    return (f"`data/{Configurations.NAME}.json`: {len(doc.rows)} rows ({tally}), "
            f"{doc.date}, {versions}; written by `{doc.command}`. A line per "
            "configuration, state and flag set, the models merged where their rows "
            "say the same:\n\n"
            + table(list(CONFIGURATION_HEAD), [line.cells for line in lines]) + "\n")


def logging_table() -> str:
    data = json.loads((ROOT / "data" / "frameworks-logging.json").read_text())
    run = data["run"]
    stack = ", ".join(f"{k} {v}" for k, v in data["stack"].items())
    rows = [[f"{r['framework']} {r['version']}", r["model"], r["logged"], r["mode"],
             f"{r['value']:.6f}", f"{r['token_mean']:.6f}", f"{r['relative_error']:.1e}",
             r["verdict"], r.get("recipe") or ""] for r in run["rows"]]
    return (f"`data/frameworks-logging.json` ({data['date']}; {stack}; "
            f"{run['world_size']} ranks, {run['backend']}), written by "
            f"`{data['command']}`:\n\n"
            + table(["framework", "model", "what is logged", "mode", "logged", "token mean",
                     "rel. error", "verdict", "recipe"], rows) + "\n")


PAGES = {
    "cli.md": cli_page,
    "checks-table.md": check_table,
    "bug-catalog.md": bug_catalog,
    "recipes-table.md": recipes_table,
    "frameworks-matrix.md": matrix_table,
    "frameworks-configurations.md": configurations_table,
    "frameworks-logging.md": logging_table,
}
FIGURES = {"frameworks-matrix.png": matrix_figure}


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, render in PAGES.items():
        target = out / name
        text = render()
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
        written.append(target)
    for name, draw in FIGURES.items():
        draw(out / name)
        written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (build/site/gen)")
    args = parser.parse_args(argv)
    written = write(args.out)
    print(f"site/generate.py: {len(written)} generated files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
