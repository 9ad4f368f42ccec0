"""The one-page cheat-sheet: the rule, five traps, and the checks that catch each.

``python -m course_lib.course.cheatsheet`` (``make cheatsheet``) reads the
bug catalog's report of the course's run (``runs/course/reports/bugs.json``,
written by chapter 05), or runs the catalog itself into ``runs/cheatsheet``
when that run is absent, then writes:

- ``docs/cheatsheet-bugs.json``: the report it read, committed, so that the
  sheet can be rebuilt and tested without a run;
- ``docs/cheatsheet.md`` and ``docs/cheatsheet.png``: the sheet, whose
  "caught by" columns come from that report, never typed in;
- ``docs/fr/cheatsheet.md`` and ``docs/fr/cheatsheet.png``: the French
  edition's sheet, the same generator with every string through the catalog
  (``edition.tr``) and the page set in French typography.

``--snapshot`` rebuilds the sheets from the committed report, without a run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from course_lib.core import edition, objectives, paths, typography
from course_lib.core.edition import number, tr
from course_lib.course import docs_page, plots
from course_lib.course.docs_page import DocsPage
from course_lib.course.style import COLORS
from course_lib.jobs.audit import BugsReport

RUN_NAME = docs_page.RUN_NAME  # the chapters' run, where chapter 05 writes bugs.json
OWN_RUN = "cheatsheet"  # where the sheet runs the catalog when that run is absent


@dataclass(frozen=True)
class Trap:
    # title and what are read in the edition the sheet is written in: each a
    # ``tr`` call, made when the sheet is written (gettext's lazy string)
    title: Callable[[], str]
    what: Callable[[], str]  # what the code does wrong
    steps: tuple[str, ...]  # its built-in steps (course_lib/steps/catalog.py)


TRAPS = (
    Trap(lambda: tr("The local count"),
         lambda: tr("N taken on this rank only, without the all_reduce "
                    "(the mean of means: the same weights, W times smaller)"),
         ("local_count", "mean_of_means")),
    Trap(lambda: tr("A mean per microbatch"),
         lambda: tr("each microbatch divided by its own count, or the window's N "
                    "divided again by the accumulation steps"),
         ("per_microbatch_mean", "extra_accumulation_division")),
    Trap(lambda: tr("W forgotten"),
         lambda: tr("each rank backprops S_r / N, and DDP's mean divides by W once more"),
         ("forgot_world_size",)),
    Trap(lambda: tr("The wrong tokens counted"),
         lambda: tr("padding counted in N, or the length L counted before the label "
                    "shift (L - 1 targets)"),
         ("padding_counted", "length_before_shift")),
    Trap(lambda: tr("no_sync() around the backward only"),
         lambda: tr("DDP arms its hooks in the forward, so every microbatch syncs"),
         ("no_sync_backward_only",)),
)
CONTROL = "global_token"  # the rule itself: caught by nothing
EDITIONS = edition.EDITIONS  # one sheet per edition, English at docs/, the others at docs/<ed>/


def rule() -> str:
    return tr("""\
1. **Count first.** N = the supervised tokens (labels not -100, after the
   shift) of the whole accumulation window, summed over the ranks by one
   `all_reduce`: every rank holds the same N.
2. **Scale the sum.** Each rank backprops `W * S_r / N`, where S_r is the
   *sum* of its token losses over the window; DDP's mean over the W ranks
   then leaves the gradient of `sum_r S_r / N`, the mean over all tokens.
