"""Figures built from corpora, plans and reports. Each function returns a Figure.

Figures are plain ``matplotlib.figure.Figure`` objects (not pyplot-managed),
so a notebook shows each one exactly once, as the cell's value.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.core.data import Corpus
from course_lib.course.style import COLORS, LABELS, rank_color
from course_lib.reports.numbers import TINY, err_bound

if TYPE_CHECKING:
    from course_lib.course.api import EvaluationReport
    from course_lib.frameworks.evidence import Matrix, MatrixRow
    from course_lib.jobs.audit import BugsReport
    from course_lib.jobs.exercise import ExerciseReport
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
    ax.set_ylabel("sequences per length (bin average)")
    ax.set_title(f"{split} split: one length band per rank")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(frameon=False, loc="upper center", ncols=2)
    return fig


def label_mask(labels, rank: int = 0) -> Figure:
    """A microbatch's label cells: supervised tokens in the rank's colour,
    padding (``IGNORE_INDEX``) in grey; one row per sequence."""
    from matplotlib.colors import ListedColormap

    from course_lib.core.model import supervised_mask

    mask = supervised_mask(labels).int().numpy()
    rows, cols = mask.shape
    fig, (ax,) = _figure(height=2.6)
    ax.imshow(mask, cmap=ListedColormap(["#d9d9d9", rank_color(rank)]),
              vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel(f"label position (0-{cols - 1})")
    ax.set_ylabel("sequence (row)")
    ax.set_yticks(range(rows))
    tokens = int(mask.sum())
    ax.set_title(f"{rows} x {cols} label cells: {tokens} supervised tokens (colour),"
                 f" {rows * cols - tokens} padding (grey)")
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
    ref = sample.reference
    modes = _modes(report)
    fig, axes = _figure(len(modes), height=3.8)
    lo, hi = min(ref), max(ref)
    for ax, mode in zip(axes, modes, strict=True):
        ax.plot([lo, hi], [lo, hi], color=COLORS["reference"], lw=1, label="y = x")
        ax.scatter(ref, sample.of(mode), s=4, color=COLORS[mode], label=LABELS[mode])
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
    ref = [abs(x) for x in sample.reference]
    fig, (ax,) = _figure(height=3.8)
    for mode in _modes(report):
        err = [abs(a - b) for a, b in zip(sample.of(mode), sample.reference, strict=True)]
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


ABLATION_COLORS = ["#2166ac", "#e08214", "#8073ac", "#35978f"]


def ablation_drift(report: ResumeReport) -> Figure:
    """Max |param diff| vs the continuous run after each update from the
    resume on, one line per ablation (log y, clipped to the band the lines
    fill). Each line is one kind of missing state; the full resume, 0 at
    every update, is written as text."""
    fig, (ax,) = _figure()
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D"]
    shown = []
    first = report.resumed_from_step + 1
    for i, (name, a) in enumerate(report.ablations.items()):
        xs = list(range(first, first + len(a.drift)))
        ys = [d if d > 0 else float("nan") for d in a.drift]
        shown += [d for d in a.drift if d > 0]
        ax.plot(xs, ys, color=ABLATION_COLORS[i % 4], ls=styles[i % 4], lw=1.6,
                marker=markers[i % 4], ms=3.5, markevery=5, label=name)
    if shown:
        ax.set_yscale("log")
        ax.set_ylim(min(shown) / 1.5, max(shown) * 1.5)
    if report.identical:
        ax.text(0.99, 0.03, f"full resume: exactly 0 at step {report.step}",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=9)
    ax.set_xlabel("update")
    ax.set_ylabel("max |param diff| vs continuous run")
    ax.set_title(f"After the resume at step {report.resumed_from_step}: "
                 "each missing piece, update by update")
    # the lines rise from the left: the lower right stays free for the legend
    ax.legend(frameon=False, fontsize=8, loc="lower right", ncols=2,
              bbox_to_anchor=(1.0, 0.1))
    return fig


def evaluation(report: EvaluationReport, vocab: int | None = None) -> Figure:
    """Test loss and accuracy: untrained vs trained, against the floor/ceiling
    (and, given ``vocab``, the uniform guess's ln vocab on the loss panel).
    Neutral greys: green is the course's colour for the token mean."""
    fig, (left, right) = _figure(2)
    u = report.untrained
    greys = ["#bdbdbd", "#4d4d4d"]  # untrained, trained
    left.bar(["untrained", "trained"], [u.loss_per_token, report.loss_per_token],
             color=greys)
    left.axhline(report.entropy_floor, color=COLORS["floor"], ls="--",
                 label=f"entropy floor {report.entropy_floor:.3f}")
    if vocab:
        left.axhline(math.log(vocab), color="#666666", ls=":", lw=1.5,
                     label=f"uniform guess ln {vocab} = {math.log(vocab):.3f}")
        left.set_ylim(0, max(u.loss_per_token, math.log(vocab)) * 1.3)  # room for the legend
    left.set_ylabel("test loss per token (nats)")
    left.legend(frameon=False, loc="upper right")
    right.bar(["untrained", "trained"],
              [100 * u.token_accuracy, 100 * report.token_accuracy], color=greys)
    ceiling = getattr(report, "bayes_accuracy", None) or report.extra.get("bayes_accuracy")
    if ceiling:
        right.axhline(100 * ceiling, color=COLORS["floor"], ls="--",
                      label=f"best possible {100 * ceiling:.2f}%")
        right.set_ylim(0, 100 * ceiling * 1.25)  # room for the legend
        right.legend(frameon=False, loc="upper left")
    right.set_ylabel("token accuracy (%)")
    fig.suptitle(f"{report.test_sequences} test sequences, {report.test_tokens:,} tokens")
    return fig


def exercise(report: ExerciseReport) -> Figure:
    """Per scenario: the real model's two means of its losses (left) and the
    largest gradient error of each mode (right): close losses, far gradients."""
    fig, (left, right) = _figure(2)
    names = [sc.name + " " + "/".join(map(str, sc.tokens)) for sc in report.scenarios]
    x = range(len(names))
    for offset, key in ((-0.2, "mean_of_means"), (0.2, "global_token")):
        values = [sc.model.mean_of_means if key == "mean_of_means" else sc.model.global_mean
                  for sc in report.scenarios]
        left.bar([i + offset for i in x], values, width=0.4, color=COLORS[key],
                 label=LABELS[key])
    gaps = [abs(sc.model.mean_of_means - sc.model.global_mean) for sc in report.scenarios]
    top = max(max(sc.model.mean_of_means, sc.model.global_mean) for sc in report.scenarios)
    for i, gap in zip(x, gaps, strict=True):
        left.text(i, top * 1.03, f"gap {gap:.4f}", ha="center", va="bottom", fontsize=8)
    left.set_ylim(0, top * 1.3)
    left.set_xticks(list(x), names)
    left.set_ylabel("mean loss per token (nat), real model")
    left.set_title(f"loss: {max(gaps):.4f} nat apart", fontsize=10)
    left.legend(frameon=False, fontsize=8, loc="upper left", ncols=2)
    for offset, key in ((-0.2, "mean_of_means"), (0.2, "global_token")):
        errs = [getattr(sc.gradients, key).max_abs_err for sc in report.scenarios]
        right.bar([i + offset for i in x],
                  [ZERO_AT if e < TINY else e for e in errs], width=0.4,
                  color=COLORS[key])
        for i, e in zip(x, errs, strict=True):
            if e < TINY:  # rounding level: written as the chapter prints it
                right.text(i + offset, ZERO_AT * 2, err_bound(e), rotation=90,
                           ha="center", va="bottom", fontsize=8)
    if any(getattr(sc.gradients, key).max_abs_err < TINY
           for sc in report.scenarios for key in ("mean_of_means", "global_token")):
        right.plot([], [], " ", label=f"bars at {ZERO_AT:.0e} (floor): "
                                      f"|err| {err_bound(0.0)}")
    # Not the pass line: a component passes when |err| <= atol + rtol * |ref|.
    right.axhline(report.atol, color=COLORS["tolerance"], lw=2,
                  label=f"atol = {report.atol:g}; the threshold:\n"
                        f"atol + {report.rtol:g}·|ref|")
    right.set_yscale("log")
    right.set_xticks(list(x), names)
    right.set_ylabel("max |DDP - reference| gradient")
    worst_err = max((e for sc in report.scenarios
                     if (e := sc.gradients.mean_of_means.max_abs_err) is not None),
                    default=report.atol)
    right.set_title(f"gradient: {worst_err:.1e} off", fontsize=10)
    right.set_ylim(ZERO_AT / 3, max(worst_err, report.atol) * 1e4)  # room for the legend
    right.legend(frameon=False, fontsize=8, loc="upper left")
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
        if err is None and not passed and check == "uneven_microbatches":
            return "hang"  # the step never finished: no gradient to measure
        return ("pass" if passed else "FAIL") if err is None else _short(err)

    check_grid(ax, report, names, [f"{n} ({report.steps[n].kind})" for n in names], text)
    ax.set_xlabel("green: passes, magenta: fails; cells show max |err| "
                  "(exactly 0 is written 0); hang: the step never finished",
                  fontsize=8)
    return fig


def _short(err: float) -> str:
    """Below TINY the digits are rounding, which the hardware decides."""
    return "0" if err == 0 else err_bound(err) if err < TINY else f"{err:.0e}"


def framework_matrix(matrix: Matrix) -> Figure:
    """The version matrix as a heatmap: one row per framework version and
    flags, one column per model class; the colour is the relative error
    against the token mean, the text the formula the gradient matches."""
    import math

    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    from course_lib.core.verdicts import Verdict
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
                (cell.matches or "?")
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
    from matplotlib.ticker import FixedLocator, NullFormatter

    fig, (ax,) = _figure(height=3.6)
    markers = dict(zip(weights, "os^Dv", strict=False))
    # chapter 01's code: the token mean green; the sequence mean orange
    colors = {"token": COLORS["global_token"], "sequence": "#e08214",
              "weighted": COLORS["stop"]}
    for name, ws in weights.items():
        ax.scatter(lengths, ws, s=18, marker=markers.get(name, "o"), alpha=0.8, label=name,
                   color=colors.get(name, COLORS["reference"]))
    ax.axhline(1.0, color=COLORS["tolerance"], lw=1)
    ax.set_yscale("log")
    ticks = [t for t in (0.25, 0.5, 0.6, 1, 2, 4, 8)
             if min(min(ws) for ws in weights.values()) * 0.9 <= t
             <= max(max(ws) for ws in weights.values()) * 1.1]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("supervised tokens in the sequence")
    ax.set_ylabel("weight of each of its tokens x N")
    ax.set_title("Per-sequence normalization gives short sequences' tokens more weight")
    fig.legend(frameon=False, loc="outside lower center", ncols=len(weights), fontsize=8)
    return fig


def ddp_step() -> Figure:
    """One DDP step on two ranks: each rank's forward and backward on its own
    share, one all_reduce of the ``.grad`` divided by W, the same step."""
    from matplotlib.patches import FancyBboxPatch

    fig, (ax,) = _figure(height=3.6)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.4)
    ax.axis("off")

    def box(x, y, w, h, text, color, fill="white"):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05",
                                    fc=fill, ec=color, lw=1.6))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5)

    def arrow(x0, y0, x1, y1, color="0.3"):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.2})

    steps = [(0.1, "its own share\nof the window"),
             (1.75, "forward:\nloss of its tokens"),
             (3.4, "backward:\nfills .grad")]
    rows = {0: 3.0, 1: 0.5}  # y of each rank's row
    for rank, y in rows.items():
        color = rank_color(rank)
        ax.text(0.1, y + 1.05, f"rank {rank}: a full replica", color=color,
                fontsize=9, fontweight="bold")
        for i, (x, text) in enumerate(steps):
            box(x, y, 1.35, 0.8, text, color)
            if i:
                arrow(x - 0.3, y + 0.4, x - 0.05, y + 0.4)
        arrow(4.8, y + 0.4, 5.25, y + 0.4)
        arrow(7.35, y + 0.4, 7.8, y + 0.4)
        box(7.85, y, 1.95, 0.8, "opt.step():\nthe same step", color)
    grey = COLORS["reference"]
    box(5.3, 0.5, 2.0, 3.3, "all_reduce\nof .grad / W\n\neach rank gets\nthe sum:\n"
        "the average", grey, fill="#f0f0f0")
    ax.text(8.8, 2.25, "the replicas\nstay equal", ha="center", va="center",
            fontsize=8.5, color=grey, style="italic")
    ax.set_title("One DDP step on two ranks (W = 2)")
    return fig
