"""Figures built from corpora, plans and reports. Each function returns a Figure.

Figures are plain ``matplotlib.figure.Figure`` objects (not pyplot-managed),
so a notebook shows each one exactly once, as the cell's value. Every title,
label and legend goes through the catalog (``tr``), its numbers through
``number`` and ``decimal``: the French edition draws French figures.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.core import edition
from course_lib.core.data import Corpus
from course_lib.core.edition import decimal, number, tr
from course_lib.course.style import COLORS, LABELS, in_edition, rank_color
from course_lib.reports.numbers import TINY, err_bound

if TYPE_CHECKING:
    from course_lib.course.api import EvaluationReport
    from course_lib.frameworks.evidence import Matrix, MatrixRow
    from course_lib.jobs.audit import BugsReport
    from course_lib.jobs.exercise import ExerciseReport
    from course_lib.jobs.frameworks_logging import LoggedRow, LoggingReport
    from course_lib.jobs.parity import ParityReport
    from course_lib.jobs.recipes import RegimeInfo, TokenWeight
    from course_lib.jobs.resume import ResumeReport

WIDTH = 9.0  # inches: fills a notebook column
ZERO_AT = 1e-12  # log axes cannot show 0: exact zeros are drawn here, and labelled


def _percent(share: float) -> str:
    """A share as a percentage, two significant digits: 0.096%, 50%."""
    return tr("{value}%").format(value=number(100 * share, ".2g"))


def _figure(ncols: int = 1, height: float = 3.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, list(axes) if ncols > 1 else [axes]


def length_histograms(corpus: Corpus, bands: list[tuple[int, int]],
                      split: str = "train") -> Figure:
    """Sequence lengths of the split, coloured by the rank whose band holds them."""
    fig, (ax,) = _figure()
    lengths = corpus.lengths(split)
    widths: set[int] = set()  # the bins' widths, in lengths
    for rank, (lo, hi) in enumerate(bands):
        mine = [n for n in lengths if lo <= n <= hi]
        # Bins of about 4 lengths that tile each band exactly, so no bin
        # straddles two ranks; a bar's height is per length, so a 5-length
        # bin is not taller for holding more lengths.
        n_bins = max(1, round((hi - lo + 1) / 4))
        edges = sorted({lo + round(k * (hi - lo + 1) / n_bins) - 0.5
                        for k in range(n_bins + 1)})
        bins = list(zip(edges[:-1], edges[1:], strict=True))
        widths.update(round(b - a) for a, b in bins)
        heights = [sum(a < n < b for n in mine) / (b - a) for a, b in bins]
        ax.stairs(heights, edges, fill=True, color=rank_color(rank), alpha=0.85,
                  label=tr("rank {rank}: {lo}-{hi} tokens ({n} seqs)").format(
                      rank=rank, lo=lo, hi=hi, n=number(len(mine))))
    ax.set_xlabel(tr("sequence length (tokens)"))
    ax.set_ylabel(tr("sequences per length"))
    narrow, wide = min(widths), max(widths)
    width = f"{narrow}" if narrow == wide else f"{narrow}-{wide}"
    ax.set_title(tr("{split} split: one length band per rank (bins of {width} lengths)")
                 .format(split={"train": tr("train"), "test": tr("test")}.get(split, split),
                         width=width))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(frameon=False, loc="upper center", ncols=2)
    return in_edition(fig)


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
    ax.set_xlabel(tr("label position (0-{last})").format(last=cols - 1))
    ax.set_ylabel(tr("sequence (row)"))
    ax.set_yticks(range(rows))
    tokens = int(mask.sum())
    ax.set_title(tr("{rows} x {cols} label cells: {tokens} supervised tokens (colour), "
                    "{padding} padding (grey)").format(
                        rows=rows, cols=cols, tokens=number(tokens),
                        padding=number(rows * cols - tokens)))
    return in_edition(fig)


def plan_tokens(plan: list, corpus: Corpus) -> Figure:
    """Supervised tokens per rank in every window of the plan (top), and the
    last rank's tokens over rank 0's, window by window (bottom)."""
    fig = Figure(figsize=(WIDTH, 4.2), layout="constrained")
    ax, ax_ratio = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1.3])
    world = len(plan[0])
    steps = range(len(plan))  # plan[0] is step 0, as in the chapter
    per_rank = [[sum(len(corpus.sequences[i]) - 1 for micro in window[rank]
                     for i in micro) for window in plan] for rank in range(world)]
    for rank, tokens in enumerate(per_rank):
        ax.plot(steps, tokens, color=rank_color(rank),
                label=tr("rank {rank}").format(rank=rank))
    ax.set_ylabel(tr("supervised tokens\nin the window"))
    ax.set_ylim(bottom=0)
    ax.set_title(tr("Same number of sequences per rank, not the same number of tokens"))
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))
    last = world - 1
    ratios = [n / n0 for n, n0 in zip(per_rank[last], per_rank[0], strict=True)]
    ax_ratio.plot(steps, ratios, color="0.3", lw=1, label=f"N_{last} / N_0")
    ax_ratio.axhline(2, color=COLORS["reference"], ls="--", lw=1, label=tr("2x"))
    closest = min(steps, key=lambda s: ratios[s])
    ax_ratio.plot([closest], [ratios[closest]], "o", color="0.3", ms=5,
                  label=tr("lowest ratio"))
    # the axis spans the ratios and the 2x line, not 0: the wobble shows
    lo, hi = min(min(ratios), 2), max(ratios)
    ax_ratio.set_ylim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
    ax_ratio.set_ylabel(f"N_{last} / N_0")
    ax_ratio.set_xlabel(tr("step (one window, one optimizer update)"))
    ax_ratio.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))
    return in_edition(fig)


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
        ax.scatter(ref, sample.of(mode), s=4, color=COLORS[mode], label=tr(LABELS[mode]))
        r = report.modes[mode]
        verdict = "allclose" if r.allclose else tr("{n} violations").format(
            n=number(r.violations))
        ax.set_title(f"{tr(LABELS[mode])}: {verdict}")
        ax.set_xlabel(tr("reference gradient component"))
        ax.set_ylabel(tr("DDP gradient component"))
        ax.legend(frameon=False, loc="upper left")
    fig.suptitle(tr("{shown} of {values} components shown").format(
        shown=number(len(ref)), values=number(report.compared_values)))
    return in_edition(fig)


def parity_envelope(report: ParityReport) -> Figure:
    """|DDP - reference| against |reference|, with the allclose envelope."""
    sample = report.grad_sample
    ref = [abs(x) for x in sample.reference]
    fig, (ax,) = _figure(height=3.8)
    for mode in _modes(report):
        err = [abs(a - b) for a, b in zip(sample.of(mode), sample.reference, strict=True)]
        exact = sum(e == 0 for e in err)
        label = tr(LABELS[mode]) + (tr(" ({exact} of {n} exactly 0, drawn at {at})").format(
            exact=number(exact), n=number(len(err)), at=number(ZERO_AT, "g"))
            if exact else "")
        ax.scatter(ref, [max(e, ZERO_AT) for e in err], s=4, color=COLORS[mode],
                   label=label)
    xs = sorted(x for x in ref if x > 0)
    ax.plot(xs, [report.atol + report.rtol * x for x in xs], color=COLORS["tolerance"],
            lw=2.5, label=f"atol + rtol·|ref| ({number(report.atol, 'g')} + "
                          f"{number(report.rtol, 'g')}·|ref|)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(tr("|reference component|"))
    ax.set_ylabel(tr("|DDP - reference|"))
    ax.set_title(tr("{shown} of {values} components sampled:\n"
                    "a component passes when its point lies under the envelope").format(
                        shown=number(len(ref)), values=number(report.compared_values)))
    ax.legend(frameon=False, loc="upper left")
    return in_edition(fig)


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
        ax.text(0.99, 0.03, tr("full resume: exactly 0 at step {step}").format(
                    step=report.step),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=9)
    ax.set_xlabel(tr("update"))
    ax.set_ylabel(tr("max |param diff| vs continuous run"))
    ax.set_title(tr("After the resume at step {step}: each missing piece, update by update")
                 .format(step=report.resumed_from_step))
    # the lines rise from the left: the lower right stays free for the legend
    ax.legend(frameon=False, fontsize=8, loc="lower right", ncols=2,
              bbox_to_anchor=(1.0, 0.1))
    return in_edition(fig)


def evaluation(report: EvaluationReport, vocab: int | None = None,
               se: float | None = None) -> Figure:
    """Test loss and accuracy: untrained vs trained, against the floor/ceiling
    (and, given ``vocab``, the uniform guess's ln vocab on the loss panel).
    Each bar is labelled with its value as the chapter prints it (4 decimals,
    2 for a percentage); given ``se``, the trained loss's standard error is
    drawn as an error bar and written beside its value.
    Neutral greys: green is the course's colour for the token mean."""
    fig, (left, right) = _figure(2)
    u = report.untrained
    greys = ["#bdbdbd", "#4d4d4d"]  # untrained, trained
    losses = [u.loss_per_token, report.loss_per_token]
    left.bar([tr("untrained"), tr("trained")], losses, color=greys)
    if se:
        left.errorbar([1], [report.loss_per_token], yerr=[se], color="black",
                      capsize=6, lw=1.2)
    for x, value in enumerate(losses):  # the untrained's above its bar,
        # clear of the floor's line
        text = decimal(value) + (f" ± {decimal(se)}" if se and x == 1 else "")
        left.text(x, value + 0.05 if x == 0 else value / 2, text, ha="center",
                  va="bottom" if x == 0 else "center", fontsize=9,
                  color="black" if x == 0 else "white")
    left.axhline(report.entropy_floor, color=COLORS["floor"], ls="--",
                 label=tr("entropy floor {value}").format(
                     value=decimal(report.entropy_floor, 3)))
    if vocab:
        left.axhline(math.log(vocab), color="#666666", ls=":", lw=1.5,
                     label=tr("uniform guess ln {vocab} = {value}").format(
                         vocab=vocab, value=decimal(math.log(vocab), 3)))
        left.set_ylim(0, max(u.loss_per_token, math.log(vocab)) * 1.3)  # room for the legend
    left.set_ylabel(tr("test loss per token (nats)"))
    left.legend(frameon=False, loc="upper right")
    accuracies = [100 * u.token_accuracy, 100 * report.token_accuracy]
    right.bar([tr("untrained"), tr("trained")], accuracies, color=greys)
    for x, value in enumerate(accuracies):  # the untrained bar is too short to hold it
        right.text(x, value + 0.8 if x == 0 else value / 2, number(value / 100, ".2%"),
                   ha="center", va="bottom" if x == 0 else "center", fontsize=9,
                   color="black" if x == 0 else "white")
    if vocab:  # a guess that knows nothing: 1 / vocab in expectation
        right.axhline(100 / vocab, color="#666666", ls=":", lw=1.5,
                      label=tr("uniform guess 1/{vocab} = {value}").format(
                          vocab=vocab, value=number(1 / vocab, ".1%")))
    ceiling = getattr(report, "bayes_accuracy", None) or report.extra.get("bayes_accuracy")
    if ceiling:
        right.axhline(100 * ceiling, color=COLORS["floor"], ls="--",
                      label=tr("Bayes (expected) {value}").format(
                          value=number(ceiling, ".2%")))
        right.set_ylim(0, 100 * ceiling * 1.25)  # room for the legend
        right.legend(frameon=False, loc="upper left")
    right.set_ylabel(tr("token accuracy (%)"))
    fig.suptitle(tr("{sequences} test sequences, {tokens} tokens").format(
        sequences=number(report.test_sequences, "d"), tokens=number(report.test_tokens)))
    return in_edition(fig)


def exercise(report: ExerciseReport) -> Figure:
    """Per scenario, the mean of means against the token mean, both as a
    share: its loss gap over the loss, and its gradient error's norm over the
    gradient's norm. The loss moves by a fraction of a percent where the
    gradient moves by half. A share under 1e-6 is rounding: a hollow marker."""
    fig, (ax,) = _figure(height=3.6)
    floor = 1e-6  # a share under it is rounding: drawn at the floor, labelled
    names = [tr(sc.name) + " " + "/".join(map(str, sc.tokens)) for sc in report.scenarios]
    loss = [abs(sc.model.mean_of_means - sc.model.global_mean) / sc.model.global_mean
            for sc in report.scenarios]
    grad = [sc.gradients.relative_err["mean_of_means"] for sc in report.scenarios]
    top = max(1.0, max(grad + loss))  # a share: the axis ends at 1
    for offset, shares, label, color, hatch in (
            (-0.2, loss, tr("loss: |mean of means - global| / global"),
             "white", "///"),
            (0.2, grad, tr("gradient: ||g_mom - g_ref|| / ||g_ref||"),
             COLORS["mean_of_means"], None)):
        xs = [i + offset for i in range(len(names))]
        ax.bar([x for x, v in zip(xs, shares, strict=True) if v >= floor],
               [v for v in shares if v >= floor], width=0.4, color=color,
               edgecolor=COLORS["mean_of_means"], hatch=hatch, label=label)
        for x, v in zip(xs, shares, strict=True):
            if v < floor:  # rounding, not a value: no bar
                ax.plot([x], [floor], "o", ms=7, mfc="white",
                        mec=COLORS["mean_of_means"])
            text = "< 1e-6" if v < floor else _percent(v)
            inside = v * 3 > top  # no room above: the label goes in the bar
            ax.text(x, v / 1.6 if inside else max(v, floor) * 1.6, text, ha="center",
                    va="top" if inside else "bottom", fontsize=8,
                    color="white" if inside else "black")
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, top)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(tr("difference / token mean's (log)"))
    worst = max(range(len(names)), key=lambda i: grad[i])
    ax.set_title(tr("mean of means, {scenario}: loss {loss} off, gradient {grad} off").format(
        scenario=names[worst], loss=_percent(loss[worst]), grad=_percent(grad[worst])),
        fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    return in_edition(fig)


def optimizer_paths(paths: dict, height) -> Figure:
    """03: each optimizer's weights on a 2-D bowl, with the right gradient and
    with the trapped one (the same times 0.5), then how far apart the two
    runs are, update after update. ``paths``: name -> (right, trapped), each
    a sequence of (w0, w1) points; ``height``: the bowl, for its contours."""
    import numpy as np

    fig = Figure(figsize=(WIDTH, 5.4), layout="constrained")
    names = list(paths)
    axes = fig.subplot_mosaic([names, ["gap"] * len(names)],
                              height_ratios=[1.1, 1])
    points = np.concatenate([np.asarray(p, dtype=float)
                             for pair in paths.values() for p in pair])
    lo, hi = points.min(axis=0) - 0.3, points.max(axis=0) + 0.3
    grid = np.meshgrid(np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120))
    styles = {"right": ("-", COLORS["global_token"], tr("right gradient")),
              "trapped": ("--", COLORS["mean_of_means"], tr("trapped (x 0.5)"))}
    gap = axes["gap"]
    for i, (name, (right, trapped)) in enumerate(paths.items()):
        ax = axes[name]
        ax.contour(*grid, height(grid), levels=8, colors="0.85", linewidths=0.7)
        for key, p in (("right", right), ("trapped", trapped)):
            ls, color, label = styles[key]
            p = np.asarray(p, dtype=float)
            ax.plot(p[:, 0], p[:, 1], ls=ls, marker="o", ms=1.8, lw=1.1,
                    color=color, label=label if i == 0 else None)
        ax.plot(*np.asarray(right, dtype=float)[0], "k^", ms=5)  # the start
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(tr("w[0]"), fontsize=8)
        ax.set_ylabel(tr("w[1]") if i == 0 else "", fontsize=8)
        apart = np.linalg.norm(np.asarray(right, dtype=float)
                               - np.asarray(trapped, dtype=float), axis=1)[1:]
        # greys, told apart by their dashes: green and magenta mean right and trapped
        gap.plot(range(1, len(apart) + 1), apart, lw=1.5, color=["0.1", "0.5"][i % 2],
                 ls=["-", "--", "-.", ":"][i % 4], label=name)
    axes[names[0]].plot([], [], "k^", ms=5, label=tr("start"))
    fig.legend(*axes[names[0]].get_legend_handles_labels(), frameon=False,
               fontsize=8, ncols=3, loc="outside upper center")
    gap.set_yscale("log")
    gap.set_xlabel(tr("update"))
    gap.set_ylabel(tr("|w right - w trapped|"))
    gap.set_title(tr("how far apart the two runs are, update after update"),
                  fontsize=9)
    gap.legend(frameon=False, fontsize=8, ncols=len(names), loc="lower right")
    return in_edition(fig)


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


