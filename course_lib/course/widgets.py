"""The course's ipywidgets explorers.

The logic lives in pure functions (``explorer_state``, ``theta_state``,
the graded questions of ``quiz``); the widget classes only render what those
return.
Tests drive the widgets by setting ``.value`` on their sliders.

Figures are drawn once with matplotlib's Agg backend; every change updates
the artists (bar heights, markers, text) and swaps a fresh PNG into an
``ipywidgets.Image``. Swapping the image's value is atomic, so nothing
flickers and no figure is rebuilt.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
from collections.abc import Iterator, Sequence

import ipywidgets as w
from IPython.display import Image
from matplotlib.figure import Figure

from course_lib.core import arithmetic
from course_lib.core.edition import decimal, number, tr
from course_lib.course import quiz
from course_lib.course.style import COLORS, LABELS, in_edition, rank_color

MAX_RANKS = 8
MAX_TOKENS = 128
MAX_LOSS = 5.0
DEFAULT_TOKENS, DEFAULT_LOSSES = arithmetic.DEFAULT_TOKENS, arithmetic.DEFAULT_LOSSES
THETA_RANGE = (-2.0, 2.0)
BIAS_COLOR = "#e08214"


# --- pure logic ----------------------------------------------------------------


def explorer_state(tokens: Sequence[int], losses: Sequence[float],
                   world_size: int | None = None) -> dict:
    """Everything the token explorer shows, for the first ``world_size`` ranks.

    ``tokens[r]`` is rank r's count of supervised tokens N_r and ``losses[r]``
    its loss per token, so its loss sum is S_r = N_r * losses[r].
    """
    world = len(tokens) if world_size is None else int(world_size)
    if not 1 <= world <= min(len(tokens), len(losses)):
        raise ValueError(f"world_size must be in [1, {min(len(tokens), len(losses))}]")
    counts = [int(n) for n in tokens[:world]]
    per_token = [float(x) for x in losses[:world]]
    sums = [n * x for n, x in zip(counts, per_token, strict=True)]
    mom = arithmetic.mean_of_means(sums, counts)
    glob = arithmetic.global_mean(sums, counts)
    w_global = arithmetic.token_weights(counts, "global")
    w_mom = arithmetic.token_weights(counts, "mean_of_means")
    return {
        "world_size": world,
        "tokens": counts,
        "global_tokens": sum(counts),
        "losses": per_token,
        "loss_sums": sums,
        "local_means": [s / n for s, n in zip(sums, counts, strict=True)],
        "mean_of_means": mom,
        "global_mean": glob,
        "bias": mom - glob,
        "token_weights": {"global": w_global, "mean_of_means": w_mom},
        # Share of the final number carried by each rank's tokens.
        "rank_shares": {
            "global": arithmetic.rank_weights(counts),
            "mean_of_means": [1 / world] * world,
        },
        # How much more a token of the rank with the fewest tokens weighs than
        # one of the rank with the most.
        "weight_ratio": max(w_mom) / min(w_mom),
        "scaled_local_losses": arithmetic.scaled_local_losses(sums, counts),
    }


def theta_state(theta: float, counts: Sequence[int] = (12, 36),
                targets: Sequence[float] = (1.0, -1.0)) -> dict:
    """Loss and gradient of both schemes at ``theta`` (the one-parameter example)."""
    ex = arithmetic.theta_example(float(theta), counts, targets)
    return {"theta": float(theta), **ex,
            "loss_gap": ex["loss_mean_of_means"] - ex["loss_global"],
            "grad_gap": ex["grad_mean_of_means"] - ex["grad_global"]}


def theta_curves(n: int = 161, counts: Sequence[int] = (12, 36),
                 targets: Sequence[float] = (1.0, -1.0)) -> dict:
    """Loss and gradient curves over THETA_RANGE, for both schemes."""
    lo, hi = THETA_RANGE
    thetas = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    rows = [arithmetic.theta_example(t, counts, targets) for t in thetas]
    return {"theta": thetas, **{k: [r[k] for r in rows] for k in rows[0]}}


# --- rendering helpers -----------------------------------------------------------


def _tagged(widget: w.DOMWidget, css_class: str) -> w.DOMWidget:
    """Give a widget the CSS class that tests and the browser test look up."""
    widget.add_class(css_class)
    return widget


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def _readout(text: str, color: str) -> str:
    return f'<span style="color:{color};font-size:1.1em"><b>{text}</b></span>'


def _pair_readout(label: str, mean_of_means: float, global_: float) -> str:
    """One quantity under both schemes, each in its scheme's colour."""
    return (f"{label}: "
            + _readout(tr("mean of means {value}").format(value=decimal(mean_of_means)),
                       COLORS["mean_of_means"])
            + " &nbsp;|&nbsp; "
            + _readout(tr("global {value}").format(value=decimal(global_)),
                       COLORS["global_token"]))


