"""The French edition's strings: complete, never stale, and switched by
COURSE_EDITION alone (LANG is the learner's shell, not the course's)."""

import ast
import json
import re
import string
from pathlib import Path

import pytest

from course_lib.core import edition, paths
from course_lib.core.reference import Comparison
from course_lib.course import api, grading, quiz, widgets
from course_lib.jobs.parity import GradSample, ParityReport

SOURCES = sorted((paths.project_root() / "course_lib").rglob("*.py"))


def marked() -> set[str]:
    """Every literal that a ``tr(...)`` call marks, as xgettext would find it."""
    found = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tr"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
    return found


def vocabularies() -> set[str]:
    """The words from the code's own lists that a learner reads: the quiz's
    options (but code names and formulas), the schemes' legends, the
    verdicts and formula names the figures write, the step functions'
    descriptions (chapter 05's table) and families, the exercise's scenario
    names and the capstone's properties, the real code's labels and quoted
    titles (chapters 08 and 09), the configurations' columns, what an empty
    window does and the GRPO trainers' legend (each shown through ``tr``)."""
    from course_lib.core.config import load
    from course_lib.core.verdicts import EmptyOutcome, Verdict
    from course_lib.course.bug_tour import FAMILIES
    from course_lib.course.style import LABELS
    from course_lib.frameworks import source
    from course_lib.frameworks.candidates import CANDIDATES
    from course_lib.frameworks.evidence import CONFIGURATION_HEAD
    from course_lib.jobs.capstone import PROPERTIES
    from course_lib.jobs.frameworks_logging import VERDICTS
    from course_lib.jobs.trl_grpo import LEGEND
    from course_lib.steps import BUILTIN
    from course_lib.steps.recipes import describe_empty

    options = {o for q in quiz.QUESTIONS.values() for o in q.choices()
               if not grading.neutral(o)}
    exercise = load(paths.config_path("exercise")).exercise
    assert exercise is not None
    return options | set(LABELS.values()) | {str(v) for v in Verdict} | {
        c.name for c in CANDIDATES} | set(VERDICTS) | {
        s.description for s in BUILTIN.values()} | {sc.name for sc in exercise.scenarios} | set(
        PROPERTIES.values()) | set(FAMILIES) | source.labels() | {LEGEND} | set(
        CONFIGURATION_HEAD) | {describe_empty(o, finite) for o in EmptyOutcome
                               for finite in (None, False)}


def learner_strings() -> set[str]:
    """What a learner reads: the marked literals, the quiz's prompts, hints
    and options, and the figures' vocabularies."""
    return marked() | vocabularies() | {quiz.RIGHT, quiz.UNANSWERED} | {
        q.prompt for q in quiz.QUESTIONS.values()} | {q.hint for q in quiz.QUESTIONS.values()}


def test_the_french_catalog_is_complete_and_not_stale():
    fr = json.loads((edition.LOCALE / "fr.json").read_text(encoding="utf-8"))
    wanted = learner_strings()
    missing = sorted(wanted - set(fr))
    stale = sorted(set(fr) - wanted)
    assert not missing, f"translate into locale/fr.json: {missing[:3]}"
    assert not stale, f"locale/fr.json keeps strings no code reads: {stale[:3]}"
    assert all(v.strip() for v in fr.values())
    for english, french in fr.items():  # the placeholders survive translation
        assert sorted(_fields(english)) == sorted(_fields(french)), english


def _fields(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]