def bug_matrix(report: BugsReport, steps: list[str] | None = None) -> Figure:
    """Steps x checks: green passes, magenta fails; each cell shows its error.
    ``steps``: only these rows, in this order (default: every step)."""
    names = list(steps if steps is not None else report.steps)
    fig = Figure(figsize=(WIDTH, 0.42 * len(names) + 1.6), layout="constrained")
    ax = fig.subplots()

    def text(row, check, passed):
        err = row.max_abs_err.get(check)
        if err is None and not passed and check == "uneven_microbatches":
            return tr("hang")  # the step never finished: no gradient to measure
        return (tr("pass") if passed else tr("FAIL")) if err is None else _short(err)

    kinds = {"correct": tr("correct"), "bug": tr("bug")}
    check_grid(ax, report, names,
               [f"{n} ({kinds.get(report.steps[n].kind, report.steps[n].kind)})"
                for n in names], text)
    ax.set_xlabel(tr("green: passes, magenta: fails; cells show max |err| "
                     "(exactly 0 is written 0); hang: the step never finished"),
                  fontsize=8)
    return in_edition(fig)


# The uneven-ranks timeline: when each step function syncs. "last": once, on
# the rank's own last microbatch (no_sync() before it); "every": each
# microbatch; "join": each microbatch, and Join answers the syncs of a rank
# that ran out with zeros; "pad": empty microbatches up to the longest
# rank's count, then one sync.
TIMELINES = {"global_token": "last", "no_sync_backward_only": "every",
             "join_every_microbatch": "join", "pad_to_longest_rank": "pad"}


