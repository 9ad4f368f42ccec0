"""The unit is a choice: each objective's reference by hand, its bad input,
and its bug catalog under real torchrun jobs (gloo/CPU)."""

import pytest
import torch

from course_lib.core import objectives, paths
from course_lib.core.data import IGNORE_INDEX
from course_lib.core.model import loss_sum
from course_lib.core.objectives import ObjectiveError, parse, window_loss
from course_lib.course import quiz
from course_lib.jobs import audit as audits
from course_lib.jobs.audit import AuditReport, BugsReport
from course_lib.steps.objectives import CATALOGS
from tests.conftest import course_lib_cli

# --- the references, by hand ----------------------------------------------------------


def window():
    """Two microbatches: rows of 1, 3 and 2 supervised labels, and a row with none."""
    torch.manual_seed(0)
    labels = [torch.tensor([[1, IGNORE_INDEX, IGNORE_INDEX], [2, 0, 1]]),
              torch.tensor([[IGNORE_INDEX, 2, 2], [IGNORE_INDEX] * 3])]
    logits = [torch.randn(2, 3, 4, dtype=torch.float64) for _ in labels]
    return list(zip(logits, labels, strict=True))


def per_row(lg, lb):
    return objectives.token_losses(lg, lb).sum(-1), (lb != IGNORE_INDEX).sum(-1)


def test_the_token_mean_is_the_sum_over_n():
    mbs = window()
    want = sum(loss_sum(lg, lb) for lg, lb in mbs) / 6
    assert float(window_loss(parse("token"), mbs)) == pytest.approx(float(want), rel=1e-12)


def test_the_sequence_mean_weighs_every_supervised_row_the_same():
    mbs = window()
    means = []
    for lg, lb in mbs:
        sums, counts = per_row(lg, lb)
        means += [float(s / c) for s, c in zip(sums, counts, strict=True) if c > 0]
    assert len(means) == 3  # the row without a supervised label is no sequence
    got = float(window_loss(parse("sequence"), mbs))
    assert got == pytest.approx(sum(means) / 3, rel=1e-12)


def test_the_document_mean_weighs_every_run_of_labels_the_same():
    # Row 0 packs two documents (3 and 2 labels) around the ignored label
    # that crosses their boundary; row 1 holds one document of 1 label.
    torch.manual_seed(2)
    labels = torch.tensor([[1, 2, 0, IGNORE_INDEX, 3, 1], [2] + [IGNORE_INDEX] * 5])
    logits = torch.randn(2, 6, 4, dtype=torch.float64)
    index, count = objectives.documents(labels)
    assert count == 3 and index.tolist() == [[0, 0, 0, -1, 1, 1], [2] + [-1] * 5]
    losses = objectives.token_losses(logits, labels)
    want = (losses[0, :3].mean() + losses[0, 4:].mean() + losses[1, 0]) / 3
    got = window_loss(parse("document:8"), [(logits, labels)])
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    # The sequence mean weighs rows, not documents: row 0 then counts once.
    rows = (losses[0].sum() / 5 + losses[1, 0]) / 2
    assert float(window_loss(parse("sequence"), [(logits, labels)])) == pytest.approx(
        float(rows), rel=1e-12)


def test_packing_keeps_every_token_and_marks_each_boundary(corpus):
    from course_lib.core.data import Packing, collate

    ids = list(corpus.splits["train"][:6])
    packing = Packing(96, seed=3)
    inputs, labels = collate(corpus, ids, packing=packing)
    plain = [len(corpus.sequences[d]) - 1 for i in ids for d in packing.documents(corpus, i)]
    assert int((labels != IGNORE_INDEX).sum()) == sum(plain)  # no token lost or added
    for row, i in enumerate(ids):
        docs = packing.documents(corpus, i)
        assert docs[0] == i and sum(len(corpus.sequences[d]) for d in docs) <= max(
            96, len(corpus.sequences[i]))
        assert objectives.documents(labels[row:row + 1])[1] == len(docs)
        assert inputs[row, 0] == corpus.sequences[i][0]
    # A row is a function of its opening sequence: the same in any microbatch.
    again = collate(corpus, ids[3:4], packing=packing)[1]
    assert torch.equal(again[0], labels[3, :again.shape[1]])
    counts = {len(packing.documents(corpus, i)) for i in corpus.splits["train"][:64]}
    assert len(counts) > 1  # rows hold different numbers of documents


def test_the_weighted_mean_divides_by_the_weights():
    mbs = window()
    num = sum(float((objectives.token_losses(lg, lb) * objectives.class_weights(lb)).sum())
              for lg, lb in mbs)
    den = sum(float(objectives.class_weights(lb).sum()) for _, lb in mbs)
    assert den == 2 + (3 + 1 + 2) + (3 + 3)  # 1 + label % 3 on each supervised label
    assert float(window_loss(parse("weighted"), mbs)) == pytest.approx(num / den, rel=1e-12)


def test_a_constant_divides_by_c_whatever_the_counts():
    mbs = window()
    total = sum(float(loss_sum(lg, lb)) for lg, lb in mbs)
    assert float(window_loss(parse("constant:12"), mbs)) == pytest.approx(total / 12)
    assert parse("constant:12").spec == "constant:12"


def test_a_z_loss_is_normalized_like_the_tokens():
    mbs = window()
    total = sum(float(loss_sum(lg, lb)) for lg, lb in mbs)
    z = sum(float((torch.logsumexp(lg, -1).square() * (lb != IGNORE_INDEX)).sum())
            for lg, lb in mbs)
    got = float(window_loss(parse("zloss:0.5"), mbs))
    assert got == pytest.approx((total + 0.5 * z) / 6, rel=1e-12)


