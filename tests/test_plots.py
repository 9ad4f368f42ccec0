"""Every chapter figure speaks the learner's edition: drawn in French, no
title, axis label, legend or cell text is left in English."""

import re
from types import SimpleNamespace

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from course_lib.core import edition
from course_lib.core.evaluate import Score
from course_lib.core.reference import Comparison
from course_lib.course import plots, widgets
from course_lib.frameworks.evidence import Matrix
from course_lib.jobs.audit import BugRow, BugsReport
from course_lib.jobs.evaluate import EvaluationReport
from course_lib.jobs.exercise import ExerciseReport, ModeGradients, ModelLosses, Scenario
from course_lib.jobs.frameworks_logging import LoggingData
from course_lib.jobs.parity import GradSample, ParityReport
from course_lib.jobs.recipes import RegimeInfo, TokenWeight
from course_lib.jobs.resume import Ablation, ResumeReport

HEADER = {"world_size": 2, "backend": "gloo", "device": "cpu", "dtype": "float32",
          "nccl_reference_path": False, "torch": "2.x"}
# Two ranks, one sequence length band each; names that no edition translates.
SEQUENCES = tuple(tuple(range(n)) for n in (20, 24, 30, 70, 80, 90, 100, 120))
CORPUS = SimpleNamespace(sequences=SEQUENCES,
                         lengths=lambda split: [len(s) for s in SEQUENCES])


def _parity() -> ParityReport:
    good, bad = Comparison(1e-8, True, 0), Comparison(6e-3, False, 1_234)
    return ParityReport(
        **HEADER, compared_values=112_480, atol=1e-6, rtol=1e-4, step=0,
        local_tokens=[12, 36], global_tokens=48, window_loss_per_token=3.6,
        modes={"global_token": good, "mean_of_means": bad}, no_sync={},
        grad_sample=GradSample(index=[0, 1, 2], reference=[0.01, -0.02, 0.03],
                               global_token=[0.01, -0.02, 0.03],
                               mean_of_means=[0.012, -0.018, 0.035]),
        passed=True, control="mean_of_means")


def _resume() -> ResumeReport:
    def ablation(drift):
        return Ablation(["model"], drift[-1], False, True, "", 51, 51, drift)
    return ResumeReport(
        **HEADER, step=100, resumed_from_step=50, compared_values=112_480,
        max_abs_param_diff=0.0, identical=True, resumed="r", continuous="c",
        ablations={"model_only": ablation([0.01, 0.02, 0.05]),
                   "no_rng_state": ablation([0.001, 0.004, 0.01])},
        every_ablation_matters=True)


def _evaluation() -> EvaluationReport:
    return EvaluationReport(
        device="cpu", backend="gloo", checkpoint="c", step=100, test_sequences=256,
        test_tokens=16_971, loss_per_token=1.6076, token_accuracy=0.3544,
        entropy_floor=1.5324, bayes_accuracy=0.38, untrained=Score(3.6825, 0.0253),
        above_floor_by=0.075)


def _exercise() -> ExerciseReport:
    def scenario(name, tokens, err):
        grads = ModeGradients(112_480, Comparison(1e-8, True, 0),
                              Comparison(err, err < 1e-6, 10 if err > 1e-6 else 0),
                              {"global_token": 1e-9, "mean_of_means": err * 10})
        return Scenario(name, tokens, [1.0, 3.0], [float(tokens[0]), 3.0 * tokens[1]],
                        2.0, 2.5, ModelLosses([40.0, 130.0], 3.5754, 3.5789), grads)
    return ExerciseReport(**HEADER, scenarios=[scenario("balanced", [12, 12], 1e-9),
                                               scenario("skewed", [12, 36], 0.077)],
                          atol=1e-6, rtol=1e-4)


def _bugs() -> BugsReport:
    checks = ["parity", "uneven_microbatches"]
    return BugsReport(**HEADER, checks=checks, steps={
        "global_token": BugRow("correct", "", "", dict.fromkeys(checks, True), [],
                               dict.fromkeys(checks, 0.0)),
        "local_count": BugRow("bug", "", "", {"parity": False, "uneven_microbatches": False},
                              checks, {"parity": 3e-2, "uneven_microbatches": None}),
    }, every_bug_caught=True, no_false_alarm=True)