def uneven_timeline(microbatches: list[int], steps: list[str]) -> Figure:
    """Each rank's window over time, one panel per step function of
    ``TIMELINES``: its microbatches (forward and backward, about the same
    time each: the same token budget), the collectives it calls (the count's
    all_reduce, then its gradient syncs), the calls that pair across the
    ranks, and where a rank waits, or waits for ever."""
    fail, wait = COLORS["mean_of_means"], COLORS["tolerance"]
    longest, ranks = max(microbatches), len(microbatches)
    fig = Figure(figsize=(WIDTH, (0.55 * ranks + 0.5) * len(steps) + 0.6),
                 layout="constrained")
    axes = fig.subplots(len(steps), 1, squeeze=False)[:, 0]
    for ax, step in zip(axes, steps, strict=True):
        how = TIMELINES[step]
        # "every": the first sync that some rank never calls
        hang = min(microbatches) + 1 if how == "every" and min(microbatches) < longest \
            else None
        for r, m in enumerate(microbatches):
            y = ranks - 1 - r
            ax.text(-0.3, y, tr("rank {rank}").format(rank=r), ha="right", va="center",
                    fontsize=8,
                    color=rank_color(r), fontweight="bold")
            counts = [-0.1, 0.1] if how == "pad" else [0.05]  # pad: max count, then N
            ax.plot(counts, [y] * len(counts), "s", color="black", ms=5, ls="none")
            last = hang if hang is not None and m >= hang else \
                longest if how in ("join", "pad") else m
            for k in range(1, last + 1):
                mine = k <= m
                ax.add_patch(Rectangle((k - 0.9, y - 0.3), 0.7, 0.6, lw=1.2,
                                       facecolor=rank_color(r) if mine else "white",
                                       edgecolor=rank_color(r), alpha=0.85,
                                       linestyle="-" if mine else "--"))
                label = tr("mb {k}").format(k=k) if mine else tr("empty") if how == "pad" \
                    else tr("Join: zeros")
                ax.text(k - 0.55, y, label, ha="center", va="center", fontsize=7,
                        color="white" if mine else rank_color(r))
                if how in ("every", "join") or k == last:
                    ax.plot([k - 0.1], [y], "D", ms=6,
                            color=fail if k == hang else "black")
            if how == "last" and m < longest:  # its one sync waits for the others'
                ax.add_patch(Rectangle((m, y - 0.12), longest - m - 0.15, 0.24,
                                       facecolor=wait, edgecolor="none"))
                ax.text((m + longest) / 2, y, tr("waits for rank {rank}'s sync").format(
                    rank=microbatches.index(longest)), ha="center", va="center", fontsize=7)
            if hang is not None and m >= hang:
                ax.add_patch(Rectangle((hang, y - 0.12), longest - hang + 0.4, 0.24,
                                       facecolor=fail, edgecolor="none", alpha=0.35))
                ax.text(hang + (longest - hang + 0.4) / 2, y,
                        tr("waits for ever: no other rank makes this sync"),
                        ha="center", va="center", fontsize=7)
            elif hang is not None:
                ax.text(m + 0.1, y, tr("out of microbatches: leaves the window"),
                        ha="left", va="center", fontsize=7, color=rank_color(r))
        # the calls that pair: the same collective on every rank
        syncs = [longest - 0.1] if how in ("last", "pad") else \
            [k - 0.1 for k in range(1, (hang or longest + 1))]
        for t in [*([-0.1, 0.1] if how == "pad" else [0.05]), *syncs]:
            ax.plot([t, t], [0, ranks - 1], color="black", lw=0.8, ls=":", zorder=0)
        ax.set_xlim(-1.1, longest + 0.6)
        ax.set_ylim(-0.6, ranks - 0.4)
        ax.axis("off")
        ax.set_title(step, fontsize=9, loc="left")
    axes[-1].annotate("", xy=(longest + 0.5, -0.55), xytext=(-0.2, -0.55),
                      arrowprops={"arrowstyle": "-|>", "color": "0.5", "lw": 0.8})
    axes[-1].text(longest + 0.5, -0.5, tr("time"), ha="right", va="bottom", fontsize=7,
                  color="0.4")
    fig.suptitle(tr("square: the count's all_reduce; diamond: a gradient sync; "
                    "dotted: calls that pair across the ranks"), fontsize=8)
    return in_edition(fig)


