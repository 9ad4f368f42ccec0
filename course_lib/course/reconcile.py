"""This course's run beside the reference tutorial's run r1, with the reasons.

The verdicts must match (pass, fail, exactly 0, a loss well below the
untrained one); the magnitudes need not. Numbers are printed at precisions
that no CPU changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

    def __str__(self) -> str:
        return f"{self.quantity:<24} {self.r1:<14} {self.ours:<16} {self.why}"


# The reference tutorial's run r1.
R1 = {
    "compared_values": 282_628,
    "parity_correct": 3.73e-8,
    "parity_mean_of_means": 0.02157,
    "resume_diff": 0.0,
    "test_tokens": 18_231,
    "test_loss": 1.31525,
    "token_accuracy": 0.3622,
}


def rows(out: Path) -> list[Row]:
    """The table, from the reports in ``out`` (parity, resume, evaluation)."""
    p = ParityReport.load(out)
    r = ResumeReport.load(out)
    e = EvaluationReport.load(out)
    verdict = "PASS" if p.correct.allclose else "FAIL"
    control = "FAIL" if not p.control_mode.allclose else "PASS"
    return [
        Row("quantity", "r1", "this course", "why they differ"),
        Row("gradient values", f"{R1['compared_values']:,}", f"{p.compared_values:,}",
            "a smaller model"),
        Row("parity, W*S_r/N", f"{R1['parity_correct']:.2e} PASS",
            f"{err_bound(p.correct.max_abs_err)} {verdict}",
            "gloo on CPU: another summation order"),
        Row("parity, mean of means", f"{R1['parity_mean_of_means']:.4f} FAIL",
            f"{p.control_mode.max_abs_err:.4f} {control}", "another model and data"),
        Row("resume at step 100", "0 exactly", f"{r.max_abs_param_diff!r} exactly",
            "same verdict: bit for bit"),
        Row("test tokens", f"{R1['test_tokens']:,}", f"{e.test_tokens:,}",
            "L - 1 targets per sequence"),
        Row("test loss per token", f"{R1['test_loss']:.3f}", f"{e.loss_per_token:.2f}",
            f"Markov corpus, floor {e.entropy_floor:.2f}"),
        Row("token accuracy", f"{100 * R1['token_accuracy']:.1f}%",
            f"{100 * e.token_accuracy:.0f}%", "a known best: "
            f"{100 * e.bayes_accuracy:.0f}%"),
    ]