3. **Sync once.** `model.no_sync()` wraps the forward *and* the backward of
   every microbatch but the last.""")


CODE = """\
n = sum((labels != -100).sum() for _, labels in microbatches)
dist.all_reduce(n)  # N, the same on every rank
for i, (inputs, labels) in enumerate(microbatches):
    last = i == len(microbatches) - 1
    with contextlib.nullcontext() if last else model.no_sync():
        s = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(),
                            ignore_index=-100, reduction="sum")
        (s * world_size / n).backward()"""


PAGE: DocsPage[BugsReport] = DocsPage(BugsReport, "cheatsheet-bugs.json", "cheatsheet.md",
                                      "05", OWN_RUN)
snapshot_path, markdown_path, committed = PAGE.snapshot_path, PAGE.markdown_path, PAGE.committed


def _folder(ed: str) -> Path:
    docs = paths.project_root() / "docs"
    return docs if ed == edition.DEFAULT else docs / ed


def page_path(ed: str = edition.DEFAULT) -> Path:
    """The sheet of edition ``ed``: docs/cheatsheet.md, docs/fr/cheatsheet.md."""
    return _folder(ed) / PAGE.page


def png_path(ed: str = edition.DEFAULT) -> Path:
    return _folder(ed) / "cheatsheet.png"


@contextmanager
def _edition(ed: str) -> Iterator[None]:
    """``tr`` and ``number`` speak ``ed`` inside, whatever the shell says."""
    before = os.environ.get(edition.ENV)
    os.environ[edition.ENV] = ed
    try:
        yield
    finally:
        if before is None:
            del os.environ[edition.ENV]
        else:
            os.environ[edition.ENV] = before


def measure() -> tuple[BugsReport, str]:
    """The course's bug catalog (token mean), and where it came from."""
    from course_lib.course.api import load_config
    from course_lib.jobs.audit import bugs

    return PAGE.measure(lambda found: found.objective == objectives.DEFAULT,
                        lambda out: bugs(load_config(), out))


def _caught(report: BugsReport, step: str) -> str:
    found = report.steps[step].caught_by
    return ", ".join(f"`{c}`" for c in found) if found else tr("nothing")


def _which_check(report: BugsReport) -> list[str]:
    """What parity alone catches among the traps, and what catches the rest."""
    steps = [s for t in TRAPS for s in t.steps]
    missed = [s for s in steps if "parity" not in report.steps[s].caught_by]
    lines = [tr("- `parity`, one window against the single-process reference, catches "
                "{caught} of these {steps} steps.").format(
        caught=number(len(steps) - len(missed)), steps=number(len(steps)))]
    for step in missed:
        lines.append(tr("- `{step}` passes parity (its gradient is right); caught by "
                        "{caught}.").format(step=step, caught=_caught(report, step)))
    late = [s for s, row in report.steps.items()
            if row.caught_by and set(row.caught_by) <= {"trajectory"}]
    for step in late:
        lines.append(tr("- Beyond the five, `{step}` shows only after an update: caught "
                        "by {caught} alone.").format(step=step, caught=_caught(report, step)))
    return lines


def _yes(flag: bool) -> str:
    return tr("yes") if flag else tr("no")


def markdown(report: BugsReport, ed: str = edition.DEFAULT) -> str:
    """The sheet of edition ``ed``, from a bugs report."""
    with _edition(ed):
        text = _markdown(report)
    # as translation.py sets the French chapters: the whole page, its code untouched
    return typography.french(text) if ed == "fr" else text


def _markdown(report: BugsReport) -> str:
    lines = [
        tr("# Cheat-sheet: token-weighted gradients under DDP"), "",
        tr("Generated by `make cheatsheet` (`python -m course_lib.course.cheatsheet`); "
           "the PNG is [cheatsheet.png](cheatsheet.png). Terms: [glossary](glossary.md)."),
        "",
        tr("## The rule"), "", rule(), "", "```python", CODE, "```", "",
        tr("## Five traps, and the checks that catch them"), "",
        tr("Measured, not typed: each step of the bug catalog "
           "(`course_lib/steps/catalog.py`) through every check of `course-lib bugs`, "
           "on {world_size} ranks, {backend} on {device}, {dtype}, torch {torch}. "
           "A check that catches a trap fails on it.").format(
            world_size=number(report.world_size), backend=report.backend,
            device=report.device, dtype=report.dtype, torch=report.torch), "",
        tr("| trap | what goes wrong | built-in step | caught by |"),
        "|---|---|---|---|",
    ]
    for trap in TRAPS:
        for i, step in enumerate(trap.steps):
            head = (f"**{trap.title()}**", trap.what()) if i == 0 else ("", "")
            lines.append(f"| {head[0]} | {head[1]} | `{step}` | {_caught(report, step)} |")
    lines.append(tr("| the rule | (the control) | `{step}` | {caught} |").format(
        step=CONTROL, caught=_caught(report, CONTROL)))
    lines += [
        "", tr("## Which check to run"), "", *_which_check(report), "",
        tr("Every bug of the catalog caught: {all_caught}; no correct design flagged: "
           "{no_alarm}.").format(all_caught=_yes(report.every_bug_caught),
                                 no_alarm=_yes(report.no_false_alarm)), "",
        tr("Run them on your own step: `course-lib audit --step my_step.py:my_step`."),
        "",
    ]
    return "\n".join(lines)