def _short(err: float) -> str:
    """Below TINY the digits are rounding, which the hardware decides."""
    return "0" if err == 0 else err_bound(err) if err < TINY else f"{err:.0e}"


def framework_matrix(matrix: Matrix) -> Figure:
    """The version matrix as a heatmap: one row per framework version and
    flags, sorted by framework then version, consecutive versions whose rows
    read the same on one row; one column per model class; the colour is the
    relative error against the token mean, the text the formula the gradient
    matches."""
    import math

    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from packaging.version import InvalidVersion, Version

    from course_lib.core.verdicts import Verdict

    def text(cell: MatrixRow | None) -> str:
        if cell is None or cell.verdict == Verdict.NOT_RUN or cell.relative_error is None:
            return tr(str(Verdict.NOT_RUN))
        seen = Verdict.RANKS_DISAGREE if cell.verdict == Verdict.RANKS_DISAGREE \
            else (cell.matches or "?")
        # wrapped, the error on a line of its own: French formula names are long
        return f"{textwrap.fill(tr(str(seen)), 30)}\n({cell.relative_error:.0e})"

    def version_key(version: str) -> tuple:
        try:
            return (0, Version(version), "")
        except InvalidVersion:
            return (1, Version("0"), version)

    models = list(matrix.models)

    def read(rows: dict[str, dict[str, MatrixRow]]) -> list:
        return [(f, [text(cells.get(m)) for m in models]) for f, cells in rows.items()]

    frameworks = list(dict.fromkeys(r.framework for r in matrix.rows))
    # (framework, version) -> flags -> model -> row, in the file's order of flags
    found: dict[tuple[str, str], dict[str, dict[str, MatrixRow]]] = {}
    for r in matrix.rows:
        flags = ", ".join(f"{k.replace('average_tokens_across_devices', tr('avg tokens'))}="
                          f"{v}" for k, v in r.flags.items())
        found.setdefault((r.framework, r.version or "?"), {}).setdefault(flags, {})[r.model] = r
    # Sorted by framework, then version; consecutive versions of a framework
    # whose rows read the same share one row of versions, as Matrix.describe.
    groups: list[tuple[str, list[str], dict[str, dict[str, MatrixRow]]]] = []
    for framework, version in sorted(found, key=lambda k: (frameworks.index(k[0]),
                                                           version_key(k[1]))):
        rows = {f: cells for f, cells in found[(framework, version)].items()
                if any(text(c) != tr(str(Verdict.NOT_RUN)) for c in cells.values())}
        if not rows:
            continue
        if groups and groups[-1][0] == framework and read(rows) == read(groups[-1][2]):
            groups[-1][1].append(version)
        else:
            groups.append((framework, [version], rows))
    keys: dict[tuple, dict[str, MatrixRow]] = {}
    for framework, versions, rows in groups:
        span = "-".join(dict.fromkeys([versions[0], versions[-1]]))
        for flags, cells in rows.items():
            keys[(f"{framework} {span}" + (f"  {flags}" if flags else ""),)] = cells
    labels = [k[0] for k in keys]
    fig, (ax,) = _figure(height=0.5 * len(labels) + 1.4)
    norm = Normalize(vmin=-7, vmax=0.5)
    cmap = colormaps["viridis_r"]
    for i, cells in enumerate(keys.values()):
        for j, model in enumerate(models):
            cell = cells.get(model)
            if cell is None or cell.verdict == Verdict.NOT_RUN or cell.relative_error is None:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="#dddddd"))
                ax.text(j, i, tr(str(Verdict.NOT_RUN)), ha="center", va="center", fontsize=7)
                continue
            err = math.log10(max(cell.relative_error, 1e-9))
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color=cmap(norm(err))))
            ax.text(j, i, text(cell), ha="center",
                    va="center", fontsize=7, color="white" if norm(err) > 0.6 else "black")
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xticks(range(len(models)), models)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.xaxis.tick_top()
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax,
                 label=tr("log10 relative error vs the token mean"))
    ax.set_title(tr("The real loops, version by version ({date}, torch {torch}): the formula "
                    "each gradient matches\n(consecutive versions that read the same share "
                    "a row)").format(date=edition.date(matrix.date), torch=matrix.torch),
                 fontsize=9)
    return in_edition(fig)