class _Displayable:
    """Show ``self.widget`` when the object itself is a cell's value.

    A reader without a kernel (GitHub, a static page) cannot draw the widget:
    the bundle also carries what such a reader can show, a line of text and,
    for an explorer, the PNG of its figure at the start position. A live
    JupyterLab prefers the widget, so it never shows both.
    """

    widget: w.Widget

    def _static_text(self) -> str:
        return repr(self.widget)

    def _static_figure(self) -> Figure | None:
        return getattr(self, "fig", None)

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(self.widget._repr_mimebundle_(**kwargs))
        bundle["text/plain"] = self._static_text()
        figure = self._static_figure()
        if figure is not None:
            bundle["image/png"] = base64.b64encode(_png(figure)).decode("ascii")
        return bundle


# --- token explorer ----------------------------------------------------------------


class TokenExplorer(_Displayable):
    """Vary each rank's token count and loss per token, and the number of ranks.

    Left panel: the weight of ONE token of each rank under each scheme
    (global: 1/N; mean of means: 1/(W*N_r)). Right panel: the two means,
    with the bias between them.
    """

    def __init__(self, tokens: Sequence[int] = DEFAULT_TOKENS,
                 losses: Sequence[float] = DEFAULT_LOSSES, world_size: int = 2):
        tokens = list(tokens) + list(DEFAULT_TOKENS[len(tokens):])
        losses = list(losses) + list(DEFAULT_LOSSES[len(losses):])
        style = {"description_width": "110px"}
        self.tokens = [
            w.IntSlider(value=tokens[r], min=1, max=MAX_TOKENS, step=1,
                        description=tr("rank {r} tokens").format(r=r), style=style,
                        continuous_update=False)
            for r in range(MAX_RANKS)
        ]
        self.losses = [
            w.FloatSlider(value=losses[r], min=0.0, max=MAX_LOSS, step=0.05,
                          description=tr("rank {r} loss/token").format(r=r),
                          readout_format=".2f",
                          style=style, continuous_update=False)
            for r in range(MAX_RANKS)
        ]
        for r, (t, x) in enumerate(zip(self.tokens, self.losses, strict=True)):
            t.add_class(f"course-tokens-r{r}")
            x.add_class(f"course-loss-r{r}")
        self.world_size = _tagged(w.IntSlider(value=world_size, min=1, max=MAX_RANKS,
                                              description=tr("ranks W"), style=style,
                                              continuous_update=False),
                                  "course-world-size")
        self.global_readout = _tagged(w.HTML(), "course-global-mean")
        self.mom_readout = _tagged(w.HTML(), "course-mean-of-means")
        self.bias_readout = _tagged(w.HTML(), "course-bias")
        self.weight_readout = _tagged(w.HTML(), "course-weight-ratio")
        self.image = _tagged(w.Image(format="png", layout=w.Layout(width="720px")),
                             "course-token-figure")
        self.rows = [w.HBox([t, x]) for t, x in zip(self.tokens, self.losses,
                                                     strict=True)]
        readouts = w.HBox([self.mom_readout, self.global_readout, self.bias_readout],
                          layout=w.Layout(justify_content="space-around"))
        self.widget = w.VBox([self.world_size, *self.rows, readouts,
                              self.weight_readout, self.image])
        self._build_figure()
        for s in [self.world_size, *self.tokens, *self.losses]:
            s.observe(self._on_change, names="value")
        self.state: dict = {}
        self.update()

    # The figure is built once; update() only moves its artists.
    def _build_figure(self) -> None:
        fig = Figure(figsize=(9.0, 3.2), layout="constrained")
        self.fig = fig
        left, right = fig.subplots(1, 2, width_ratios=[2, 1])
        self.ax_weights, self.ax_means = left, right
        xs = range(MAX_RANKS)
        self.bars_global = left.bar([x - 0.2 for x in xs], [0] * MAX_RANKS,
                                    width=0.4, color=COLORS["global_token"],
                                    label=tr("global mean: 1/N"))
        self.bars_mom = left.bar([x + 0.2 for x in xs], [0] * MAX_RANKS, width=0.4,
                                 color=COLORS["mean_of_means"],
                                 label=tr("mean of means: 1/(W·N_r)"))
        left.set_ylabel(tr("weight of one token"))
        left.set_title(tr("What one token of each rank weighs"))
        left.legend(frameon=False, loc="upper right", fontsize=8)
        self.mean_bars = right.bar([0, 1], [0, 0], width=0.6,
                                   color=[COLORS["mean_of_means"],
                                          COLORS["global_token"]])
        right.set_xticks([0, 1], [tr("mean of\nmeans"), tr("global\nmean")])
        right.set_title(tr("The two means"))
        self.mean_texts = [right.text(i, 0, "", ha="center", va="bottom",
                                      fontsize=9) for i in (0, 1)]
        # The bias: a double-headed arrow between the two bar tops, with
        # dotted guides from each top to it.
        nan = float("nan")
        (self.bias_line,) = right.plot([0.3, 0.5, nan, 0.5, 0.7], [0] * 5,
                                       color=BIAS_COLOR, lw=1, ls=":")
        self.bias_arrow = right.annotate(
            "", xy=(0.5, 0), xytext=(0.5, 0),
            arrowprops={"arrowstyle": "<|-|>", "color": BIAS_COLOR, "lw": 2,
                        "shrinkA": 0, "shrinkB": 0, "mutation_scale": 12})
        self.bias_text = right.text(0.5, 0, "", color=BIAS_COLOR, fontsize=9,
                                    fontweight="bold", va="bottom", ha="center")
        right.set_xlim(-0.5, 1.5)
        in_edition(fig)

    def _static_text(self) -> str:
        return tr("Token explorer (sliders: run the notebook to move them). "
                  "Its start position:")

    def _on_change(self, change) -> None:
        self.update()

    def values(self) -> tuple[list[int], list[float], int]:
        return ([s.value for s in self.tokens], [s.value for s in self.losses],
                self.world_size.value)

    def set(self, tokens: Sequence[int], losses: Sequence[float]) -> dict:
        """Move the sliders, exactly as dragging them would: W = len(tokens)."""
        self.world_size.value = len(tokens)
        for r, (n, x) in enumerate(zip(tokens, losses, strict=True)):
            self.tokens[r].value, self.losses[r].value = n, x
        return self.state

    def snapshot(self) -> Image:
        """The figure as it stands now, as a still picture: a reader without a
        kernel sees it even after the sliders have moved on."""
        return Image(data=_png(self.fig), format="png")

    @contextlib.contextmanager
    def kept(self) -> Iterator[TokenExplorer]:
        """Try positions inside the block; every slider is put back after it."""
        tokens, losses, world = self.values()
        try:
            yield self
        finally:
            self.set(tokens, losses)
            self.world_size.value = world

    def update(self) -> dict:
        tokens, losses, world = self.values()
        st = explorer_state(tokens, losses, world)
        self.state = st
        for r, row in enumerate(self.rows):
            shown = None if r < world else "none"
            for box in (row, self.tokens[r], self.losses[r]):
                box.layout.display = shown
        # The figure first, the numbers after: each value goes to the browser
        # as soon as it is set, and rendering the PNG takes a tenth of a
        # second, so numbers set first would run ahead of the plot.
        self._draw(st)
        mom, glob, bias = st["mean_of_means"], st["global_mean"], st["bias"]
        self.mom_readout.value = _readout(
            tr("mean of means: {value}").format(value=decimal(mom)), COLORS["mean_of_means"])
        self.global_readout.value = _readout(
            tr("global mean: {value}").format(value=decimal(glob)), COLORS["global_token"])
        self.bias_readout.value = _readout(tr("bias: {value}").format(value=decimal(bias)),
                                           BIAS_COLOR)
        self.weight_readout.value = tr(
            "Under the mean of means a token of the rank with the fewest tokens "
            "weighs <b>{ratio}x</b> one of the rank with the most; under the "
            "global mean every token weighs 1/N = 1/{n}.").format(
                ratio=decimal(st["weight_ratio"], 2), n=number(st["global_tokens"], "d"))
        return st

    def _draw(self, st: dict) -> None:
        world = st["world_size"]
        wg, wm = st["token_weights"]["global"], st["token_weights"]["mean_of_means"]
        for r in range(MAX_RANKS):
            visible = r < world
            for bars, ws in ((self.bars_global, wg), (self.bars_mom, wm)):
                bars[r].set_height(ws[r] if visible else 0.0)
                bars[r].set_visible(visible)
        ax = self.ax_weights
        ax.set_xlim(-0.6, world - 0.4)
        ax.set_xticks(range(world), [tr("rank {r}\n{n} tok").format(r=r, n=n)
                                     for r, n in enumerate(st["tokens"])])
        for r, label in enumerate(ax.get_xticklabels()):
            label.set_color(rank_color(r))
        ax.set_ylim(0, 1.25 * max(wg + wm))
        mom, glob = st["mean_of_means"], st["global_mean"]
        for bar, text, value in zip(self.mean_bars, self.mean_texts, (mom, glob),
                                    strict=True):
            bar.set_height(value)
            text.set_position((text.get_position()[0], value))
            text.set_text(decimal(value, 2))
        top = max(mom, glob, 1e-6)
        self.ax_means.set_ylim(0, 1.4 * top)
        self.bias_line.set_ydata([mom, mom, float("nan"), glob, glob])
        self.bias_arrow.xy = (0.5, glob)
        self.bias_arrow.set_position((0.5, mom))
        self.bias_arrow.set_visible(abs(glob - mom) > 0.02 * top)
        self.bias_text.set_position((0.5, 1.16 * top))
        self.bias_text.set_text(tr("bias {value}").format(value=decimal(st["bias"], 2)))
        self.image.value = _png(self.fig)


