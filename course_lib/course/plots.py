"""Figures built from corpora, plans and reports. Each function returns a Figure.

Figures are plain ``matplotlib.figure.Figure`` objects (not pyplot-managed),
so a notebook shows each one exactly once, as the cell's value.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.core.data import Corpus
from course_lib.course.style import COLORS, LABELS, rank_color
from course_lib.reports import logs
from course_lib.reports.numbers import TINY, err_bound

if TYPE_CHECKING:
    from course_lib.course.api import EvaluationReport
    from course_lib.jobs.audit import BugsReport
    from course_lib.jobs.exercise import ExerciseReport
    from course_lib.jobs.frameworks import Matrix, MatrixRow
    from course_lib.jobs.parity import ParityReport
    from course_lib.jobs.resume import ResumeReport

WIDTH = 9.0  # inches: fills a notebook column
ZERO_AT = 1e-12  # log axes cannot show 0: exact zeros are drawn here, and labelled


def _figure(ncols: int = 1, height: float = 3.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, list(axes) if ncols > 1 else [axes]


def length_histograms(corpus: Corpus, bands: list[tuple[int, int]],
                      split: str = "train") -> Figure:
    """Sequence lengths of the split, coloured by the rank whose band holds them."""
    fig, (ax,) = _figure()
    lengths = corpus.lengths(split)
    for rank, (lo, hi) in enumerate(bands):
        mine = [n for n in lengths if lo <= n <= hi]
        # Bins of about 4 lengths that tile each band exactly, so no bin
        # straddles two ranks; a bar's height is per length, so a 5-length
        # bin is not taller for holding more lengths.
        n_bins = max(1, round((hi - lo + 1) / 4))
        edges = sorted({lo + round(k * (hi - lo + 1) / n_bins) - 0.5
                        for k in range(n_bins + 1)})
        bins = list(zip(edges[:-1], edges[1:], strict=True))
        heights = [sum(a < n < b for n in mine) / (b - a) for a, b in bins]
        ax.stairs(heights, edges, fill=True, color=rank_color(rank), alpha=0.85,
                  label=f"rank {rank}: {lo}-{hi} tokens ({len(mine)} seqs)")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("sequences per length")
    ax.set_title(f"{split} split: one length band per rank")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(frameon=False, loc="upper center", ncols=2)
    return fig


def plan_tokens(plan: list, corpus: Corpus) -> Figure:
    """Supervised tokens per rank in every window of the plan."""
    fig, (ax,) = _figure()
    world = len(plan[0])
    steps = range(len(plan))  # plan[0] is step 0, as in the chapter
    for rank in range(world):
        tokens = [sum(len(corpus.sequences[i]) - 1 for micro in window[rank]
                      for i in micro) for window in plan]
        ax.plot(steps, tokens, color=rank_color(rank), label=f"rank {rank}")
    ax.set_xlabel("step (one window, one optimizer update)")
    ax.set_ylabel("supervised tokens in the window")
    ax.set_ylim(bottom=0)
    ax.set_title("Same number of sequences per rank, not the same number of tokens")
    ax.legend(frameon=False)
    return fig


def _modes(report: ParityReport) -> list[str]:
    return ["global_token", "mean_of_means"] if report.world_size > 1 else ["global_token"]


def parity_scatter(report: ParityReport) -> Figure:
    """DDP gradient components against the reference, one panel per mode."""
    sample = report.grad_sample
    ref = sample["reference"]
    modes = _modes(report)
    fig, axes = _figure(len(modes), height=3.8)
    lo, hi = min(ref), max(ref)
    for ax, mode in zip(axes, modes, strict=True):
        ax.plot([lo, hi], [lo, hi], color=COLORS["reference"], lw=1, label="y = x")
        ax.scatter(ref, sample[mode], s=4, color=COLORS[mode], label=LABELS[mode])
        r = report.modes[mode]
        verdict = "allclose" if r.allclose else f"{r.violations:,} violations"
        ax.set_title(f"{LABELS[mode]}: {verdict}")
        ax.set_xlabel("reference gradient component")
        ax.set_ylabel("DDP gradient component")
        ax.legend(frameon=False, loc="upper left")
    fig.suptitle(f"{len(ref):,} of {report.compared_values:,} components shown")
    return fig


def parity_envelope(report: ParityReport) -> Figure:
    """|DDP - reference| against |reference|, with the allclose envelope."""
    sample = report.grad_sample
    ref = [abs(x) for x in sample["reference"]]
    fig, (ax,) = _figure(height=3.8)
    for mode in _modes(report):
        err = [abs(a - b) for a, b in zip(sample[mode], sample["reference"], strict=True)]
        exact = sum(e == 0 for e in err)
        label = LABELS[mode] + (f" ({exact} of {len(err):,} exactly 0, drawn at "
                                f"{ZERO_AT:g})"
                                if exact else "")
        ax.scatter(ref, [max(e, ZERO_AT) for e in err], s=4, color=COLORS[mode],
                   label=label)
    xs = sorted(x for x in ref if x > 0)
    ax.plot(xs, [report.atol + report.rtol * x for x in xs], color=COLORS["tolerance"],
            lw=2.5, label=f"atol + rtol·|ref| ({report.atol:g} + {report.rtol:g}·|ref|)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|reference component|")
    ax.set_ylabel("|DDP - reference|")
    ax.set_title(f"{len(ref):,} of {report.compared_values:,} components sampled:\n"
                 "a component passes when its point lies under the envelope")
    ax.legend(frameon=False, loc="upper left")
    return fig


def loss_curves(run_dir: Path, continuous_dir: Path, resume_step: int) -> Figure:
    """Window loss per token: stopped + resumed run vs the continuous run."""
    fig, (ax,) = _figure()
    cont = logs.loss_curve(continuous_dir)
    ax.plot(*zip(*cont, strict=True), color=COLORS["continuous"], lw=3, alpha=0.4,
            label="continuous 0 → end")
    main = logs.loss_curve(run_dir)
    before = [(s, v) for s, v in main if s <= resume_step]
    after = [(s, v) for s, v in main if s > resume_step]
    if before:
        ax.plot(*zip(*before, strict=True), color=COLORS["stop"], lw=1.2,
                label=f"stopped at {resume_step}")
    if after:
        ax.plot(*zip(*after, strict=True), color=COLORS["resume"], lw=1.2, ls="--",
                label=f"resumed from {resume_step}")
    ax.axvline(resume_step, color="0.6", lw=0.8)
    ax.annotate("checkpoint", (resume_step, ax.get_ylim()[1]), ha="center",
                va="top", fontsize=8, color="0.4")
    ax.set_xlabel("update")
    ax.set_ylabel("loss per token (nats)")
    ax.set_title("Resumed curve lies on the continuous one")
    ax.legend(frameon=False)
    return fig


def ablations(report: ResumeReport) -> Figure:
    """Max |param diff| at the last step, full resume vs each ablation."""
    fig, (ax,) = _figure()
    names = ["full resume", *report.ablations]
    diffs = [report.max_abs_param_diff,
             *(a.max_abs_param_diff for a in report.ablations.values())]
    floor = 1e-10
    colors = [COLORS["global_token"] if d == 0 else COLORS["mean_of_means"] for d in diffs]
    ax.barh(names, [max(d, floor) for d in diffs], color=colors)
    for y, d in enumerate(diffs):
        ax.text(max(d, floor) * 1.3, y, "exactly 0" if d == 0 else f"{d:.3g}",
                va="center", fontsize=9)
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, 10)
    ax.invert_yaxis()
    ax.set_xlabel(f"max |param diff| vs the continuous run at step {report.step}")
    ax.set_title("Leave one piece of state out, and the trajectory changes")
    return fig


def evaluation(report: EvaluationReport) -> Figure:
    """Test loss and accuracy: untrained vs trained, against the floor/ceiling."""
    fig, (left, right) = _figure(2)
    u = report.untrained
    left.bar(["untrained", "trained"], [u.loss_per_token, report.loss_per_token],
             color=[COLORS["untrained"], COLORS["global_token"]])
    left.axhline(report.entropy_floor, color=COLORS["floor"], ls="--",
                 label=f"entropy floor {report.entropy_floor:.3f}")
    left.set_ylabel("test loss per token (nats)")
    left.legend(frameon=False)
    right.bar(["untrained", "trained"],
              [100 * u.token_accuracy, 100 * report.token_accuracy],
              color=[COLORS["untrained"], COLORS["global_token"]])
    ceiling = report.extra.get("bayes_accuracy")
    if ceiling:
        right.axhline(100 * ceiling, color=COLORS["floor"], ls="--",
                      label=f"best possible {100 * ceiling:.1f}%")
        right.legend(frameon=False)
    right.set_ylabel("token accuracy (%)")
    fig.suptitle(f"{report.test_sequences} test sequences, {report.test_tokens:,} tokens")
    return fig


def exercise(report: ExerciseReport) -> Figure:
    """Per scenario: the two means (hand assumption) and the gradient errors."""
    fig, (left, right) = _figure(2)
    names = [sc.name + " " + "/".join(map(str, sc.tokens)) for sc in report.scenarios]
    x = range(len(names))
    for offset, key in ((-0.2, "mean_of_means"), (0.2, "global_token")):
        values = [sc.mean_of_means if key == "mean_of_means" else sc.global_mean
                  for sc in report.scenarios]
        left.bar([i + offset for i in x], values, width=0.4, color=COLORS[key],
                 label=LABELS[key])
    left.set_xticks(list(x), names)
    left.set_ylabel("mean loss per token (hand example)")
    left.legend(frameon=False, fontsize=8)
    for offset, key in ((-0.2, "mean_of_means"), (0.2, "global_token")):
        errs = [getattr(sc.gradients, key).max_abs_err for sc in report.scenarios]
        right.bar([i + offset for i in x],
                  [ZERO_AT if e < TINY else e for e in errs], width=0.4,
                  color=COLORS[key])
        for i, e in zip(x, errs, strict=True):
            if e < TINY:  # rounding level: written as the chapter prints it
                right.text(i + offset, ZERO_AT * 2, err_bound(e), rotation=90,
                           ha="center", va="bottom", fontsize=8)
    # Not the pass line: a component passes when |err| <= atol + rtol * |ref|.
    right.axhline(report.atol, color=COLORS["tolerance"], lw=2,
                  label=f"atol = {report.atol:g}; the threshold:\n"
                        f"atol + {report.rtol:g}·|ref|")
    right.set_yscale("log")
    right.set_xticks(list(x), names)
    right.set_ylabel("max |DDP - reference| gradient")
    right.legend(frameon=False, fontsize=8, loc="center left")
    return fig


def check_grid(ax, report: BugsReport, steps: list[str], labels: list[str],
               text, fontsize: float = 8) -> None:
    """The steps x checks grid on ``ax``: green passes, magenta fails;
    ``text(row, check, passed)`` writes each cell, ``labels`` each row."""
    checks = report.checks
    for i, name in enumerate(steps):
        row = report.steps[name]
        for j, check in enumerate(checks):
            passed = row.checks[check]
            ax.add_patch(Rectangle((j, i), 1, 1, edgecolor="white", lw=2,
                                   facecolor=COLORS["global_token" if passed
                                                    else "mean_of_means"]))
            ax.text(j + 0.5, i + 0.5, text(row, check, passed), ha="center",
                    va="center", color="white", fontsize=fontsize)
    ax.set_xlim(0, len(checks))
    ax.set_ylim(len(steps), 0)
    ax.set_xticks([j + 0.5 for j in range(len(checks))],
                  [c.replace("_", "\n") for c in checks], fontsize=fontsize)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(steps))], labels, fontsize=fontsize)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def bug_matrix(report: BugsReport) -> Figure:
    """Steps x checks: green passes, magenta fails; each cell shows its error."""
    names = list(report.steps)
    fig = Figure(figsize=(WIDTH, 0.42 * len(names) + 1.6), layout="constrained")
    ax = fig.subplots()

    def text(row, check, passed):
        err = row.max_abs_err.get(check)
        return ("pass" if passed else "FAIL") if err is None else _short(err)

    check_grid(ax, report, names, [f"{n} ({report.steps[n].kind})" for n in names], text)
    ax.set_xlabel("green: passes, magenta: fails; cells show max |err| "
                  "(exactly 0 is written 0)", fontsize=8)
    return fig


def _short(err: float) -> str:
    return "0" if err == 0 else f"{err:.0e}"


def framework_matrix(matrix: Matrix) -> Figure:
    """The version matrix as a heatmap: one row per framework version and
    flags, one column per model class; the colour is the relative error
    against the token mean, the text the formula the gradient matches."""
    import math

    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.candidates import CANDIDATES

    formula = {c.name: c.formula.split(":")[0] for c in CANDIDATES}
    models = list(matrix.models)
    keys: dict[tuple, dict[str, MatrixRow]] = {}
    for r in matrix.rows:
        flags = ", ".join(f"{k.replace('average_tokens_across_devices', 'avg tokens')}="
                          f"{v}" for k, v in r.flags.items())
        label = f"{r.framework} {r.version or '?'}" + (f"  {flags}" if flags else "")
        keys.setdefault((label,), {})[r.model] = r
    keys = {k: v for k, v in keys.items()
            if any(r.verdict != Verdict.NOT_RUN for r in v.values())}
    labels = [k[0] for k in keys]
    fig, (ax,) = _figure(height=0.26 * len(labels) + 1.4)
    norm = Normalize(vmin=-7, vmax=0.5)
    cmap = colormaps["viridis_r"]
    for i, cells in enumerate(keys.values()):
        for j, model in enumerate(models):
            cell = cells.get(model)
            if cell is None or cell.verdict == Verdict.NOT_RUN or cell.relative_error is None:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="#dddddd"))
                ax.text(j, i, str(Verdict.NOT_RUN), ha="center", va="center", fontsize=7)
                continue
            err = math.log10(max(cell.relative_error, 1e-9))
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color=cmap(norm(err))))
            text = str(Verdict.RANKS_DISAGREE) if cell.verdict == Verdict.RANKS_DISAGREE else \
                formula.get(cell.matches or "", "?")
            ax.text(j, i, f"{text}  ({cell.relative_error:.0e})", ha="center",
                    va="center", fontsize=7, color="white" if norm(err) > 0.6 else "black")
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xticks(range(len(models)), models)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.xaxis.tick_top()
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax,
                 label="log10 relative error vs the token mean")
    ax.set_title(f"The real loops, version by version ({matrix.date}, torch {matrix.torch}):"
                 " the formula each gradient matches", fontsize=9)
    return fig


def unit_weights(lengths: list[int], weights: dict[str, list[float]]) -> Figure:
    """Each sequence's per-token weight, times N (1 is the token mean's),
    against its supervised length, one series per objective."""
    fig, (ax,) = _figure(height=3.6)
    markers = dict(zip(weights, "os^Dv", strict=False))
    for name, ws in weights.items():
        ax.scatter(lengths, ws, s=18, marker=markers.get(name, "o"), alpha=0.8, label=name)
    ax.axhline(1.0, color=COLORS["tolerance"], lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("supervised tokens in the sequence")
    ax.set_ylabel("weight of each of its tokens x N")
    ax.set_title("Per-sequence normalization gives short sequences' tokens more weight")
    fig.legend(frameon=False, loc="outside lower center", ncols=len(weights), fontsize=8)
    return fig