def unit_weights(lengths: list[int], weights: dict[str, list[float]],
                 title: str | None = None, *, line: str | None = None,
                 annotate: dict[str, str] | None = None) -> Figure:
    """Each sequence's per-token weight, times N (1 is the token mean's),
    against its supervised length, one series per objective (or per TRL
    loss_type: chapter 09's RL figure). ``line`` names the series that is 1
    for every token: drawn as the horizontal line, not as points (without
    it, the token mean's line is drawn for reference). ``annotate`` writes a
    label above a series' first value, in the widest gap between lengths (a
    flat series: dr_grpo's c)."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    fig, (ax,) = _figure(height=3.6)
    markers = dict(zip(weights, "os^Dv", strict=False))
    # chapter 01's code: the token mean green; the sequence mean orange
    colors = {"token": COLORS["global_token"], "sequence": "#e08214",
              "weighted": COLORS["stop"],
              # TRL's loss types: grpo is the sequence mean, dapo the token mean
              "grpo": "#e08214", "dr_grpo": "#8073ac", "dapo": COLORS["global_token"]}
    # the units by their names in words; TRL's loss types keep their option's name
    named = {"token": tr("token mean"), "sequence": tr("sequence mean"),
             "weighted": tr("weighted mean")}
    for name, ws in weights.items():
        if name == line:
            continue
        ax.scatter(lengths, ws, s=18, marker=markers.get(name, "o"), alpha=0.8,
                   label=named.get(name, name),
                   color=colors.get(name, COLORS["reference"]))
    if line is None:  # the token mean's weight, for reference
        ax.axhline(1.0, color=COLORS["tolerance"], lw=1, label=tr("token mean"))
    else:
        ax.axhline(1.0, color=colors.get(line, COLORS["tolerance"]), lw=1.2,
                   label=named.get(line, line))
    xs = sorted(lengths)  # a label goes in the widest gap between lengths
    gaps = list(zip(xs, xs[1:], strict=False)) or [(xs[0], xs[0])]
    lo, hi = max(gaps, key=lambda pair: pair[1] - pair[0])
    for name, text in (annotate or {}).items():
        ax.annotate(text, ((lo + hi) / 2, weights[name][0]), xytext=(0, 6),
                    textcoords="offset points", fontsize=8, ha="center")
    values = [v for ws in weights.values() for v in ws]
    ticks = [t for t in (0.25, 0.5, 0.6, 1, 2, 4, 8)
             if min(values) * 0.9 <= t <= max(values) * 1.1]
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_yticks(ticks, [number(t, "g") for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(tr("supervised tokens in the sequence"))
    ax.set_ylabel(tr("weight of each of its tokens x N"))
    ax.set_title(tr(title) if title else tr("Per-sequence normalization gives short "
                                            "sequences' tokens more weight"))
    fig.legend(frameon=False, loc="outside lower center",
               ncols=len(ax.get_legend_handles_labels()[1]), fontsize=8)
    return in_edition(fig)


def count_ratios(ratios: list[float]) -> Figure:
    """N / N' for each window of a run: the factor that a count N' taking in
    the masked prompts puts on that window's update (1: the right count)."""
    fig, (ax,) = _figure(height=3.0)
    windows = range(1, len(ratios) + 1)
    ax.plot(windows, ratios, marker="o", ms=3, lw=0.8, color=COLORS["mean_of_means"],
            label=tr("N / N', N' the next-token positions"))
    ax.axhline(1.0, color=COLORS["global_token"], lw=1.2,
               label=tr("N / N, the right count"))
    ax.set_xlabel(tr("window of the run"))
    ax.set_ylabel(tr("the update's factor"))
    ax.set_title(tr("A count with the masked prompts scales each window by its own factor"))
    fig.legend(frameon=False, loc="outside lower center", ncols=2, fontsize=8)
    return in_edition(fig)