def figure(report: BugsReport, ed: str = edition.DEFAULT) -> Figure:
    """The sheet of edition ``ed`` as one figure: the rule on top, the traps x
    checks below."""
    with _edition(ed):
        return _figure(report)


def _figure(report: BugsReport) -> Figure:
    rows = [(tr("{n}. {title}: ").format(n=n, title=t.title()) if i == 0 else "", s)
            for n, t in enumerate(TRAPS, 1) for i, s in enumerate(t.steps)]
    rows.append((tr("the rule (control): "), CONTROL))
    fig = Figure(figsize=(9.0, 7.6))
    fig.text(0.03, 0.97, tr("Token-weighted gradients under DDP: the rule"),
             fontsize=13, weight="bold", va="top")
    summary = tr("1. count first: N = the supervised tokens of the whole window, "
                 "all_reduce'd over the ranks\n"
                 "2. each rank backprops  W · S_r / N   (S_r: the SUM of its token "
                 "losses over the window)\n"
                 "3. no_sync() around the forward AND the backward of every "
                 "microbatch but the last")
    fig.text(0.03, 0.915, summary, fontsize=9.5, va="top", linespacing=1.5,
             color=COLORS["global_token"])
    fig.text(0.05, 0.79, CODE, fontsize=8, va="top", family="monospace",
             color=COLORS["reference"])
    fig.text(0.03, 0.60, tr("Five traps, and the checks that catch them"),
             fontsize=11, weight="bold", va="top")
    ax = fig.add_axes((0.40, 0.08, 0.58, 0.42))
    plots.check_grid(ax, report, [step for _, step in rows],
                     [f"{t}{s}" for t, s in rows],
                     lambda row, check, passed: tr("pass") if passed else tr("CAUGHT"),
                     fontsize=7)
    fig.text(0.03, 0.02, tr("Magenta: the check fails on the step, so it catches the "
                            "trap. Measured by course-lib bugs: {world_size} ranks, "
                            "{backend} on {device}, {dtype}.").format(
        world_size=number(report.world_size), backend=report.backend,
        device=report.device, dtype=report.dtype), fontsize=8)
    return fig


def write(report: BugsReport, *, snapshot: bool = True) -> list[Path]:
    """The sheets' files, one page and one PNG per edition; with ``snapshot``,
    the report they were made from too."""
    written = PAGE.write(report, markdown(report), snapshot=snapshot)
    for ed in EDITIONS:
        if ed != edition.DEFAULT:
            page_path(ed).parent.mkdir(parents=True, exist_ok=True)
            page_path(ed).write_text(markdown(report, ed), encoding="utf-8")
            written.append(page_path(ed))
        figure(report, ed).savefig(png_path(ed), dpi=110)
        written.append(png_path(ed))
    return written


def _say(report: BugsReport) -> None:
    for trap in TRAPS:
        for step in trap.steps:
            print(f"  {step:<28} caught by {', '.join(report.steps[step].caught_by)}")


def main(argv: list[str] | None = None) -> int:
    return PAGE.main(argv, __doc__.splitlines()[0], measure,
                     lambda report, snapshot: write(report, snapshot=snapshot), _say)


if __name__ == "__main__":
    sys.exit(main())
