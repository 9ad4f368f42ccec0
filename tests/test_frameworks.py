"""The real frameworks' training loops, from the package registry, audited
under torchrun on gloo: every adapter runs, every rank's gradient is
compared, and each verdict is the one the table predicts."""

import json

import pytest

from course_lib.core.verdicts import TOLERANCE, Verdict
from course_lib.frameworks import ADAPTERS, candidates, installed
from course_lib.jobs.frameworks import (
    DEFAULT_FRAMEWORKS,
    FrameworksReport,
    audit_frameworks,
    predicted,
)
from course_lib.reports.store import report_path
from tests.conftest import course_lib_cli

pytestmark = pytest.mark.torchrun

# What a row can say: a gradient judged, ranks that disagree, or not run
# (a non-finite gradient is biased).
ROW_VERDICTS = {Verdict.EXACT, Verdict.SCALED, Verdict.BIASED, Verdict.RANKS_DISAGREE,
                Verdict.NOT_RUN}  # and "failed", where a configuration raised on every rank
NAMES = {c.name for c in candidates.CANDIDATES}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("frameworks")
    proc = course_lib_cli("frameworks", "--model", "gpt2,llama", "--out", out)
    return out, proc


def test_every_framework_runs_on_two_model_classes(audited):
    out, proc = audited
    assert proc.returncode == 0, proc.stderr
    report = FrameworksReport.load(out)
    ran = {(r.framework, r.model) for r in report.rows}
    assert ran == {(f, m) for f in DEFAULT_FRAMEWORKS for m in ("gpt2", "llama")}
    # Unsloth pins a torch of its own: the matrix audits it in its own venv.
    assert set(DEFAULT_FRAMEWORKS) == set(ADAPTERS) - {"trainer", "unsloth"}
    assert report.every_verdict_measured and report.world_size == 2


def test_the_report_contract(audited):
    out, _ = audited
    data = json.loads(report_path(out, "frameworks").read_text())
    for row in data["rows"]:
        assert {"framework", "version", "model", "flags", "verdict", "factor", "matches",
                "residual", "relative_error", "counts", "ranks"} <= set(row)
        assert row["verdict"] in ROW_VERDICTS and isinstance(row["flags"], dict)
        assert set(row["counts"]) == {"N", "N_r", "R"} and len(row["counts"]["N_r"]) == 2
        assert [r["rank"] for r in row["ranks"]] == [0, 1], "every rank is compared"
        assert row["matches"] in NAMES


def test_each_gradient_is_a_named_formula_on_every_rank(audited):
    out, _ = audited
    report = FrameworksReport.load(out)
    for r in report.rows:
        tol = 1e-5 if r.precision == "float32" else 2e-2
        assert r.residual < tol, (r.framework, r.model, r.flags, r.residual)
        assert r.verdict != "ranks disagree"
        assert len({(x.relative_error, x.scale) for x in r.ranks}) == 1
        if r.verdict == "uniformly scaled":
            n, big_r = r.counts.N, r.counts.R
            assert abs(r.factor - n / (n + big_r)) < tol, "N / (N + R)"


def test_each_verdict_is_the_one_the_table_predicts(audited):
    out, _ = audited
    for r in FrameworksReport.load(out).rows:
        want = predicted(r)
        assert want is None or r.matches == want, (
            f"{r.framework} {r.version} {r.model} {r.flags}: the run matches "
            f"{r.matches!r}, the table says {want!r}: the run wins, fix the table")


def test_the_sketch_judges_every_row_as_the_whole_comparison(audited, tmp_path):
    """The HF rows again, their gradients compared through the sketch that a
    large model's audit uses (frameworks/sketch.py), on both ranks' own
    microbatches: the same verdicts and formulas as the whole comparison."""
    from course_lib.course.api import load_config
    from course_lib.frameworks import sketch

    out, _ = audited
    whole = {(r.model, str(r.flags)): r for r in FrameworksReport.load(out).rows
             if r.framework == "hf"}
    seen = audit_frameworks(load_config(), tmp_path, ["hf"], ["gpt2", "llama"],
                            compare="sketch").rows
    assert {(r.model, str(r.flags)) for r in seen} == set(whole) and len(seen) == 4
    for r in seen:
        w = whole[r.model, str(r.flags)]
        assert w.sketch is None and r.sketch == sketch.ROWS * sketch.COLS
        assert (r.verdict, r.matches) == (w.verdict, w.matches), (r.model, r.flags)
        assert [x.rank for x in r.ranks] == [0, 1]
        assert r.residual < TOLERANCE.exact["float32"]
        if w.factor is not None:
            assert abs(r.factor - w.factor) < 1e-4 * w.factor
        if w.relative_error > 1e-3:
            assert abs(r.relative_error - w.relative_error) < 0.5 * w.relative_error