def ddp_step() -> Figure:
    """One DDP step on two ranks: each rank's forward and backward on its own
    share; during the backward, one all_reduce per bucket of gradients, as
    soon as the bucket is ready; then the same optimizer step."""
    from matplotlib.patches import FancyBboxPatch

    fig, (ax,) = _figure(height=3.9)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.45)
    ax.axis("off")

    def box(x, y, w, h, text, color, fill="white", size=8.5):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04",
                                    fc=fill, ec=color, lw=1.6))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, color="0.3"):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.2})

    grey = COLORS["reference"]
    rows = {0: 3.2, 1: 0.5}  # y of each rank's row
    h = 0.75
    seg, bw = 1.3, 1.0  # one bucket's part of the backward; its box's width
    back = 3.05  # where the backward starts
    ready = [back + seg * k + bw for k in range(3)]  # bucket k is ready here
    for rank, y in rows.items():
        color = rank_color(rank)
        ax.text(0.1, y + h + 0.1, tr("rank {rank}: a full replica").format(rank=rank),
                color=color, fontsize=9, fontweight="bold")
        box(0.1, y, 1.2, h, tr("its own share\nof the window"), color)
        arrow(1.35, y + h / 2, 1.55, y + h / 2)
        box(1.6, y, 1.2, h, tr("forward:\nloss of its\ntokens"), color)
        arrow(2.85, y + h / 2, 3.0, y + h / 2)
        labels = [tr("last layers"), tr("middle layers"), tr("first layers")]
        for k, label in enumerate(labels):
            box(back + seg * k, y, bw, h,
                tr("backward:\n{layers}\n(bucket {k})").format(layers=label, k=k + 1),
                color, size=8)
            if k:  # the backward goes on to the earlier layers
                arrow(ready[k - 1] + 0.06, y + h / 2, back + seg * k - 0.06, y + h / 2)
        box(8.35, y, 1.5, h, tr("opt.step():\nthe same step"), color)
    mid, top = rows[1] + h + 0.4, rows[0] - 0.4  # the all_reduce band
    for k, x in enumerate(ready):
        box(x + 0.05, mid, 1.05, top - mid, tr("all_reduce\nbucket {k}").format(k=k + 1),
            grey,
            fill="#f0f0f0", size=8)
        # from the bottom of the bucket's backward box to the all_reduce
        arrow(x - 0.25, rows[0] - 0.06, x + 0.1, top + 0.06)  # down from rank 0
        arrow(x - 0.25, rows[1] + h + 0.06, x + 0.1, mid - 0.06)  # up from rank 1
    arrow(ready[-1] + 1.15, (mid + top) / 2, 8.3, rows[0] + h / 2)
    arrow(ready[-1] + 1.15, (mid + top) / 2, 8.3, rows[1] + h / 2)
    ax.text(0.1, (mid + top) / 2,
            tr("all_reduce, bucket by bucket,\nas gradients become ready,\n"
               "overlapping the backward:\nevery rank ends with\nthe same .grad"),
            ha="left", va="center", fontsize=8.5, color="0.25")
    ax.text(9.1, (mid + top) / 2, tr("the replicas\nstay equal"), ha="center",
            va="center", fontsize=8.5, color=grey, style="italic")
    arrow(0.1, 0.12, 9.85, 0.12, color="0.55")
    ax.text(9.85, 0.2, tr("time"), ha="right", va="bottom", fontsize=8, color="0.45")
    ax.set_title(tr("One DDP step on two ranks (W = 2)"))
    return in_edition(fig)


