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
    window does and the GRPO trainers' legend (each shown through ``tr``);
    the English records that a chapter shows reworded (``edition.reword``):
    the jobs' names in the progress lines, the checkpoint's, the empty
    window's and the launch's messages, chapter 05's notes, the bug
    catalog's ``why`` and why a TRL loss type was not run (chapter 09); the
    recipes' formulas (chapter 08's table)."""
    from course_lib.checks.base import NOTES
    from course_lib.core import checkpoint, normalize
    from course_lib.core.config import load
    from course_lib.core.verdicts import EmptyOutcome, Verdict
    from course_lib.course.bug_tour import FAMILIES
    from course_lib.course.style import LABELS
    from course_lib.frameworks import options as fw_options
    from course_lib.frameworks import source
    from course_lib.frameworks.candidates import CANDIDATES
    from course_lib.frameworks.evidence import CONFIGURATION_HEAD, NO_LOSS_TYPE
    from course_lib.jobs import recipes as recipe_jobs
    from course_lib.jobs.capstone import PROPERTIES
    from course_lib.jobs.frameworks_logging import VERDICTS
    from course_lib.jobs.trl_grpo import LEGEND
    from course_lib.run import diagnose, progress
    from course_lib.steps import BUILTIN
    from course_lib.steps.base import KINDS
    from course_lib.steps.recipes import RECIPES, describe_empty

    options = {o for q in quiz.QUESTIONS.values() for o in q.choices()
               if not grading.neutral(o)}
    exercise = load(paths.config_path("exercise")).exercise
    assert exercise is not None
    reworded = {*progress.TASKS, *progress.RUNS, *normalize.MESSAGES, *checkpoint.MESSAGES,
                checkpoint.DIFFERENCE, *diagnose.REASONS, diagnose.DESYNC, *NOTES,
                *diagnose.JOB_NAMES, fw_options.UNSHARDED, *recipe_jobs.DESCRIPTIONS,
                NO_LOSS_TYPE}
    return options | set(LABELS.values()) | {str(v) for v in Verdict} | {
        c.name for c in CANDIDATES} | set(VERDICTS) | {
        s.description for s in BUILTIN.values()} | {sc.name for sc in exercise.scenarios} | set(
        PROPERTIES.values()) | set(FAMILIES) | source.labels() | {LEGEND} | set(
        CONFIGURATION_HEAD) | {describe_empty(o, finite) for o in EmptyOutcome
                               for finite in (None, False)} | reworded | {
        s.why for s in BUILTIN.values()} | {
        text for r in RECIPES.values() for text in (r.backprop, r.reduction)} | set(KINDS)


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
    assert edition.decimal(-1e-12) == "0,0000" and edition.decimal(-0.5) == "\u22120,5000"
    assert edition.number(0.3544, ".2%") == f"35,44{nbsp}%"
    assert edition.number(6.43e-3, ".2e") == "6,43e-03"  # an exponent's sign stays
    assert edition.marks("= -6.43e-03 (L - 1)") == "= \u22126,43e-03 (L - 1)"  # a hyphen stays


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
    assert french[0] == ("Bilan\u00a0: 2 rangs, gloo sur CPU "
                         "(pas la configuration de référence NCCL)")
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
    assert french[0] == ("2 rangs, gloo sur CPU (pas la configuration de référence NCCL"
                         "\u00a0: un substitut CPU/gloo)")
    assert french[1].startswith("1 rang, gloo sur CPU (pas ")
    assert french[2] == "4 rangs, nccl sur cuda (la configuration de référence NCCL)"
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
        assert ("du cours" if info.kind == "correct" else "à auditer") in line
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


# --- what course_lib explains while a chapter runs (issue 30) ------------------------------


def test_the_progress_lines_speak_the_edition(monkeypatch):
    """The frame and the jobs' names in French; English byte for byte, and
    the wire (rank 0's JSON) English in both editions."""
    import io

    from course_lib.run import progress

    def lines(jobs):
        out = io.StringIO()
        sink = progress.TextProgress(out)
        for job, total in jobs:
            sink.update(job, 0, total)
            sink.update(job, total, total)
        return out.getvalue().splitlines()

    jobs = [("world size 2", 15), ("uneven microbatches", 3), ("parity", 3),
            ("train resume (updates 51-100)", 50), ("train ablation:model_only", 50),
            ("capstone at W=2", 4), ("frameworks_logging", 1)]
    monkeypatch.delenv(edition.ENV, raising=False)
    english = lines(jobs)
    assert english[:2] == ["[world size 2] started", "[world size 2] 15/15 done"]
    assert english[6:8] == ["[train resume (updates 51-100)] started",
                            "[train resume (updates 51-100)] 50/50 done"]
    wire = progress.encode("world size 2", 1, 15)
    monkeypatch.setenv(edition.ENV, "fr")
    assert progress.encode("world size 2", 1, 15) == wire
    french = lines(jobs)
    assert french[:2] == ["[nombre de rangs W = 2] lancé",
                          "[nombre de rangs W = 2] 15/15 terminé"]
    # a job named by the check it runs keeps that name, as every table writes it
    assert french[2] == "[microbatches inégaux] lancé" and french[4] == "[parity] lancé"
    assert french[6] == "[reprise (mises à jour 51 à 100)] lancé"
    assert french[8] == "[ablation model_only] lancé"
    assert french[10] == "[projet final à W = 2] lancé"
    assert french[12:] == ["[frameworks_logging] lancé", "[frameworks_logging] 1/1 terminé"]
    assert not [line for line in french
                if re.search(r"\b(started|done|world|size|train)\b", line)]


def test_a_checkpoints_refusal_speaks_the_edition(monkeypatch, tmp_path):
    """verify's message stays English (the CLI and the logs keep it); ``said``
    is French in the French edition."""
    from course_lib.core import checkpoint

    folder = tmp_path / "step-0050"
    folder.mkdir()
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.verify(folder)
    monkeypatch.delenv(edition.ENV, raising=False)
    english = "step-0050: manifest.json is missing (incomplete write?)"
    assert str(caught.value) == caught.value.said == english
    differs = checkpoint.CheckpointError(
        "step-0050: config differs from the checkpoint's (train.lr: 0.1 in the checkpoint, "
        "0.2 now)")
    monkeypatch.setenv(edition.ENV, "fr")
    assert str(caught.value) == english
    assert caught.value.said == ("step-0050\u00a0: manifest.json est absent "
                                 "(écriture incomplète\u202f?)")
    assert differs.said == ("step-0050\u00a0: la configuration diffère de celle du checkpoint "
                            "(train.lr\u00a0: 0.1 dans le checkpoint, 0.2 maintenant)")
    unknown = checkpoint.CheckpointError("something no template wrote")
    assert unknown.said == "something no template wrote"


def test_an_empty_window_speaks_the_edition(monkeypatch):
    import torch

    from course_lib.core import normalize

    with pytest.raises(normalize.EmptyWindowError) as caught:
        normalize.checked_global_count(torch.tensor(0))
    monkeypatch.delenv(edition.ENV, raising=False)
    assert str(caught.value) == caught.value.said == normalize.EMPTY_WINDOW
    monkeypatch.setenv(edition.ENV, "fr")
    assert str(caught.value) == normalize.EMPTY_WINDOW
    assert caught.value.said.startswith("aucun token supervisé dans la fenêtre globale (N = 0)")
    assert "every" not in caught.value.said


# Chapter 10's empty window and chapter 05's hang, as diagnose wrote them.
EMPTY_LAUNCH = ("ranks 0, 1 failed in train at step 1: EmptyWindowError: no supervised token "
                "in the global window (N = 0): every rank stops here, after the same "
                "all_reduce [torchrun exited with code 1]")
HANG = ("rank 1 failed in uneven (step no_sync_backward_only, check uneven_microbatches) "
        "(seen by rank 0): StepDesyncError: rank 1 did not finish the step within 10 s: a "
        "hang, or a collective that the other ranks skipped [torchrun exited with code 1]")


def test_a_launchs_failure_speaks_the_edition(monkeypatch):
    """The message stays English (the CLI, the uneven check's note and the
    capstone's grade read it); its first line reads French in the French
    edition, frame, reasons and the rank's error alike."""
    from course_lib.run import diagnose
    from course_lib.run.diagnose import LaunchError

    err = LaunchError(EMPTY_LAUNCH + "\n{\"event\": \"error\"}", rank=0, step=1, job="train")
    timeout = ("rank 1 failed in train at step 3: killed by SIGABRT; timed out after 60 s; "
               "rank 1's process was stopped (SIGSTOP), the others waited for it (a C++ "
               "abort: often collectives that differ between ranks) (rank 0 at step 3, "
               "rank 1 at step 2)")
    monkeypatch.delenv(edition.ENV, raising=False)
    assert err.said == str(err) and diagnose.said(HANG) == HANG
    assert diagnose.said(timeout) == timeout
    monkeypatch.setenv(edition.ENV, "fr")
    assert str(err).startswith(EMPTY_LAUNCH)
    first, tail = err.said.split("\n")
    assert tail == '{"event": "error"}'
    assert first == ("les rangs 0, 1 sont en cause dans le lancement train au pas 1\u00a0: "
                     "EmptyWindowError\u00a0: aucun token supervisé dans la fenêtre globale "
                     "(N = 0)\u00a0: chaque rang s'arrête ici, après le même all_reduce "
                     "[torchrun s'est terminé avec le code 1]")
    hang = diagnose.said(HANG)
    assert hang.startswith("le rang 1 est en cause dans le lancement des microbatches inégaux "
                           "(fonction step "
                           "no_sync_backward_only, vérification uneven_microbatches), "
                           "d'après le rang 0\u00a0: StepDesyncError\u00a0: le rang 1 n'a pas")
    french = diagnose.said(timeout)
    assert "tué par SIGABRT" in french
    assert "(rang 0 au pas 3, rang 1 au pas 2)" in french
    for line in (first, hang, french):
        english = r"\b(failed|seen by|at step|exited|killed|timed|the)\b"
        assert not re.search(english, line), line
    assert diagnose.said("a line diagnose never wrote") == "a line diagnose never wrote"


def test_the_bug_lab_explains_in_the_edition(monkeypatch, capsys):
    """Chapter 05's whys and notes: the catalog and the reports keep them
    English, the tour reads them French in the French edition."""
    import inspect
    import textwrap

    from course_lib.checks import base, no_sync, uneven
    from course_lib.course import bug_tour
    from course_lib.steps import BUILTIN

    family = "tokens weighed unequally"
    tour = bug_tour.Tour(None, Path("."))  # type: ignore[arg-type]  # whys need no run
    monkeypatch.delenv(edition.ENV, raising=False)
    tour.show_why(family)
    before = "".join(textwrap.fill(f"{name}: {BUILTIN[name].why}", 76, subsequent_indent="    ")
                     + "\n" for name in bug_tour.FAMILIES[family])
    assert capsys.readouterr().out == before
    notes = ["synchronisation deferred to the last microbatch",
             "ranks already agreed after microbatch 1 of 2: DDP synchronised early "
             "(no_sync() must wrap forward and backward)",
             "microbatches per rank: 3, 6", "the step never finished: " + HANG]
    assert [base.said(n) for n in notes] == notes
    # each note's template is a text the checks write (their fields as {})
    written = set()
    for node in ast.walk(ast.parse(inspect.getsource(no_sync) + inspect.getsource(uneven))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            written.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            written.add("".join(v.value if isinstance(v, ast.Constant) else "{}"
                                for v in node.values))
    assert {re.sub(r"\{[^{}]*\}", "{}", t) for t in base.NOTES} <= written
    monkeypatch.setenv(edition.ENV, "fr")
    tour.show_why(family)
    french = capsys.readouterr().out
    assert french.startswith("mean_of_means\u00a0: un token d'un rang qui a peu de tokens")
    assert not re.search(r"\b(weighs|each|rank|the)\b", french)
    said = [base.said(n) for n in notes]
    assert said[0] == "synchronisation différée jusqu'au dernier microbatch"
    assert said[1].startswith("rangs déjà d'accord après le microbatch 1 sur 2\u00a0:")
    assert said[2] == "microbatches par rang\u00a0: 3, 6"
    assert said[3].startswith("la fonction step ne s'est jamais terminée\u00a0: le rang 1 est "
                              "en cause")