def test_an_l2_penalty_enters_the_reference_once():
    from course_lib.core.reference import reference_gradient

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4)).double()
    mbs = [(torch.tensor([[0, 1, 2]]), torch.tensor([[1, 2, IGNORE_INDEX]])),
           (torch.tensor([[3, 2, 1]]), torch.tensor([[0, 1, 3]]))]
    plain, _, _ = reference_gradient(model, mbs)
    with_l2, _, _ = reference_gradient(model, mbs, parse("l2:0.25"))
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(with_l2 - plain, 0.25 * weights, rtol=0, atol=1e-12)


@pytest.mark.parametrize("text, says", [
    ("tokens", "unknown objective"), ("constant", "needs its normalizer"),
    ("constant:0", "needs its normalizer"), ("constant:abc", "needs its normalizer"),
    ("sequence:3", "takes no value"), ("zloss", "needs its strength"),
    ("l2:-1", "needs its strength"), ("document", "needs document boundaries"),
    ("document:1", "needs document boundaries"), ("document:2.5", "an integer > 1"),
    ("document:inf", "needs document boundaries")])
def test_bad_objectives_are_refused(text, says):
    with pytest.raises(ObjectiveError, match=says):
        parse(text)


def test_a_report_written_before_objectives_reads_as_the_token_mean(tmp_path):
    report = BugsReport(world_size=2, backend="gloo", device="cpu", dtype="float32",
                        nccl_reference_path=False, torch="x", checks=[], steps={},
                        every_bug_caught=True, no_false_alarm=True)
    data = report.to_dict()
    del data["objective"]
    assert BugsReport.from_dict(data).objective == "token"
    assert "objective" in {f for f in AuditReport.__dataclass_fields__}


# --- under torchrun ----------------------------------------------------------------------


@pytest.mark.torchrun
@pytest.mark.parametrize("args", [("bugs", "--objective", "nope"),
                                  ("audit", "--step", "global_token", "--objective",
                                   "constant"),
                                  ("audit", "--trainer", "t.py:make", "--objective",
                                   "sequence"),
                                  ("bugs", "--objective", "document"),
                                  ("bugs", "--objective", "document:4096")])
def test_a_bad_objective_is_one_line_and_exit_2(tmp_path, args):
    proc = course_lib_cli(*args, "--out", tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.torchrun
@pytest.mark.usefixtures("no_worker_left_behind")
@pytest.mark.parametrize("objective, dtype", [
    ("sequence", "float64"), ("document:128", "float64"), ("weighted", "float64"),
    ("constant:4096", "float64"),
    ("zloss:0.1", "float64"), ("l2:0.01", "float64"), ("weighted", "float32")])
def test_each_objective_catches_its_bugs_and_passes_its_design(tmp_path, cfg, objective,
                                                               dtype):
    report = audits.bugs(cfg, tmp_path, objective=objective, dtype=dtype, timeout=600)
    name = objective.partition(":")[0]
    assert report.objective == objective and set(report.steps) == set(CATALOGS[name])
    assert report.every_bug_caught and report.no_false_alarm
    bugs = [n for n, row in report.steps.items() if row.kind == "bug"]
    # The token mean's design: the wrong unit, or the regulariser forgotten.
    assert len(bugs) >= 2 and "global_token" in bugs  # the token mean: the wrong unit
    correct = report.steps["objective_global"]
    assert correct.caught_by == []
    if dtype == "float64":  # exact, not merely within float32 rounding
        assert correct.max_abs_err["parity"] <= 1e-12
    audit = AuditReport.load(tmp_path, AuditReport.file_name("objective_global"))
    assert audit.objective == objective and audit.kind == "correct"
    assert AuditReport.load(tmp_path, AuditReport.file_name("global_token")).kind == "bug"


@pytest.mark.torchrun
@pytest.mark.usefixtures("no_worker_left_behind")
def test_a_small_auxiliary_term_is_seen_in_float64_by_every_check_that_regroups(
        tmp_path, cfg, monkeypatch):
    """At PaLM's strength the z-loss bug moves the gradient by about float32's
    tolerance, so chapter 09's exercise 3 audits it in float64 too: every check
    that puts the sequences into other microbatches fails by orders of
    magnitude, world_size_invariance (the same microbatches over 1, 2 and 4
    ranks) and no_sync pass with the same margin. The exercise's answer is
    read from the learner's two audits (the chapter's run: here tmp_path)."""
    units = tmp_path / "course" / "units"
    found = audits.audit(cfg, units / "zloss-float64", ["zloss_mean_per_microbatch"],
                         objective="zloss:0.0001", dtype="float64", timeout=300)
    checks = found["zloss_mean_per_microbatch"].checks
    failed = [c for c, r in checks.items() if not r.passed]
    assert failed == ["parity", "trajectory", "accumulation_invariance",
                      "permutation_invariance", "uneven_microbatches"]
    # float32's tolerance hides some of them: which, the exercise asks (only the
    # checks that failed in float64 can be hidden, so only they run here)
    audits.audit(cfg, units / "zloss-float32", ["zloss_mean_per_microbatch"], failed,
                 objective="zloss:0.0001", dtype="float32", timeout=300)
    monkeypatch.setattr(paths, "default_out", lambda name: tmp_path / name)
    hidden = quiz.QUESTIONS["choose_the_unit.3"].expected()
    assert "parity" in hidden and set(hidden) < set(failed)
    for name, r in checks.items():  # a clear margin either way, never a knife-edge
        if r.max_abs_err is not None:
            assert (r.max_abs_err > 1e4 * r.atol) == (name in failed), (name, r.max_abs_err)