def _wrap_at_commas(text: str, width: int) -> str:
    """``text`` on lines of about ``width``, broken only after a comma
    outside brackets, after gather_for_metrics( or before a double space,
    so that no name is split."""
    lines = [""]
    for part in re.split(r"(?<=, )(?![^\[]*\])|(?<=_metrics\()|(?=  \()", text):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append(part.lstrip())
        else:
            lines[-1] += part
    return "\n".join(line.rstrip() for line in lines)


def row_name(row: LoggedRow) -> str:
    """07: a logged row's name as the chapter prints it, "{logged}, {mode}",
    its words in the edition's (English: as committed; the figure below
    shortens the same names)."""
    words = {"train loss": tr("train loss"), "eval loss": tr("eval loss"),
             "first step": tr("first step"), "epoch": tr("epoch"),
             "batch_size inferred": tr("batch_size inferred"),
             "per-sample [sum, count]": tr("per-sample [sum, count]")}
    found = re.compile("|".join(rf"(?<![\w.]){re.escape(w)}(?![\w])" for w in words))
    return found.sub(lambda m: words[m.group(0)], f"{row.logged}, {row.mode}")


def logged_values(report: LoggingReport, model: str = "llama",
                  part: str | None = None, framework: str | None = None) -> Figure:
    """07: each logged value of ``model``'s rows (the rows that set
    ``model.loss_type`` left out) as a dot, at its gap to the token mean it
    should equal, in percent: training on top, evaluation below (``part``,
    "training" or "evaluation": that panel alone; ``framework``, "hf",
    "accelerate" or "lightning": that framework's rows alone). The token
    mean is the line at 0; a dot on it is green, and each row's verdict,
    the formula it equals, is written on the right."""
    rows = [r for r in report.rows if r.model == model and "loss_type" not in r.mode
            and framework in (None, r.framework)]
    parts = [(tr("training"), [r for r in rows if "train" in r.logged]),
             (tr("evaluation"), [r for r in rows if "train" not in r.logged])]
    if part is not None:
        parts = [parts[["training", "evaluation"].index(part)]]
        rows = parts[0][1]
    names = {"hf": tr("HF Trainer"), "accelerate": "accelerate", "lightning": "Lightning"}

    def label(r) -> str:
        mode = (r.mode.replace("average_tokens_across_devices=True", tr("flag on"))
                .replace("average_tokens_across_devices=False", tr("flag off"))
                .replace(", sync_dist=True", "").replace("=True", "")
                .replace("preprocess_logits_for_metrics + compute_metrics",
                         tr("[sum, count] per row")))
        what = r.logged.removeprefix("train loss").removeprefix("eval loss").lstrip(", ")
        what = what.removeprefix("eval_token_mean")  # the recipe's row: its mode says it
        text = ", ".join(x for x in (what, mode) if x)
        text = (text.replace("epoch, on_epoch", "on_epoch")
                .replace("first step, on_step", tr("on_step, first step"))
                .replace("MeanMetric.update(loss, weight=<tokens>), on_epoch",
                         "MeanMetric(weight=<tokens>)")
                .replace("epoch, MeanMetric", "MeanMetric")
                .replace("batch_size inferred", tr("batch_size inferred"))
                .replace("per-sample [sum, count]", tr("per-sample [sum, count]")))
        return (tr("{framework}: {text}").format(
            framework=names.get(r.framework, r.framework), text=text)
                + (tr("  (recipe)") if r.recipe else ""))

    fig = Figure(figsize=(WIDTH, 0.42 * len(rows) + 1.7), layout="constrained")
    axes = fig.subplots(len(parts), 1, sharex=True, squeeze=False,
                        height_ratios=[max(len(found), 1) for _, found in parts])[:, 0]
    gaps = [100 * (r.value / r.token_mean - 1) for r in rows]
    reach = max(abs(g) for g in gaps) if gaps else 1.0
    for ax, (title, found) in zip(axes, parts, strict=True):
        for i, r in enumerate(found):
            gap = 100 * (r.value / r.token_mean - 1)
            exact = r.verdict == "token mean"
            color = COLORS["global_token"] if exact else COLORS["mean_of_means"]
            ax.plot([0, gap], [i, i], color="#bbbbbb", lw=1)
            ax.plot([gap], [i], "o", ms=6, color=color)
        ax.set_yticks(range(len(found)), [_wrap_at_commas(label(r), 38) for r in found],
                      fontsize=7.5)
        ax.set_ylim(len(found) - 0.5, -0.5)
        verdicts = ax.twinx()  # the right-hand labels: the formula each value equals
        verdicts.set_ylim(ax.get_ylim())
        verdicts.set_yticks(range(len(found)), [textwrap.fill(tr(r.verdict), 32)
                                                for r in found], fontsize=7.5)
        for tick, r in zip(verdicts.get_yticklabels(), found, strict=True):
            tick.set_color(COLORS["global_token"] if r.verdict == "token mean"
                           else COLORS["mean_of_means"])
        ax.axvline(0, color=COLORS["global_token"], lw=1.5)
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlim(-1.15 * reach, 1.15 * reach)
    axes[-1].set_xlabel(textwrap.fill(tr(
        "(logged − token mean) / token mean, in %: the token mean of what "
        "it logs is the green line; on the right, the formula the value "
        "equals"), 90))
    return in_edition(fig)