# --- theta explorer ------------------------------------------------------------------


class ThetaExplorer(_Displayable):
    """One parameter, squared error: rank 0 holds 12 targets +1, rank 1 36 targets -1.

    At theta = 0 both schemes report the same loss (1) but their gradients
    differ (0 vs 1): equal losses do not prove equal gradients.
    """

    def __init__(self, theta: float = 0.0, counts: Sequence[int] = (12, 36),
                 targets: Sequence[float] = (1.0, -1.0)):
        self.counts, self.targets = tuple(counts), tuple(targets)
        self.theta = _tagged(w.FloatSlider(value=theta, min=THETA_RANGE[0],
                                           max=THETA_RANGE[1], step=0.01,
                                           description="theta", readout_format=".2f",
                                           continuous_update=False),
                             "course-theta")
        self.loss_readout = _tagged(w.HTML(), "course-theta-loss")
        self.grad_readout = _tagged(w.HTML(), "course-theta-grad")
        self.image = _tagged(w.Image(format="png", layout=w.Layout(width="720px")),
                             "course-theta-figure")
        self.widget = w.VBox([self.theta, self.loss_readout, self.grad_readout,
                              self.image])
        self._build_figure()
        self.theta.observe(lambda change: self.update(), names="value")
        self.state: dict = {}
        self.update()

    def _static_text(self) -> str:
        return tr("Theta explorer (a slider: run the notebook to move it). "
                  "Its start position:")

    def _build_figure(self) -> None:
        curves = theta_curves(counts=self.counts, targets=self.targets)
        fig = Figure(figsize=(9.0, 3.0), layout="constrained")
        self.fig = fig
        self.ax_loss, self.ax_grad = fig.subplots(1, 2)
        self.markers = {}
        panels = ((self.ax_loss, "loss", tr("loss"), tr("reported loss")),
                  (self.ax_grad, "grad", tr("gradient"), tr("d loss / d theta")))
        for ax, kind, title, ylabel in panels:
            for scheme, key in (("mean_of_means", "mean_of_means"),
                                ("global_token", "global")):
                ys = curves[f"{kind}_{key}"]
                ax.plot(curves["theta"], ys, color=COLORS[scheme], lw=1.8,
                        label=tr(LABELS[scheme]) if scheme == "mean_of_means"
                        else tr("global token mean"))
                (self.markers[kind, key],) = ax.plot([0], [0], "o", ms=8,
                                                     color=COLORS[scheme])
            ax.axhline(0, color="0.8", lw=0.8)
            ax.set_xlabel("theta")  # the parameter's name, in code and prose alike
            ax.set_ylabel(ylabel)
            ax.set_title(title)
        self.vlines = [ax.axvline(0, color="0.5", lw=0.8, ls=":")
                       for ax in (self.ax_loss, self.ax_grad)]
        self.ax_loss.legend(frameon=False, fontsize=8, loc="upper center")
        self.ax_grad.legend(frameon=False, fontsize=8, loc="upper left")
        in_edition(fig)

    def update(self) -> dict:
        st = theta_state(self.theta.value, self.counts, self.targets)
        self.state = st
        t = st["theta"]
        for kind in ("loss", "grad"):
            for key in ("mean_of_means", "global"):
                self.markers[kind, key].set_data([t], [st[f"{kind}_{key}"]])
        for line in self.vlines:
            line.set_xdata([t, t])
        self.image.value = _png(self.fig)  # before the numbers, as in TokenExplorer
        self.loss_readout.value = _pair_readout(tr("loss"), st["loss_mean_of_means"],
                                                st["loss_global"])
        self.grad_readout.value = _pair_readout(tr("gradient"), st["grad_mean_of_means"],
                                                st["grad_global"])
        return st