def test_exact_compare_is_for_a_trainer_not_a_step():
    proc = course_lib_cli("audit", "--step", "global_token", "--exact-compare")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "--exact-compare applies to --trainer: a --step's gradients are always "
        "compared whole")


def test_an_unknown_framework_or_model_is_one_line(tmp_path):
    for args in (("--framework", "keras"), ("--model", "no_such_model"),
                 ("--with", "lora,no_such_configuration"),
                 ("--framework", "accelerate", "--with", "collator")):
        proc = course_lib_cli("frameworks", *args, "--out", tmp_path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for args in (("--step", "global_token", "--with", "lora"),
                 ("--trainer", "x.py:f", "--with", "collator")):
        proc = course_lib_cli("audit", *args, "--out", tmp_path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "reports").exists(), "refused before any launch"


# --- the configurations people train with: --with ----------------------------------

# Each row's own launch would cost a start; one launch holds a framework's
# configurations: the HF Trainer's on both models, and TRL's own data
# preparation on GPT-2, whose count is the one R moves (the CLI runs both
# models). compile (a minute of inductor on 2 cores) is run by the CLI, not here.
LAUNCHES = {
    "hf": (("gpt2", "llama"),
           ("lora", "gradient_checkpointing", "collator", "fsdp", "deepspeed", "liger")),
    "trl": (("gpt2",), ("completion_only", "assistant_only", "packing")),
}
TRL_DATA = set(LAUNCHES["trl"][1])  # TRL prepares their rows


def _launch(tmp_path_factory, framework):
    out = tmp_path_factory.mktemp(f"with-{framework}")
    models, names = LAUNCHES[framework]
    proc = course_lib_cli("frameworks", "--framework", framework, "--model", ",".join(models),
                          "--with", ",".join(names), "--out", out)
    return FrameworksReport.load(out), proc


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    return _launch(tmp_path_factory, "hf")


@pytest.fixture(scope="module")
def trl_configured(tmp_path_factory):
    return _launch(tmp_path_factory, "trl")


def _report(framework, request):
    return request.getfixturevalue({"hf": "configured", "trl": "trl_configured"}[framework])


@pytest.mark.parametrize("framework", list(LAUNCHES))
def test_every_configuration_is_a_row_for_each_model_and_flag(framework, request):
    from course_lib.frameworks import adapter, options

    report, proc = _report(framework, request)
    models, names = LAUNCHES[framework]
    assert set(names) <= set(options.NAMES)
    want = {(framework, model, name, repr(state), repr(variant))
            for model in models for name in names
            for state in options.OPTIONS[name].states
            for variant in adapter(framework).variants}
    got = set()
    for r in report.rows:
        (name, state), = r.uses.items()
        top = options.OPTIONS[name].flags(state)
        variant = {k: v for k, v in r.flags.items() if k not in top}
        got.add((r.framework, r.model, name, repr(state), repr(variant)))
        assert all(r.flags.get(k) == v for k, v in top.items())
        assert r.verdict in ROW_VERDICTS | {Verdict.FAILED}, (name, r.verdict, r.reason)
        if r.verdict in (Verdict.NOT_RUN, Verdict.FAILED):
            assert r.reason, f"{name}: {r.verdict} needs its reason"
    assert got == want and len(report.rows) == len(want), "none left out, none twice"
    # Not run or failed is never a pass: the command fails and says why.
    unmeasured = [r for r in report.rows if r.verdict in (Verdict.NOT_RUN, Verdict.FAILED)]
    assert (proc.returncode == 0) == (not unmeasured), proc.stderr


@pytest.mark.parametrize("framework", list(LAUNCHES))
def test_each_configuration_is_measured_against_the_same_model(framework, request):
    """Every rank compared, the formula named exactly, and the one the table
    predicts: a configuration changes what is trained only where a run shows it."""
    report, _ = _report(framework, request)
    measured = [r for r in report.rows if r.verdict not in (Verdict.NOT_RUN, Verdict.FAILED)]
    assert {next(iter(r.uses)) for r in measured} >= (
        {"lora", "gradient_checkpointing", "collator"} if framework == "hf" else TRL_DATA)
    for r in measured:
        where = (r.model, r.uses, r.flags)
        assert r.residual < TOLERANCE.of(r.precision), where
        assert [x.rank for x in r.ranks] == [0, 1] and r.verdict != Verdict.RANKS_DISAGREE
        assert r.matches == predicted(r), where


def test_lora_fsdp_and_checkpointing_are_what_the_row_says(configured):
    report, _ = configured
    for r in report.rows:
        name = next(iter(r.uses))
        said = " ".join(r.notes)
        if name == "lora":  # the adapter alone trains; the reference wraps the same
            trained, total = (int(w) for w in said.split("adapter's ")[1].split()[:3:2])
            assert 0 < trained < total / 4, said
        if name == "fsdp":  # sharded, or not run: plain DDP is never FSDP's pass
            assert ("sharded (DTensor)" in said if r.verdict != Verdict.NOT_RUN
                    else "no parameter was sharded" in r.reason), (said, r.reason)
        if name == "gradient_checkpointing" and r.verdict != Verdict.FAILED:
            assert "gradient checkpointing was on" in said, said
            asked = r.uses[name]["use_reentrant"]
            assert asked == "default" or f"use_reentrant={asked}" in said, said
        if name == "collator" and r.uses["collator"] == {"collator": "flattening"}:
            assert r.counts.R == 0, "packed: every sequence's first label is the separator"


def test_trl_trains_on_the_labels_its_own_preparation_built(trl_configured):
    """The reference is what TRL fed. completion_only and assistant_only on
    supervise fewer labels than off (the prompts', the users' masked), never a
    row's first; a padding-free row masks each sequence's first label; and
    each row says how TRL fed it, and the attention it ran."""
    report, _ = trl_configured
    rows = [r for r in report.rows if r.framework == "trl" and set(r.uses) & TRL_DATA]
    assert len(rows) == 1 * 2 * (2 + 2 + 4), "models x flag sets x states"
    assert all(r.verdict not in (Verdict.NOT_RUN, Verdict.FAILED) for r in rows), [
        (r.uses, r.reason) for r in rows if r.verdict in (Verdict.NOT_RUN, Verdict.FAILED)]

    def row(model, flags, uses):
        (found,) = [r for r in rows if (r.model, r.uses) == (model, uses)
                    and r.flags.get("bf16") == flags.get("bf16")]
        return found

    for model in LAUNCHES["trl"][0]:
        for flags in ({}, {"bf16": False}):
            for name, flag in (("completion_only", "completion_only_loss"),
                               ("assistant_only", "assistant_only_loss")):
                on, off = (row(model, flags, {name: {flag: v}}) for v in (True, False))
                assert on.counts.N < off.counts.N and on.counts.R == 0 < off.counts.R, name
    for r in rows:
        said = " ".join(r.notes)
        assert "TRL fed rank 0 2 microbatches" in said, said
        if "packing" in r.uses:
            assert "attention: " in said, said
            padding_free = r.uses["packing"].get("packing_strategy") != "wrapped"
            assert (r.counts.R == 0) == padding_free, (r.uses, r.counts)
            assert ("padding-free" in said) == padding_free, said
            assert padding_free or "attend to each other" in said, said


def test_a_configuration_that_cannot_run_here_says_why(configured):
    report, _ = configured
    for name, package in (("deepspeed", "deepspeed"), ("liger", "liger-kernel")):
        rows = [r for r in report.rows if name in r.uses]
        if installed(package) is None:
            assert rows and all(r.verdict == Verdict.NOT_RUN and package in r.reason
                                for r in rows), [(r.verdict, r.reason) for r in rows]


def test_a_framework_that_is_not_installed_is_not_run(tmp_path, monkeypatch):
    from course_lib import cli, frameworks

    real = frameworks.installed
    monkeypatch.setattr(frameworks, "installed",
                        lambda p: None if p == "lightning" else real(p))
    assert installed("lightning") is not None
    code = cli.main(["frameworks", "--framework", "lightning", "--model", "gpt2",
                     "--out", str(tmp_path)])
    assert code == 1
    (row,) = FrameworksReport.load(tmp_path).rows
    assert row.verdict == Verdict.NOT_RUN and "pip install lightning" in row.reason


def test_unsloth_runs_alone_and_says_how_to_install_it(tmp_path):
    """Unsloth patches transformers and TRL for its whole process: mixed with
    another framework it is refused; not installed, it is not run."""
    proc = course_lib_cli("frameworks", "--framework", "hf,unsloth", "--out", tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "alone" in proc.stderr
    if installed("unsloth") is None:
        proc = course_lib_cli("frameworks", "--framework", "unsloth", "--model", "llama",
                              "--out", tmp_path)
        assert proc.returncode == 1, proc.stderr
        rows = FrameworksReport.load(tmp_path).rows
        assert rows and all(r.verdict == Verdict.NOT_RUN and "pip install unsloth" in r.reason
                            for r in rows)


LEARNER = '''
from transformers import Trainer, TrainingArguments, default_data_collator


def make_trainer(model, train_dataset):
    """As a learner configures it: clipping off, 2 rows x 4 microbatches."""
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                             gradient_accumulation_steps=4, max_steps=50,
                             use_cpu=True, ddp_backend="gloo", report_to=[],
                             save_strategy="no", max_grad_norm=0.0)
    return Trainer(model=model, args=args, train_dataset=train_dataset,
                   data_collator=default_data_collator)


class MeanLoss(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        return (out.loss, out) if return_outputs else out.loss


def make_mean_trainer(model, train_dataset):
    base = make_trainer(model, train_dataset)
    return MeanLoss(model=model, args=base.args, train_dataset=train_dataset,
                    data_collator=default_data_collator)


def no_trainer(model, train_dataset):
    return {"not": "a trainer"}


class Crashes(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        raise RuntimeError("no loss in this configuration")


def make_crashing_trainer(model, train_dataset):
    base = make_trainer(model, train_dataset)
    return Crashes(model=model, args=base.args, train_dataset=train_dataset,
                   data_collator=default_data_collator)


def rank1_fails(model, train_dataset):
    import os
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 has no data")
    return make_trainer(model, train_dataset)
'''


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    home = tmp_path_factory.mktemp("learner")
    (home / "my_trainer.py").write_text(LEARNER)
    return home


def test_a_learners_trainer_is_audited_as_they_configured_it(learner):
    ok = course_lib_cli("audit", "--trainer", learner / "my_trainer.py:make_trainer",
                        "--out", learner / "runs", cwd=learner)
    assert ok.returncode == 0, ok.stderr
    # its output_dir="out" lands in the audit's scratch space, not where it ran
    assert not (learner / "out").exists()
    (row,) = FrameworksReport.load(learner / "runs", "audit-trainer-make_trainer").rows
    assert (row.verdict, row.matches, row.model) == ("exact", "token mean", "llama")
    assert sum(sum(n) for n in [row.counts.N_r]) == row.counts.N
    mean = course_lib_cli("audit", "--trainer", learner / "my_trainer.py:make_mean_trainer",
                          "--model", "gpt2", "--out", learner / "runs")
    assert mean.returncode == 1, mean.stderr
    (row,) = FrameworksReport.load(learner / "runs", "audit-trainer-make_mean_trainer").rows
    # A compute_loss of the classic kind returns the microbatch's mean, and
    # the Trainer (which computed num_items_in_batch) divides by nothing:
    # the gradient is M times a mean of microbatch means (#35438).
    assert (row.verdict, row.matches) == ("biased", "mean of microbatch means without 1/M")


def test_a_planted_wrong_configuration_fails_with_lora(learner):
    """LoRA does not hide a loss of the wrong kind: the mean trainer wrapped
    in an adapter is still M times a mean of microbatch means, on the adapter."""
    proc = course_lib_cli("audit", "--trainer", learner / "my_trainer.py:make_mean_trainer",
                          "--with", "lora", "--out", learner / "lora")
    assert proc.returncode == 1, proc.stderr
    (row,) = FrameworksReport.load(learner / "lora", "audit-trainer-make_mean_trainer").rows
    assert row.uses == {"lora": {"r": 4, "alpha": 8}} and "adapter" in " ".join(row.notes)
    assert (row.verdict, row.matches) == ("biased", "mean of microbatch means without 1/M")
    assert "--with lora: biased" in proc.stderr


def test_a_configuration_that_raises_on_every_rank_is_a_failed_row(learner,
                                                                    no_worker_left_behind):
    proc = course_lib_cli("audit", "--trainer",
                          learner / "my_trainer.py:make_crashing_trainer",
                          "--out", learner / "crash", "--timeout", 120)
    assert proc.returncode == 1, proc.stderr
    (row,) = FrameworksReport.load(learner / "crash",
                                   "audit-trainer-make_crashing_trainer").rows
    assert row.verdict == Verdict.FAILED and "no loss in this configuration" in row.reason


@pytest.mark.parametrize("spec, says", [
    ("my_trainer.py:no_trainer", "returned dict, not a transformers.Trainer"),
    ("my_trainer.py:missing", "has no function 'missing'"),
    ("nowhere.py:make_trainer", "no such file"),
])
def test_a_bad_trainer_spec_is_one_line_and_exit_2(learner, spec, says):
    proc = course_lib_cli("audit", "--trainer", learner / spec, "--out", learner / "bad")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr


def test_a_trainer_that_fails_on_one_rank_is_named(learner, no_worker_left_behind):
    proc = course_lib_cli("audit", "--trainer", learner / "my_trainer.py:rank1_fails",
                          "--out", learner / "one", "--timeout", 120)
    assert proc.returncode == 1, proc.stderr
    first = [x for x in proc.stderr.splitlines() if x.startswith("course-lib:")][0]
    assert first.startswith("course-lib: job failed: rank 1 failed in frameworks"), first
    assert "rank 1 has no data" in first