def token_weights(info: RegimeInfo, weights: dict[str, TokenWeight]) -> Figure:
    """08: a token's weight in the gradient, times N (the token mean's is 1),
    in each microbatch of one window, rank by rank. One panel per verdict
    (exact, uniformly scaled, biased), one line per weight formula, the
    recipes that share it named together."""
    counts = [(r, m, n) for r, rank in enumerate(info.microbatch_tokens)
              for m, n in enumerate(rank)]
    shared: dict[tuple, list[str]] = {}
    for name, w in weights.items():
        ys = tuple(w.times_n[r][m] for r, m, _ in counts)
        shared.setdefault((w.formula, ys), []).append(name)

    def kind(ys: tuple) -> str:
        if all(abs(y - 1.0) < 1e-9 for y in ys):
            return "exact"
        return "scaled" if max(ys) - min(ys) < 1e-9 else "biased"

    titles = {"exact": tr("exact: every token 1 / N"),
              "scaled": tr("uniformly scaled: c / N, one c"),
              "biased": tr("biased: it depends on the microbatch or rank")}
    panels = [k for k in titles if any(kind(ys) == k for _, ys in shared)]
    fig, axes = _figure(len(panels), height=4.4)
    top = 1.2 * max(max(ys) for _, ys in shared)
    xs = range(len(counts))
    markers = ["o", "s", "^", "D", "v"]
    for ax, k in zip(axes, panels, strict=True):
        for r in range(len(info.microbatch_tokens)):  # each rank's microbatches, shaded
            at = [i for i, (rank, _, _) in enumerate(counts) if rank == r]
            ax.axvspan(at[0] - 0.45, at[-1] + 0.45, color=rank_color(r), alpha=0.08, lw=0)
            ax.text((at[0] + at[-1]) / 2, 0.97, tr("rank {rank}").format(rank=r),
                    ha="center", va="top",
                    fontsize=8, color=rank_color(r), transform=ax.get_xaxis_transform())
        ax.axhline(1.0, color=COLORS["global_token"], lw=1.2, ls="--", zorder=1)
        mine = [(key, names) for key, names in shared.items() if kind(key[1]) == k]
        for i, ((formula, ys), names) in enumerate(mine):
            color = COLORS["global_token"] if k == "exact" else ABLATION_COLORS[i % 4]
            label = f"{formula}\n" + "\n".join(names)
            ax.plot(xs, ys, lw=1.2, marker=markers[i % len(markers)], ms=7, color=color,
                    label=label, zorder=2)
            if k == "scaled":  # the one factor, beside its line
                ax.annotate(f"c = {decimal(ys[0], 3)}", (xs[-1], ys[-1]), xytext=(0, -12),
                            textcoords="offset points", ha="right", fontsize=7.5,
                            color=color)
        ax.set_xticks(list(xs), [f"m{m}\nn={n}" for _, m, n in counts], fontsize=7.5)
        ax.set_xlim(-0.6, len(counts) - 0.4)
        ax.set_ylim(0, top)
        ax.set_title(titles[k], fontsize=8.5)
        ax.legend(frameon=False, fontsize=7, loc="upper center", handlelength=1.5,
                  bbox_to_anchor=(0.5, -0.16), ncols=len(mine), columnspacing=1.0)
    axes[0].set_ylabel(tr("a token's weight x N (the token mean: 1)"))
    for ax in axes[1:]:
        ax.tick_params(labelleft=False)
    from course_lib.jobs.recipes import DESCRIPTIONS  # the jobs' module, when drawn

    fig.suptitle(tr("{window}\nwhat each recipe gives one token of each microbatch (n: its "
                    "supervised tokens; N = {n}, R = {rows})").format(
                        window=edition.reword(info.description, DESCRIPTIONS),
                        n=number(info.global_tokens),
                        rows=number(info.first_label_rows, "d")), fontsize=9)
    return in_edition(fig)