def _token_weights():
    info = RegimeInfo("w", [300, 500], [[100, 200], [250, 250]], 800, 4)
    weights = {"token": TokenWeight("S / N", [[1.0, 1.0], [1.0, 1.0]]),
               "scaled": TokenWeight("S / (N + R)", [[0.9, 0.9], [0.9, 0.9]]),
               "local": TokenWeight("S / (W N_r)", [[1.3, 1.3], [0.8, 0.8]])}
    return info, weights


def _bowl(w):
    return 0.5 * (w[0] ** 2 + 4 * w[1] ** 2)


FIGURES = {
    "length_histograms": lambda: plots.length_histograms(CORPUS, [(16, 64), (65, 128)]),
    "label_mask": lambda: plots.label_mask(torch.tensor([[1, 2, -100], [3, -100, -100]])),
    "plan_tokens": lambda: plots.plan_tokens(
        [[[[0, 1]], [[3, 4]]], [[[2]], [[5, 6, 7]]]], CORPUS),
    "parity_scatter": lambda: plots.parity_scatter(_parity()),
    "parity_envelope": lambda: plots.parity_envelope(_parity()),
    "ablation_drift": lambda: plots.ablation_drift(_resume()),
    "evaluation": lambda: plots.evaluation(_evaluation(), vocab=32, se=0.01),
    "exercise": lambda: plots.exercise(_exercise()),
    "optimizer_paths": lambda: plots.optimizer_paths(
        {"SGD": ([(-2.0, 1.5), (-1.0, 0.5), (0.0, 0.0)],
                 [(-2.0, 1.5), (-1.5, 1.0), (-1.0, 0.5)])}, _bowl),
    "bug_matrix": lambda: plots.bug_matrix(_bugs()),
    "uneven_timeline": lambda: plots.uneven_timeline([3, 6], list(plots.TIMELINES)),
    "framework_matrix": lambda: plots.framework_matrix(Matrix.committed()),
    "unit_weights": lambda: plots.unit_weights([10, 40], {"token": [1.0, 1.0],
                                                          "sequence": [2.0, 0.5]}),
    "count_ratios": lambda: plots.count_ratios([0.98, 0.97, 0.99]),
    "ddp_step": plots.ddp_step,
    "logged_values": lambda: plots.logged_values(LoggingData.committed().run),
    "token_weights": lambda: plots.token_weights(*_token_weights()),
    "token_explorer": lambda: widgets.TokenExplorer().fig,
    "theta_explorer": lambda: widgets.ThetaExplorer().fig,
}


def test_every_figure_function_is_drawn_here():
    drawn = {name for name, value in vars(plots).items() if callable(value)
             and getattr(value, "__module__", "") == plots.__name__
             and value.__annotations__.get("return") == "Figure"}
    assert len(drawn) > 10, "the figure functions were not found"
    assert drawn <= set(FIGURES), f"add a small input for {sorted(drawn - set(FIGURES))}"


def texts(fig: Figure) -> list[str]:
    """Every text the figure shows: titles, axis and tick labels, legends."""
    return [t.get_text() for t in fig.findobj(Text) if t.get_text().strip()]


def _english_templates() -> list[tuple[str, re.Pattern]]:
    """Each catalog entry whose French differs, as a pattern of its English
    text (a placeholder matches anything) that holds at least one word."""
    found = []
    for english, french in edition.catalog("fr").items():
        literal = re.sub(r"\{[^{}]*\}", "", english)
        if french == english or not re.search(r"[A-Za-z]{3,}", literal):
            continue
        parts = re.split(r"\{[^{}]*\}", english)
        found.append((english, re.compile(".*?".join(map(re.escape, parts)), re.DOTALL)))
    return found