def test_english_is_the_default_even_in_a_french_shell(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    assert edition.current() == "en"
    assert str(quiz.check("mean_of_means.1", None)) == "your answer here"


def test_the_french_edition_speaks_french(monkeypatch):
    from course_lib.core.typography import breakable, french

    monkeypatch.setenv(edition.ENV, "fr")
    catalog = edition.catalog("fr")
    fr = {english: french(text) for english, text in catalog.items()}  # as set in type
    unanswered = quiz.check("mean_of_means.1", None)
    assert str(unanswered) == fr["your answer here"] and not unanswered.answered
    wrong = quiz.check("mean_of_means.1", 99.0)
    assert str(wrong) == fr["not yet: {hint}"].format(
        hint=fr[quiz.QUESTIONS["mean_of_means.1"].hint])
    assert str(quiz.check("mean_of_means.1", quiz.QUESTIONS["mean_of_means.1"].expected())
               ) == fr["correct"]
    assert quiz.ask("mean_of_means.1") == fr[quiz.QUESTIONS["mean_of_means.1"].prompt]
    assert not breakable(str(wrong)), "a colon that can wrap to the start of a line"
    explorer = widgets.TokenExplorer()
    assert explorer.world_size.description == fr["ranks W"]
    assert widgets.Quiz("mean_of_means.1").button.description == fr["Check"]


def test_the_summary_says_its_verdicts_in_french(monkeypatch):
    monkeypatch.setenv(edition.ENV, "fr")
    good, bad = Comparison(1e-8, True, 0), Comparison(1e-2, False, 9)
    report = ParityReport(
        world_size=2, backend="gloo", device="cpu", dtype="float32",
        nccl_reference_path=False, torch="2.x", compared_values=10, atol=1e-6,
        rtol=1e-4, step=0, local_tokens=[1, 2], global_tokens=3,
        window_loss_per_token=1.0, modes={"global_token": good, "mean_of_means": bad},
        no_sync={}, grad_sample=GradSample([], [], [], []), passed=True,
        control="mean_of_means")
    verdicts = [v for _, v, _ in api.SECTIONS["parity"].rows(report)]
    fr = edition.catalog("fr")
    assert verdicts == [fr["PASS"], fr["FAIL (expected)"]]


def test_an_unknown_edition_is_one_line(monkeypatch):
    monkeypatch.setenv(edition.ENV, "de")
    with pytest.raises(edition.EditionError, match="choose one of en, fr"):
        edition.current()


def test_numbers_as_each_edition_writes_them(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    assert edition.number(112_480) == "112,480" and edition.number(110_284, "d") == "110284"
    assert edition.decimal(2.5) == "2.5000" and edition.decimal(-1e-12) == "0.0000"
    assert edition.decimal(-0.5, 2) == "-0.50" and edition.number(0.3544, ".2%") == "35.44%"
    monkeypatch.setenv(edition.ENV, "fr")
    nnbsp, nbsp = "\u202f", "\u00a0"
    assert edition.number(112_480) == f"112{nnbsp}480"
    assert edition.number(110_284, "d") == f"110{nnbsp}284", "French groups every count"
    assert edition.number(1234.5, ".2f") == f"1{nnbsp}234,50"
    assert edition.decimal(2.5) == "2,5000" and edition.decimal(1 / 3, 2) == "0,33"
    assert edition.decimal(-1e-12) == "0,0000" and edition.decimal(-0.5) == "-0,5000"
    assert edition.number(0.3544, ".2%") == f"35,44{nbsp}%"
    assert edition.number(6.43e-3, ".2e") == "6,43e-03"


def _templates_of(source) -> list[tuple[str, re.Pattern]]:
    """The English texts that ``source``'s ``tr`` calls mark and French
    changes, as patterns (a placeholder matches anything)."""
    found = []
    for node in ast.walk(ast.parse(Path(source.__file__).read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tr"
                and node.args and isinstance(node.args[0], ast.Constant)):
            english = node.args[0].value
            words = re.sub(r"\{[^{}]*\}", "", english)
            if edition.catalog("fr")[english] != english and re.search(r"[a-z]{2,}", words):
                parts = re.split(r"\{[^{}]*\}", english)
                found.append((english, re.compile(".*".join(map(re.escape, parts)))))
    return found


def test_the_summary_speaks_one_language_a_line(monkeypatch, tmp_path):
    from course_lib.core.evaluate import Score
    from course_lib.jobs.evaluate import EvaluationReport
    from course_lib.jobs.exercise import ExerciseReport, ModeGradients, ModelLosses, Scenario
    from course_lib.jobs.resume import Ablation, ResumeReport

    header = {"world_size": 2, "backend": "gloo", "device": "cpu", "dtype": "float32",
              "nccl_reference_path": False, "torch": "2.x"}
    good, bad = Comparison(7.45e-9, True, 0), Comparison(6.43e-3, False, 110_284)
    ParityReport(**header, compared_values=112_480, atol=1e-6, rtol=1e-4, step=0,
                 local_tokens=[12, 36], global_tokens=48, window_loss_per_token=1.0,
                 modes={"global_token": good, "mean_of_means": bad}, no_sync={},
                 grad_sample=GradSample([], [], [], []), passed=True,
                 control="mean_of_means").save(tmp_path)
    ResumeReport(**header, step=100, resumed_from_step=50, compared_values=112_480,
                 max_abs_param_diff=0.0, identical=True, resumed="r", continuous="c",
                 ablations={"model_only": Ablation(["model"], 0.121, False, True, "",
                                                   51, 51)},
                 every_ablation_matters=True).save(tmp_path)
    EvaluationReport(device="cpu", backend="gloo", checkpoint="c", step=100,
                     test_sequences=256, test_tokens=16_971, loss_per_token=1.6076,
                     token_accuracy=0.3544, entropy_floor=1.5324, bayes_accuracy=0.38,
                     untrained=Score(3.6825, 0.0253), above_floor_by=0.075).save(tmp_path)
    gradients = ModeGradients(10, good, bad)
    ExerciseReport(**header, atol=1e-6, rtol=1e-4, scenarios=[Scenario(
        "skewed", [12, 36], [1.0, 3.0], [12.0, 108.0], 2.0, 2.5,
        ModelLosses([1.0, 2.0], 2.0, 2.5), gradients)]).save(tmp_path)
    english = api.summary(tmp_path).splitlines()
    monkeypatch.setenv(edition.ENV, "fr")
    french = api.summary(tmp_path).splitlines()
    assert len(french) == len(english) == 8
    assert french[0] == "Bilan\u00a0: 2 rangs, gloo sur CPU (pas le chemin de référence NCCL)"
    templates = _templates_of(api)
    for line in french:
        assert not [e for e, p in templates if p.search(line)], line
        assert not re.search(r"\d\.\d|\b(of|over|vs|in|ranks|untrained|True|False)\b", line)
    assert "110\u202f284 violations" in french[2] and "35,44\u00a0%" in french[6]


# --- what the chapters print from the engine (issue 30) ---------------------------------


def test_the_placement_line_speaks_the_edition(monkeypatch):
    """Every chapter prints where its launches run: the run layer's text in
    English, byte for byte, and French in the French edition."""
    from course_lib.run.placement import Placement

    monkeypatch.delenv(edition.ENV, raising=False)
    placements = [Placement("gloo", "cpu", 2), Placement("gloo", "cpu", 1),
                  Placement("nccl", "cuda", 4), Placement("gloo", "cuda", 2)]
    for p in placements:
        assert api.describe_placement(p) == p.describe()
    monkeypatch.setenv(edition.ENV, "fr")
    french = [api.describe_placement(p) for p in placements]
    assert french[0] == ("2 rangs, gloo sur CPU (pas le chemin de référence NCCL\u00a0: "
                         "une doublure CPU/gloo)")
    assert french[1].startswith("1 rang, gloo sur CPU (pas ")
    assert french[2] == "4 rangs, nccl sur cuda (le chemin de référence NCCL)"
    assert not [line for line in french if re.search(r"\b(rank|on|not|the|path)\b", line)]


def _r1_reports(out: Path) -> None:
    """The three reports chapter 07's r1 table reads."""
    from course_lib.core.evaluate import Score
    from course_lib.jobs.evaluate import EvaluationReport
    from course_lib.jobs.resume import ResumeReport

    header = {"world_size": 2, "backend": "gloo", "device": "cpu", "dtype": "float32",
              "nccl_reference_path": False, "torch": "2.x"}
    ParityReport(**header, compared_values=112_480, atol=1e-6, rtol=1e-4, step=0,
                 local_tokens=[12, 36], global_tokens=48, window_loss_per_token=1.0,
                 modes={"global_token": Comparison(7.45e-9, True, 0),
                        "mean_of_means": Comparison(6.43e-3, False, 110_284)},
                 no_sync={}, grad_sample=GradSample([], [], [], []), passed=True,
                 control="mean_of_means").save(out)
    ResumeReport(**header, step=100, resumed_from_step=50, compared_values=112_480,
                 max_abs_param_diff=0.0, identical=True, resumed="r", continuous="c",
                 ablations={}, every_ablation_matters=True).save(out)
    EvaluationReport(device="cpu", backend="gloo", checkpoint="c", step=100,
                     test_sequences=256, test_tokens=16_971, loss_per_token=1.6076,
                     token_accuracy=0.3544, entropy_floor=1.5324, bayes_accuracy=0.3772,
                     untrained=Score(3.6825, 0.0253), above_floor_by=0.075).save(out)


# Chapter 07's r1 table as the English edition printed it before the catalog
# carried it (the text repr; the HTML is built from the same cells).
R1_TABLE_EN = """\
quantity               r1             this course  why they differ
gradient values        282,628        112,480      a smaller model
parity, W*S_r/N        3.73e-08 PASS  < 1e-7 PASS  gloo on CPU: another summation order
parity, mean of means  0.0216 FAIL    0.0064 FAIL  another model and data
resume at step 100     0.0 exactly    0.0 exactly  same verdict: bit for bit
test tokens            18,231         16,971       another corpus; ours counts the L - 1 \
targets of its 256 sequences (17,227 if counted as L)
test loss per token    1.315          1.608        another corpus: ours is a Markov source, \
floor 1.532
token accuracy         36.2%          35.4%        another corpus: ours expects at best \
37.7% (Bayes: always its likeliest successor)"""


def test_the_r1_table_speaks_the_edition(monkeypatch, tmp_path):
    from course_lib.course import reconcile

    _r1_reports(tmp_path)
    monkeypatch.delenv(edition.ENV, raising=False)
    assert repr(reconcile.table(tmp_path)) == R1_TABLE_EN
    monkeypatch.setenv(edition.ENV, "fr")
    table = reconcile.table(tmp_path)
    french = repr(table).splitlines()
    assert " ".join(french[0].split()) == "grandeur r1 ce cours pourquoi ils diffèrent"
    assert "<th" in table._repr_html_() and "pourquoi ils diffèrent" in table._repr_html_()
    templates = _templates_of(reconcile)
    for line in french:
        assert not [e for e, p in templates if p.search(line)], line
        assert not re.search(r"\d\.\d|\b(PASS|FAIL|exactly|another|ours|of|if)\b", line), line
    nnbsp, nbsp = "\u202f", "\u00a0"
    assert f"282{nnbsp}628" in french[1] and "0,0216 ÉCHEC" in french[3]
    assert "3,73e-08 RÉUSSITE" in french[2] and "0,0 exactement" in french[4]
    assert f"36,2{nbsp}%" in french[7] and f"37,7{nbsp}%" in french[7]


def _step_table_before() -> str:
    """Chapter 05's table as the chapter's own cell wrote it, in English."""
    from course_lib.steps import BUILTIN

    status = {"correct": "the course"}
    rows = [f"| `{name}` | {status.get(info.kind, 'under test')}"
            f" | {info.description} |" for name, info in BUILTIN.items()]
    return "\n".join(["| step function | status | what it does |", "|---|---|---|", *rows])


def test_the_step_table_speaks_the_edition(monkeypatch):
    from course_lib.steps import BUILTIN

    monkeypatch.delenv(edition.ENV, raising=False)
    assert api.step_table() == _step_table_before()
    monkeypatch.setenv(edition.ENV, "fr")
    french = api.step_table().splitlines()
    fr = edition.catalog("fr")
    assert french[0] == "| fonction step | statut | ce qu'elle fait |"
    assert len(french) == 2 + len(BUILTIN)
    for line, (name, info) in zip(french[2:], BUILTIN.items(), strict=True):
        assert line.startswith(f"| `{name}` | ")
        assert info.description not in line, line
        assert ("le cours" if info.kind == "correct" else "à l'essai") in line
        assert fr[info.description].split(" ", 1)[0] in line
    assert not [line for line in french if re.search(r"\b(the|under|each|counted)\b", line)]


def test_a_cells_reminder_speaks_the_edition(monkeypatch):
    monkeypatch.delenv(edition.ENV, raising=False)
    assert api.unset("t_target") == "set t_target above, then run the cell again"
    monkeypatch.setenv(edition.ENV, "fr")
    french = api.unset("t_target")
    assert "t_target" in french and "cellule" in french
    assert not re.search(r"\b(set|above|then|run|the|cell|again)\b", french)


def test_the_logged_verdicts_speak_the_edition(monkeypatch):
    """Chapter 07 prints each logged row's verdict, the formula its value
    equals: as the report keeps it in English, from the catalog in French."""
    from course_lib.core.typography import french
    from course_lib.jobs.frameworks_logging import VERDICTS, LoggingData

    rows = LoggingData.committed().run.rows
    assert rows and {r.verdict for r in rows} <= set(VERDICTS)
    monkeypatch.delenv(edition.ENV, raising=False)
    assert [r.said for r in rows] == [r.verdict for r in rows]
    monkeypatch.setenv(edition.ENV, "fr")
    fr = edition.catalog("fr")
    assert [r.said for r in rows] == [french(fr[r.verdict]) for r in rows]
    assert "moyenne par token" in {r.said for r in rows}
    assert "moyenne des moyennes des rangs" in {r.said for r in rows}