# --- graded questions ---------------------------------------------------------------


class Quiz(_Displayable):
    """Graded questions: type or pick your answers, then press Check.

    The answers live in ``course_lib.course.quiz``, never in the notebook; a wrong
    answer gets a hint, a right one "correct".
    """

    def __init__(self, *question_ids: str):
        if not question_ids:
            raise ValueError("Quiz needs at least one question id")
        self.ids = question_ids
        self.inputs = {qid: self._input(quiz.QUESTIONS[qid]) for qid in question_ids}
        self.verdicts = {qid: _tagged(w.HTML(""), "course-question-verdict")
                         for qid in question_ids}
        rows = []
        for qid in question_ids:
            prompt = w.HTML(f"<b>{html.escape(tr(quiz.QUESTIONS[qid].prompt))}</b>")
            rows += [prompt, self.inputs[qid], self.verdicts[qid]]
        self.button = _tagged(w.Button(description=tr("Check"), button_style="primary"),
                              "course-question-check")
        self.button.on_click(lambda _: self.check())
        self.results: dict[str, quiz.Verdict] = {}
        self.widget = _tagged(w.VBox([*rows, self.button]), "course-question")

    def _static_text(self) -> str:
        return "\n".join(tr('Question (answer it with check("{qid}", ...), or run the '
                             "notebook for this form): {prompt}").format(
            qid=qid, prompt=quiz.ask(qid)) for qid in self.ids)

    @staticmethod
    def _input(q: quiz.Question) -> w.DOMWidget:
        """The options shown in the edition's words; each keeps its own
        option as its value, which ``answer`` hands to the grading."""
        if q.kind == "number":
            box = w.Text(placeholder=tr("your number"), continuous_update=False)
        elif q.kind == "choice":
            box = w.RadioButtons(options=[(tr(o), o) for o in q.choices()], value=None)
        else:
            box = w.VBox([w.Checkbox(value=False, description=tr(o), indent=False)
                          for o in q.choices()])
        return _tagged(box, "course-question-input")

    def answer(self, qid: str):
        box = self.inputs[qid]
        if isinstance(box, w.VBox):
            options = quiz.QUESTIONS[qid].choices()
            return [o for o, c in zip(options, box.children, strict=True) if c.value]
        return box.value

    def check(self) -> dict[str, quiz.Verdict]:
        for qid in self.ids:
            verdict = quiz.check(qid, self.answer(qid))
            self.results[qid] = verdict
            self.verdicts[qid].value = verdict._repr_html_()
        return self.results
