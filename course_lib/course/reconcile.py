"""This course's run beside the reference tutorial's run r1, with the reasons.

The verdicts must match (pass, fail, exactly 0, a loss well below the
untrained one); the magnitudes need not. Numbers are printed at precisions
that no CPU changes. ``table`` shows itself as an HTML table in a notebook
and as aligned text elsewhere.
"""

from __future__ import annotations

import html
from dataclasses import astuple, dataclass
from pathlib import Path

from course_lib.core.edition import decimal, marks, number, tr
from course_lib.course.api import EvaluationReport
from course_lib.jobs.parity import ParityReport
from course_lib.jobs.resume import ResumeReport
from course_lib.reports.numbers import err_bound


@dataclass(frozen=True)
class Row:
    quantity: str
    r1: str
    ours: str
    why: str


def header() -> Row:
    """The columns' names, in the edition (r1 is the reference run's name)."""
    return Row(tr("quantity"), "r1", tr("this course"), tr("why they differ"))


@dataclass(frozen=True)
class Table:
    rows: list[Row]

    def _repr_html_(self) -> str:
        def line(row: Row, tag: str) -> str:
            cells = "".join(f'<{tag} style="text-align:left">{html.escape(c)}</{tag}>'
                            for c in astuple(row))
            return f"<tr>{cells}</tr>"
        body = "".join(line(r, "td") for r in self.rows)
        return f"<table><thead>{line(header(), 'th')}</thead><tbody>{body}</tbody></table>"

    def __repr__(self) -> str:
        every = [astuple(r) for r in (header(), *self.rows)]
        widths = [max(len(row[i]) for row in every) for i in range(len(every[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)
                                   ).rstrip() for row in every)


# The reference tutorial's run r1.
R1 = {
    "compared_values": 282_628,
    "parity_correct": 3.73e-8,
    "parity_mean_of_means": 0.02157,
    "resume_diff": 0.0,
    "test_sequences": 256,
    "test_tokens": 18_231,
    "test_loss": 1.31525,
    "token_accuracy": 0.3622,
}


def rows(out: Path) -> list[Row]:
    """The table's rows, from the reports in ``out`` (parity, resume, evaluation)."""
    p = ParityReport.load(out)
    r = ResumeReport.load(out)
    e = EvaluationReport.load(out)
    verdict = tr("PASS") if p.correct.allclose else tr("FAIL")
    control = tr("FAIL") if not p.control_mode.allclose else tr("PASS")
    exactly = tr("{diff} exactly")
    return [
        Row(tr("gradient values"), number(R1["compared_values"]), number(p.compared_values),
            tr("a smaller model")),
        Row(tr("parity, W*S_r/N"), f"{number(R1['parity_correct'], '.2e')} {tr('PASS')}",
            f"{err_bound(p.correct.max_abs_err)} {verdict}",
            tr("gloo on CPU: another summation order")),
        Row(tr("parity, mean of means"), f"{decimal(R1['parity_mean_of_means'])} {tr('FAIL')}",
            f"{_decimal(p.control_mode.max_abs_err)} {control}", tr("another model and data")),
        Row(tr("resume at step {step}").format(step=100),
            exactly.format(diff=marks(repr(R1["resume_diff"]))),
            exactly.format(diff=marks(repr(r.max_abs_param_diff))),
            tr("same verdict: bit for bit")),
        *evaluation_rows(e),
    ]


def evaluation_rows(e: EvaluationReport) -> list[Row]:
    """The evaluation's rows alone (chapter 07): test tokens, loss, accuracy."""
    # The corpora differ, and r1's tutorial says its len(tokens) count agrees
    # with its own supervised tokens: no share of the gap can be put down to
    # the counting convention, so the row states our count only, both ways.
    as_length = e.test_tokens + e.test_sequences  # one more token per sequence
    return [
        Row(tr("test tokens"), number(R1["test_tokens"]), number(e.test_tokens),
            tr("another corpus; ours counts the L - 1 targets of its {sequences} sequences "
               "({as_length} if counted as L)").format(
                sequences=number(e.test_sequences), as_length=number(as_length))),
        Row(tr("test loss per token"), decimal(R1["test_loss"], 3),
            decimal(e.loss_per_token, 3),
            tr("another corpus: ours is a Markov source, floor {floor}").format(
                floor=decimal(e.entropy_floor, 3))),
        Row(tr("token accuracy"), _percent(R1["token_accuracy"]), _percent(e.token_accuracy),
            tr("another corpus: ours expects at best {accuracy} (Bayes: always its "
               "likeliest successor)").format(accuracy=_percent(e.bayes_accuracy))),
    ]


def _decimal(x: float | None) -> str:
    """Four decimals, or n/a where the report holds none."""
    return tr("n/a") if x is None else decimal(x)


def _percent(share: float) -> str:
    """A share as a percentage to one decimal: 36.2% (36,2 % in French)."""
    return marks(f"{100 * share:.1f}%")


def table(out: Path) -> Table:
    """The table, ready to display."""
    return Table(rows(out))