# Words that only English writes: a text in the French figures that holds
# one outside code (opt.step(), weight=<tokens>) was never translated,
# marked or not. French keeps "bucket" as it keeps token and microbatch (its
# prose says "bucket", not "seau").
CODE = re.compile(r"\S*[._()=<>\[\]]\S*")
ENGLISH = re.compile(r"\b(the|of|and|per|with|each|every|rank|ranks|step|mean|means|"
                     r"weight|loss|shown|sampled|after|update|window|untrained|trained|"
                     r"passes|fails|waits|exactly|best|guess|floor|layers|"
                     r"time|start|right|trapped|closest|same|share|run)\b")


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_the_french_figures_hold_no_english(name, monkeypatch):
    monkeypatch.setenv(edition.ENV, "fr")
    shown = texts(FIGURES[name]())
    assert shown, "a figure with no text"
    templates = _english_templates()
    untranslated = [(t, key) for t in shown for key, pattern in templates
                    if pattern.fullmatch(t)]
    assert not untranslated, f"shown in English: {untranslated[:3]}"
    english = [t for t in shown if ENGLISH.search(CODE.sub(" ", t))]
    assert not english, f"English words in the French figure: {english[:3]}"


@pytest.mark.parametrize("name", ["parity_scatter", "evaluation", "exercise", "count_ratios",
                                  "optimizer_paths", "token_explorer", "theta_explorer"])
def test_the_french_figures_write_french_numbers(name, monkeypatch):
    monkeypatch.setenv(edition.ENV, "fr")
    fig = FIGURES[name]()
    FigureCanvasAgg(fig).draw()  # the tick labels are written as the figure is drawn
    shown = texts(fig)
    assert [t for t in shown if re.search(r"\d,\d", t)], "no decimal number at all"
    assert not [t for t in shown if re.search(r"\d\.\d", t)], shown  # 2,5, not 2.5
    if name == "parity_scatter":  # counts: 1 234, a narrow no-break space
        assert "1\u202f234 violations" in " ".join(shown)


def test_the_english_figures_keep_their_words(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    assert "What one token of each rank weighs" in texts(widgets.TokenExplorer().fig)
    assert "1,234 violations" in " ".join(texts(plots.parity_scatter(_parity())))


def test_the_figures_name_things_as_the_prose_does(monkeypatch):
    """04's scenarios, 07's logged rows and Bayes' accuracy, 00's buckets: the
    words the chapters' prose uses, in each edition."""
    from course_lib.jobs.frameworks_logging import LoggingData

    def shown(figure) -> str:
        return "\n".join(texts(figure))

    monkeypatch.delenv(edition.ENV, raising=False)
    english = shown(plots.evaluation(_evaluation()))
    assert "Bayes (expected) 38.00%" in english and "best possible" not in english
    assert "skewed 12/36" in shown(plots.exercise(_exercise()))
    monkeypatch.setenv(edition.ENV, "fr")
    assert "Bayes (espérée) 38,00\u00a0%" in shown(plots.evaluation(_evaluation()))
    exercise = shown(plots.exercise(_exercise()))
    assert "équilibré 12/12" in exercise and "déséquilibré 12/36" in exercise
    logged = shown(plots.logged_values(LoggingData.committed().run))
    assert "Trainer de HF\u00a0: " in logged and "Trainer de HF: " not in logged
    assert "batch_size déduit" in logged and "inferred" not in logged
    assert "[somme, décompte]" in logged and "compte]" not in logged.replace("décompte]", "")
    assert "la formule à laquelle la valeur est égale" in logged
    ddp = shown(plots.ddp_step())
    assert "bucket 1" in ddp and "seau" not in ddp


@pytest.mark.parametrize("language", ["en", "fr"])
def test_the_ddp_step_boxes_hold_their_text(language, monkeypatch):
    """00's figure: each box's text stays inside its box, in either edition."""
    from matplotlib.patches import FancyBboxPatch

    monkeypatch.setenv(edition.ENV, language)
    fig = plots.ddp_step()
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    boxes = [p.get_window_extent(renderer) for p in ax.patches
             if isinstance(p, FancyBboxPatch)]
    held = 0
    for text in ax.texts:
        e = text.get_window_extent(renderer)
        x, y = (e.x0 + e.x1) / 2, (e.y0 + e.y1) / 2
        for b in boxes:
            if b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1:
                held += 1
                assert b.x0 < e.x0 and e.x1 < b.x1 and b.y0 < e.y0 and e.y1 < b.y1, (
                    f"{text.get_text()!r} overflows its box")
    assert held == len(boxes), "a box without its text"
