"""The frameworks audit's pieces that need no framework: the skewed window,
its counts, and the candidate formulas."""

import os
import re

import pytest
import torch

from course_lib.frameworks import candidates, window
from course_lib.frameworks.window import WindowShape

SHAPE = WindowShape(world_size=2, microbatches=2, batch_size=3, length=24)


def combine(candidate, counts, grads):
    """The candidate's gradient itself: sum_{r,m} c(r, m) g_{r,m}."""
    total = torch.zeros_like(grads[0][0], dtype=torch.float64)
    for r, row in enumerate(grads):
        for m, g in enumerate(row):
            total += candidate.coefficient(counts, r, m) * g.double()
    return total


def best_match(g, counts, grads):
    """The nearest candidate, from the vectors themselves."""
    found = [candidates.Match(c.name, float((g - combine(c, counts, grads)).norm()
                                             / combine(c, counts, grads).norm()))
             for c in candidates.CANDIDATES]
    return min(found, key=lambda m: m.residual)


def judged(g, counts, grads):
    """What the audit names, from inner products only."""
    return candidates.Against.of(candidates.Gram.of(counts, grads), g, grads).best()


@pytest.fixture(scope="module")
def built(corpus):
    return window.build(SHAPE, corpus.source)


def test_the_window_is_skewed_padded_and_partly_masked(built, corpus):
    c = window.counts(built)
    assert len(built) == 2 and all(len(rank) == 2 for rank in built)
    assert c.N_r[0] < c.N_r[1], "short sequences on rank 0"
    assert 0 < c.R < 2 * 2 * 3, "some rows mask their first labels, others do not"
    assert sum(c.N_r) == c.N and sum(map(sum, c.n_before_shift)) == c.N + c.R
    for rank in built:
        for mb in rank:
            assert mb.input_ids.shape == (3, 24)
            pad = mb.input_ids == window.PAD
            assert bool((mb.labels[pad] == -100).all()), "padding is never a token"
            assert bool(((mb.attention_mask == 0) == pad).all())
            assert int(mb.input_ids.max()) < window.vocab_size(corpus.source)
    assert window.build(SHAPE, corpus.source)[1][1].input_ids.equal(built[1][1].input_ids)


def _grads(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(50, generator=g, dtype=torch.float64) for _ in range(2)]
            for _ in range(2)]


@pytest.mark.parametrize("name", [c.name for c in candidates.CANDIDATES])
def test_each_candidate_is_recognised_as_itself(built, name):
    counts = window.counts(built)
    grads = _grads()
    cand = next(c for c in candidates.CANDIDATES if c.name == name)
    g = combine(cand, counts, grads)
    found = best_match(g, counts, grads)
    assert found.name == name and found.residual < 1e-12
    assert judged(g, counts, grads).name == name, "the audit names it from inner products"


def test_a_gradient_that_no_formula_gives_matches_nothing_closely(built):
    counts = window.counts(built)
    found = judged(torch.randn(50, dtype=torch.float64), counts, _grads())
    assert found.residual > 0.1


def newest_measured(matrix, package):
    """The newest version of ``package`` that a measured matrix row ran on."""
    from packaging.version import Version

    found = [Version(r.stack[package]) for r in matrix.measured if package in r.stack]
    return max(found, default=None)


@pytest.mark.parametrize("package", ["transformers", "accelerate", "lightning", "trl"])
def test_the_matrix_covers_the_installed_framework(package):
    """A framework installed here that is newer than every measured row of the
    committed matrix: the course would teach from rows it has not checked."""
    import importlib.metadata

    from packaging.version import Version

    from course_lib.frameworks.evidence import Matrix

    installed = Version(importlib.metadata.version(package))
    newest = newest_measured(Matrix.committed(), package)
    assert newest is not None and installed <= newest, (
        f"{package} {installed} is installed, and the matrix's newest row ran on "
        f"{newest}: run `.venv/bin/python benchmarks/frameworks_matrix.py --add "
        f"{package}=={installed}` and commit data/frameworks-matrix.json")


def test_the_committed_matrix_agrees_with_the_table():
    """data/frameworks-matrix.json (benchmarks/frameworks_matrix.py) against
    frameworks/expected.py: where a run and the reading disagree, the run
    wins and the table is fixed."""
    from packaging.version import Version

    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.evidence import Matrix
    from course_lib.jobs.frameworks import predicted

    doc = Matrix.committed()
    assert doc.date and doc.torch and doc.command.startswith("python benchmarks/")
    measured = doc.measured
    assert len({r.version for r in measured if r.framework == "hf"}) >= 7
    for r in measured:
        want = predicted(r)
        # transformers 4.46.2 inverted no_sync (#34645): the reading names no
        # formula there, only that the ranks disagree.
        verdict = (Verdict.RANKS_DISAGREE if r.framework == "hf" and Version("4.46.2")
                   <= Version(r.version or "0") < Version("4.46.3") else None)
        where = f"{r.entry} {r.model} {r.flags}"
        assert want is None or r.matches == want, f"{where}: {r.matches} != {want}"
        assert verdict is None or r.verdict == verdict, f"{where}: {r.verdict}"
        assert r.stack.get("torch"), f"{where}: the row names its torch"
    assert any(r.verdict == Verdict.RANKS_DISAGREE for r in measured
               if r.version == "4.46.2"), "the matrix holds the version the rule is about"
    for name, entry in doc.entries.items():
        assert entry.status in ("measured", "not run")
        assert entry.status == "measured" or entry.reason, f"{name}: no reason"


@pytest.mark.parametrize("name", [c.name for c in candidates.CANDIDATES])
def test_inner_products_judge_as_the_gradients_do(built, name):
    """The audit judges from <g, g_i> and <g_i, g_j> alone (GPT-2 small has
    124M components): the same residuals and scales as the vectors give."""
    counts, grads = window.counts(built), _grads(1)
    cand = next(c for c in candidates.CANDIDATES if c.name == name)
    g = 0.9 * combine(cand, counts, grads) + 1e-3 * _grads(2)[0][0]
    seen = candidates.Against.of(candidates.Gram.of(counts, grads), g, grads)
    for other in candidates.CANDIDATES:
        ref = combine(other, counts, grads)
        scale = float(g @ ref) / float(ref @ ref)
        assert seen.scale(other) == pytest.approx(scale, rel=1e-9)
        assert seen.residual(other) == pytest.approx(
            float((g - ref).norm() / ref.norm()), rel=1e-6)
        assert seen.measured(other, 1e-5).residual == pytest.approx(
            float((g - scale * ref).norm() / (abs(scale) * ref.norm())), rel=1e-6, abs=1e-9)
    best, direct = seen.best(), best_match(g, counts, grads)
    assert best.name == direct.name and best.residual == pytest.approx(direct.residual)


def test_one_configuration_leaves_the_environment_as_it_found_it(monkeypatch):
    """transformers 4.x's TrainingArguments(bf16=True) exports
    ACCELERATE_MIXED_PRECISION: without this, every later configuration in
    the job (TRL 0.19.1's bf16=False among them) trained in bf16."""
    from course_lib import frameworks

    monkeypatch.setenv("COURSE_KEPT", "1")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    with pytest.raises(RuntimeError), frameworks.isolated():
        os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16"
        del os.environ["COURSE_KEPT"]
        raise RuntimeError("a framework that fails still gives the environment back")
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ
    assert os.environ["COURSE_KEPT"] == "1"


def test_inner_products_in_blocks_are_the_dot_products():
    """candidates.pairs, a block of columns at a time, against torch.dot in
    float64: among one set of vectors, and across two."""
    torch.manual_seed(0)
    a = [torch.randn(2500) for _ in range(3)]
    b = [torch.randn(2500) for _ in range(2)]
    among = candidates.pairs(a, chunk=1000)
    across = candidates.pairs(a, b, chunk=700)
    for i, x in enumerate(a):
        for j, y in enumerate(a):
            assert among[i, j] == pytest.approx(float(x.double() @ y.double()), rel=1e-12)
        for j, y in enumerate(b):
            assert across[i, j] == pytest.approx(float(x.double() @ y.double()), rel=1e-12)
    assert across.shape == (3, 2) and torch.equal(among, among.T)


def test_every_counting_line_chapter_08_prints_is_in_the_installed_transformers():
    """Chapter 08 prints the installed Trainer's counting lines, found by their
    fragments: a version that moves one must not print 'not found'."""
    from course_lib.frameworks import source

    for wanted in source.TRANSFORMERS:
        line = source.find(wanted)
        assert line is not None or wanted.optional, f"{wanted.formula}: not found"
        if line is not None:
            assert any(f in "\n".join(line.code) for f in wanted.fragments), wanted
    shown = source.describe(source.installed())
    assert "not found in this version" not in shown


def test_every_logging_line_chapter_07_prints_is_in_the_installed_frameworks():
    """Chapter 07 prints the installed frameworks' logging lines, found by
    their fragments: a version that moves one must not print 'not found'."""
    from course_lib.frameworks import source

    shown = source.describe(*source.logging())
    assert "not found in this version" not in shown
    for _, _, wanted in source.LOGGING:
        for w in wanted:
            line = source.find(w)
            assert line is not None and any(f in "\n".join(line.code) for f in w.fragments), w


def test_every_grpo_line_chapter_09_prints_is_in_the_installed_trl():
    """Chapter 09 prints each loss_type's aggregation from the installed TRL,
    found by fragments below the branch's own test: none may be missing, and
    each branch's lines come from its own branch, in the function's order."""
    from course_lib.frameworks import source

    found = source.trl_grpo()
    assert list(found) == ["the token term", "grpo", "dr_grpo", "dapo"]
    assert "not found in this version" not in source.describe(*found.values())
    lines = {name: [int(ln.where.split(" ")[0].rpartition(":")[2]) for ln in s.lines]
             for name, s in found.items()}
    assert lines["grpo"] == sorted(lines["grpo"])
    assert max(lines["grpo"]) < min(lines["dr_grpo"]) < max(lines["dr_grpo"])
    assert max(lines["dr_grpo"]) < min(lines["dapo"][1:])


@pytest.mark.parametrize("model_type, targets", [
    ("llama", {"q_proj", "k_proj", "v_proj", "o_proj"}), ("gpt2", {"c_attn", "c_proj"})])
def test_lora_trains_both_factors_of_the_attention_projections_only(built, corpus,
                                                                    model_type, targets):
    """--with lora: init_lora_weights=False, so B is not zero and A has a
    gradient too; the MLP (GPT-2's mlp.c_proj) and the base weights stay frozen."""
    pytest.importorskip("peft")
    from course_lib.frameworks import models, options
    from course_lib.frameworks.reference import summed_loss

    base = models.build(model_type, window.vocab_size(corpus.source), 0)
    model = options.wrap({"lora": dict(options.LORA.states[0])}, base)
    summed_loss(model, built[0][0]).backward()
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert {n.split(".lora_")[0].rpartition(".")[2] for n in trained} == targets
    assert not any("mlp" in n for n in trained)
    for n, p in trained.items():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, f"{n}: no gradient"


def test_an_unknown_configuration_or_one_no_framework_takes_is_bad_input():
    from course_lib.frameworks import options

    assert options.parse("lora, collator", ["hf"]) == ["lora", "collator"]
    with pytest.raises(options.UnknownOption, match="unknown configuration 'nope'"):
        options.parse("nope", ["hf"])
    with pytest.raises(options.UnknownOption, match="applies to hf"):
        options.parse("collator", ["trl", "accelerate"])
    with pytest.raises(options.UnknownOption, match="completion_only: applies to trl"):
        options.parse("completion_only,packing", ["hf"])


# --- TRL's own data: --with completion_only, assistant_only, packing ------------------

# The launched tests' window (FrameworksJob's defaults): 2 ranks x 2 microbatches x 2 rows.
LAUNCHED = WindowShape(world_size=2, microbatches=2, batch_size=2, length=24)


@pytest.fixture(scope="module")
def launched(corpus):
    return window.build(LAUNCHED, corpus.source)


def _rows(win, row_of):
    """What an option hands TRL, as a list (its datasets' IterableDataset)."""
    from course_lib.frameworks import options

    dataset, collator = options._prepared_by_trl(win, row_of)
    assert collator is None, "TRL's own collator"
    return list(dataset)


def _unpadded(win):
    """The window's sequences in dispatch order: microbatch, then rank, then row."""
    return [mb.input_ids[row, : int(mb.attention_mask[row].sum())].tolist()
            for m in range(len(win[0])) for rank in win for mb in [rank[m]]
            for row in range(mb.input_ids.shape[0])]


@pytest.fixture(scope="module")
def tokenizer(corpus):
    pytest.importorskip("tokenizers")
    from course_lib.frameworks.tokenizer import word_level

    return word_level(window.vocab_size(corpus.source))


def test_the_tokenizer_reads_every_id_back_and_ends_with_pad(tokenizer, corpus):
    """TRL appends the EOS to a completion without a space: "<pad>" is
    matched as a special token; "10" is a word (with "0" special, it was 1, 0)."""
    assert tokenizer(text="3 10 20 32<pad>").input_ids == [3, 10, 20, 32, 0]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 0)
    assert len(tokenizer) == window.vocab_size(corpus.source), "no token beyond the model's"


def test_completion_only_rows_are_the_window_split_into_prompt_and_completion(
        launched, tokenizer):
    from course_lib.frameworks import options

    rows = _rows(launched, options._prompt_completion)
    prompts = []
    for row, ids in zip(rows, _unpadded(launched), strict=True):
        prompt = tokenizer(text=row["prompt"]).input_ids
        assert tokenizer(text=row["prompt"] + row["completion"]).input_ids == ids
        assert ids[: len(prompt)] == prompt and 1 <= len(prompt) <= len(ids) // 2
        prompts.append(len(prompt))
    assert len(set(prompts)) > 2, "the prompt's share moves from row to row"


def test_assistant_only_conversations_mark_the_assistants_turns(launched, tokenizer):
    """The tokenizer's own template: TRL keeps it (it has generation markers)
    and finds each assistant turn's end token inside them."""
    from trl import chat_template_utils as templates

    from course_lib.frameworks import options

    assert templates.has_generation_markers(tokenizer.chat_template)
    assert templates.is_chat_template_stop_token_trained(tokenizer)
    for row, ids in zip(_rows(launched, options._conversation), _unpadded(launched),
                        strict=True):
        turns = row["messages"]
        assert [t["role"] for t in turns] == ["user", "assistant"] * 2
        assert all(t["content"] for t in turns)
        out = tokenizer.apply_chat_template(turns, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        want, mask = [], []
        for t in turns:  # each assistant turn ends with <pad> (id 0), inside its mark
            said = tokenizer(text=t["content"]).input_ids
            mine = t["role"] == "assistant"
            want += said + [0] * mine
            mask += [int(mine)] * (len(said) + mine)
        assert [i for i in want if i] == ids
        assert (out["input_ids"], out["assistant_masks"]) == (want, mask)


def test_packing_states_are_every_strategy_of_the_installed_trl(launched):
    """Each packing_strategy SFTConfig offers, and padding_free (max_length
    unset: TRL refuses one it would not enforce); the rows TRL packs are the
    window's own ids and labels, and fill one step, one packed row a
    microbatch, without dealing a row twice."""
    from dataclasses import fields

    from trl import SFTConfig
    from trl.data_utils import pack_dataset

    from course_lib.frameworks import options

    offered = next(f for f in fields(SFTConfig) if f.name == "packing_strategy").metadata
    strategies = [state["packing_strategy"] for state in options.PACKING.states
                  if "packing_strategy" in state]
    assert strategies == list(offered["choices"])
    assert options.PACKING.flags({"padding_free": True}) == {"padding_free": True,
                                                             "max_length": None}
    rows = _rows(launched, options._labelled)
    assert [r["input_ids"] for r in rows] == _unpadded(launched)
    step = LAUNCHED.world_size * LAUNCHED.microbatches
    for strategy in strategies:
        flags = options.PACKING.flags({"packing_strategy": strategy})
        assert flags["packing"] and flags["per_device_train_batch_size"] == 1
        packed = list(pack_dataset(options._prepared_by_trl(launched, options._labelled)[0],
                                   flags["max_length"], strategy))
        assert len(packed) >= step, f"{strategy}: {len(packed)} packed rows"
        if strategy != "wrapped":
            assert max(len(p["seq_lengths"]) for p in packed[:step]) > 1, "rows hold two"


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_the_packing_note_says_whether_sequences_sharing_a_row_attend_to_each_other(
        corpus, model_type):
    """Measured on the model: the installed transformers masks by the
    position_ids; a model that attends to every earlier token is caught."""
    from course_lib.frameworks import models, options

    model = models.build(model_type, window.vocab_size(corpus.source), 0)
    assert options._isolated(model)
    (said,) = options._packed(model, {"packing_strategy": "bfd"})
    assert "attention: sdpa" in said and "attends to itself only" in said

    assert not options._isolated(Prefix())


class Prefix(torch.nn.Module):
    """A model whose every position sees the sum of all the tokens before it."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, input_ids, **kw):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.scale * input_ids.float().cumsum(1)[..., None])


def test_trl_says_what_it_fed(launched):
    from course_lib.frameworks.trl_sft import fed
    from course_lib.frameworks.window import Microbatch

    ids = torch.arange(1, 8)[None]
    packed = Microbatch(ids, torch.ones_like(ids), ids,
                        torch.tensor([[0, 1, 2, 0, 1, 2, 3]]))
    said = fed([packed, launched[0][0]], 0)
    assert "rank 0 2 microbatches, padding-free" in said and "sequences [2, 2]" in said
    said = fed(launched[1], 1)
    assert "rank 1 2 microbatches, padded rows" in said and "lengths [24, 24]" in said


# --- the committed configurations: data/frameworks-configurations.json -------------------
#
# `benchmarks/frameworks_matrix.py --configurations` measured every --with
# configuration on both model families and every flag set of its frameworks;
# the file is read here, nothing launches.

CONFIGURATION_MODELS = ("gpt2", "llama")


@pytest.fixture(scope="module")
def configured_doc():
    from course_lib.frameworks.evidence import Configurations

    return Configurations.committed()


def _option_of(row):
    """(option, its state, the framework's own flags: those it did not set)."""
    from course_lib.frameworks import options

    (name, state), = row.uses.items()
    top = options.OPTIONS[name].flags(state)
    assert all(row.flags.get(k) == v for k, v in top.items()), (name, row.flags)
    return name, state, {k: v for k, v in row.flags.items() if k not in top}


def test_the_committed_configurations_parse_with_the_matrix_rows(configured_doc):
    import json

    from course_lib.frameworks.evidence import Configurations, Matrix, MatrixRow

    raw = json.loads(Configurations.path().read_text())
    doc = configured_doc
    assert isinstance(doc, Matrix) and len(doc.rows) == len(raw["rows"]) > 0
    assert doc.date and doc.torch and doc.command.startswith(
        "python benchmarks/frameworks_matrix.py --configurations")
    assert set(doc.models) == set(CONFIGURATION_MODELS)
    for r in doc.rows:
        assert isinstance(r, MatrixRow) and r.entry in doc.entries, r.entry
        # each row names the versions it ran on
        assert {"torch", "transformers", "accelerate", "trl", "peft"} <= set(r.stack), r.stack
        assert r.version == r.stack[{"hf": "transformers", "trl": "trl"}[r.framework]]
    for name, entry in doc.entries.items():
        assert entry.status == "measured" or entry.reason, f"{name}: no reason"


def test_every_option_has_a_row_for_each_model_and_flag_state(configured_doc):
    """Each option, on each framework `course-lib frameworks` audits it on
    (the learner's own Trainer takes options only through `audit --trainer`),
    each model family, each of its states and each flag set: one row, measured
    or not run / failed with its reason."""
    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks import adapter, options

    want = set()
    for name, option in options.OPTIONS.items():
        audited = [f for f in option.frameworks if adapter(f).variants]
        assert audited, f"{name}: no framework of `course-lib frameworks` takes it"
        want |= {(f, model, name, repr(state), repr(variant)) for f in audited
                 for model in CONFIGURATION_MODELS for state in option.states
                 for variant in adapter(f).variants}
    got = []
    for r in configured_doc.rows:
        name, state, variant = _option_of(r)
        got.append((r.framework, r.model, name, repr(state), repr(variant)))
        if r.verdict in (Verdict.NOT_RUN, Verdict.FAILED):
            assert r.reason, f"{name} {r.model}: {r.verdict} needs its reason"
    assert set(got) == want and len(got) == len(want), "none left out, none twice"


@pytest.mark.parametrize("package", ["transformers", "trl", "accelerate", "peft"])
def test_the_configurations_cover_the_installed_versions(configured_doc, package):
    """A package installed here newer than the one the configurations ran on:
    the table would be older than what a learner runs."""
    import importlib.metadata

    from packaging.version import Version

    installed = Version(importlib.metadata.version(package))
    ran = {Version(r.stack[package]) for r in configured_doc.rows}
    assert ran and installed <= max(ran), (
        f"{package} {installed} is installed, the configurations ran on {sorted(ran)}: run "
        "`.venv/bin/python benchmarks/frameworks_matrix.py --configurations`")


def test_each_measured_configuration_is_the_formula_the_table_predicts(configured_doc):
    from course_lib.core.verdicts import TOLERANCE
    from course_lib.frameworks.evidence import UNMEASURED
    from course_lib.jobs.frameworks import predicted

    measured = [r for r in configured_doc.rows if r.verdict not in UNMEASURED]
    assert {_option_of(r)[0] for r in measured} >= {
        "lora", "gradient_checkpointing", "collator", "completion_only", "assistant_only",
        "packing"}
    for r in measured:
        where = (r.framework, r.model, r.uses, r.flags)
        assert r.residual < TOLERANCE.of(r.precision), where
        assert [x.rank for x in r.ranks] == [0, 1], where
        assert r.matches == predicted(r), where


def _line_of(lines, row):
    from course_lib.frameworks.evidence import _state_of

    configuration, state = _state_of(row)
    (line,) = [x for x in lines if (x.framework, x.configuration, x.state) ==
               (row.framework, configuration, state) and row.model in x.models.split(", ")]
    return line


def test_the_face_shows_every_row_committed_or_live(configured_doc):
    """`describe_configurations()`: a line per framework, option, state and
    flag set, each row's model in one line; a row measured here stands in for
    the committed one and is marked live."""
    import dataclasses

    import course_lib
    from course_lib.core.verdicts import Verdict

    text = course_lib.describe_configurations()
    lines = configured_doc.lines()
    assert len(text.splitlines()) == 3 + 1 + len(lines)
    for r in configured_doc.rows:
        line = _line_of(lines, r)
        assert line.measured == f"committed {r.version}"
        assert " ".join(line.cells[:4]) in " ".join(text.split()), line
    row = next(r for r in configured_doc.rows if r.verdict == Verdict.EXACT)
    live = dataclasses.replace(row, version="9.9.9", stack={**row.stack, "trl": "9.9.9"})
    text = course_lib.describe_configurations([live])
    mixed = configured_doc.lines([live])
    assert _line_of(mixed, live).measured == "live 9.9.9"
    assert sum(x.measured.startswith("live") for x in mixed) == 1
    assert "live: 1 rows" in text and "live 9.9.9" in text
    assert len(course_lib.describe_configurations(framework="trl").splitlines()) < len(
        text.splitlines())


def test_a_row_not_run_never_shows_as_a_pass(configured_doc):
    """Not run or failed: the verdict says so and the finding is the reason,
    never a formula, committed or live (a live row that failed replaces a
    committed pass)."""
    import dataclasses

    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.evidence import UNMEASURED

    formulas = {c.name for c in candidates.CANDIDATES}
    exact = next(r for r in configured_doc.rows if r.verdict == Verdict.EXACT)
    refused = dataclasses.replace(exact, verdict=Verdict.NOT_RUN, reason="refused here",
                                  matches=None, residual=None, relative_error=None)
    lines = configured_doc.lines([refused])
    rows = [r for r in configured_doc.rows if r.verdict in UNMEASURED and r != exact]
    assert rows, "the committed file holds a configuration that cannot run here"
    for r in [*rows, refused]:
        line = _line_of(lines, r)
        assert line.verdict == str(r.verdict) and line.finding == r.reason, line
        assert line.finding not in formulas and "exact" not in line.verdict
    assert _line_of(lines, refused).measured.startswith("live")


def test_the_site_page_is_the_faces_table(configured_doc):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "site" / "generate.py"
    spec = importlib.util.spec_from_file_location("course_site_generate", path)
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    page = generate.configurations_table()
    assert "frameworks-configurations.md" in generate.PAGES
    body = [x for x in page.splitlines() if x.startswith("| ")][1:]
    assert body == ["| " + " | ".join(generate.cell(c) for c in line.cells) + " |"
                    for line in configured_doc.lines()]


def test_the_grouped_view_says_same_only_where_every_row_trains_what_the_plain_one_does(
        configured_doc):
    """Chapter 08's grouped table: a configuration is one "same as" line only
    while each of its rows says what the plain framework's row says; one live
    row that says otherwise puts it back in detail."""
    import dataclasses

    import course_lib
    from course_lib.core.verdicts import Verdict

    text = course_lib.describe_configurations(framework="hf", grouped=True)
    same = {line.split()[0] for line in text.splitlines() if "same as the plain" in line}
    assert same == {"lora", "gradient_checkpointing", "compile"}, text
    assert "not run" in text and max(map(len, text.splitlines())) < 140
    row = next(r for r in configured_doc.rows
               if r.framework == "hf" and "lora" in r.uses and r.verdict == Verdict.EXACT)
    odd = dataclasses.replace(row, verdict=Verdict.BIASED)
    text = course_lib.describe_configurations([odd], framework="hf", grouped=True)
    same = {line.split()[0] for line in text.splitlines() if "same as the plain" in line}
    assert "lora" not in same and "biased" in text


# --- what chapters 08 and 09 print, in the learner's edition (issue 30) -------------------

FRAMEWORKS_EN = """\
Frameworks, audited: 2 ranks, gloo on cpu; the gradient of the first optimizer step vs the \
token mean
  framework   version   model   flags                                verdict           matches
  hf          5.25.0    llama   average_tokens_across_devices=True   exact             token \
mean
  hf          5.25.0    gpt2    average_tokens_across_devices=True   scaled x0.956     counted \
before the shift
  hf          5.25.0    gpt2    average_tokens_across_devices=False  biased            mean of \
rank means counted before the shift (nearest; residual 2.1e-02)
    note: max_grad_norm=1.0: the learner's clipping
  accelerate  -         llama   -                                    not run           \
accelerate is not installed"""


def _frameworks_report():
    """Chapter 08's live table, and one row not run: the kinds of rows it prints."""
    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.evidence import FrameworkRow
    from course_lib.jobs.frameworks import FrameworksReport

    flag = "average_tokens_across_devices"
    rows = [
        FrameworkRow("hf", "5.25.0", "llama", {flag: True}, Verdict.EXACT,
                     matches="token mean"),
        FrameworkRow("hf", "5.25.0", "gpt2", {flag: True}, Verdict.SCALED, factor=87 / 91,
                     matches="counted before the shift"),
        FrameworkRow("hf", "5.25.0", "gpt2", {flag: False}, Verdict.BIASED, residual=0.0213,
                     matches="mean of rank means counted before the shift",
                     notes=["max_grad_norm=1.0: the learner's clipping"]),
        FrameworkRow("accelerate", None, "llama", {}, Verdict.NOT_RUN,
                     reason="accelerate is not installed")]
    return FrameworksReport(world_size=2, backend="gloo", device="cpu", dtype="float32",
                            nccl_reference_path=False, torch="2.x", window={}, rows=rows)


def test_the_frameworks_table_speaks_the_edition(monkeypatch):
    """describe_frameworks: English byte for byte; in French its frame, columns,
    verdicts (the scale's factor with French marks) and formula names, the
    flags, reasons and notes as the report has them, every column aligned."""
    from course_lib.core import edition
    from course_lib.jobs.frameworks import describe

    report = _frameworks_report()
    monkeypatch.delenv(edition.ENV, raising=False)
    assert describe(report) == FRAMEWORKS_EN
    assert report.rows[1].said == "scaled x0.956"
    monkeypatch.setenv(edition.ENV, "fr")
    french = describe(report).splitlines()
    assert french[0].startswith("Frameworks audités\u00a0: 2 rangs, gloo sur CPU\u202f; ")
    assert french[1].split() == ["framework", "version", "modèle", "options", "verdict",
                                 "formule"]
    assert report.rows[1].said == "échelle ×0,956"
    assert re.search("échelle ×0,956 +comptée avant le décalage", french[3]), french[3]
    assert "biaisé" in french[4] and "(la plus proche\u202f; résidu 2,1e-02)" in french[4]
    assert french[5] == "    note\u00a0: max_grad_norm=1.0: the learner's clipping"
    assert "non exécuté" in french[6] and french[6].endswith("accelerate is not installed")
    column = french[1].index("formule")  # the formulas and reasons start under their header
    assert all(line[column - 1] == " " != line[column] for line in french[2:5] + french[6:])
    assert not [line for line in french if re.search(
        r"\b(audited|ranks|model|flags|matches|scaled|biased|not run|token mean|nearest)\b",
        line)]


def test_the_grouped_configurations_speak_the_edition(monkeypatch):
    """Chapter 08's grouped table of configurations: the same lines, in French
    the frame, "same as the plain Trainer", the verdicts and the formula
    names; the configurations, states and reasons as the data has them."""
    import course_lib
    from course_lib.core import edition

    monkeypatch.delenv(edition.ENV, raising=False)
    english = course_lib.describe_configurations(framework="hf", grouped=True).splitlines()
    assert english[0].startswith("The --with configurations on the skewed window (")
    monkeypatch.setenv(edition.ENV, "fr")
    french = course_lib.describe_configurations(framework="hf", grouped=True).splitlines()
    assert len(french) == len(english)
    assert french[0].startswith("Les configurations --with sur la fenêtre déséquilibrée (")
    assert french[1].startswith("face aux lignes du framework de base\u00a0: 2 modèles (")
    for en, fr in zip(english[2:], french[2:], strict=True):
        assert en.split()[0] == fr.split()[0]  # the configuration, or the flag state
        assert ("same as the plain Trainer" in en) == ("comme le Trainer de base" in fr), fr
        assert ("not run" in en) == ("non exécuté" in fr), fr
        assert ("scaled x" in en) == ("échelle ×" in fr), fr
        assert ("biased" in en) == ("biaisé" in fr), fr
    same = [fr for fr in french if "comme le Trainer de base" in fr]
    assert same and all(fr.endswith("sur les deux modèles et les deux valeurs de l'option")
                        for fr in same)
    detail = [fr for fr in french if fr.startswith("    ")]  # verdict, then formula
    assert detail and len({re.search(r"(exact|biaisé|échelle ×\S+) +\S", fr).end()
                           for fr in detail}) == 1
    assert not [fr for fr in french if re.search(r"\b(same as|models|flag settings|token "
                                                 r"mean|biased|scaled)\b", fr)]
    flat = course_lib.describe_configurations(framework="hf").splitlines()  # every line
    assert flat[0].startswith("Les configurations (--with), chacune sur la fenêtre ")
    assert flat[3].split()[:4] == ["framework", "configuration", "état", "des"]
    assert all(re.search(r"  versionné \S+  ", line) for line in flat[4:]), flat


QUOTED_EN = """\
accelerate's guide, "Gradient accumulation on training samples of variable size" (PR #3193), \
at commit 16cb6eb (2026-07-24)
  N_r' = Σ n'       docs/source/usage_guides/gradient_accumulation.md:280
                      num_items_in_batch = sum([(batch["labels"].ne(-100)).sum() for batch \
in batch_samples])
  N' = Σ_r N_r'     docs/source/usage_guides/gradient_accumulation.md:282
                      num_items_in_batch = accelerator.gather(num_items_in_batch).sum().item()
  M·W·S / N'        docs/source/usage_guides/gradient_accumulation.md:301
                      loss = (loss * gradient_accumulation_steps * accelerator.num_processes) \
/ num_items_in_batch
torchtitan #2206, "Fix loss computation by handling valid token imbalance in train loop", \
commit 0cb7435 (2026-01-25)
  S (a sum)         torchtitan/components/loss.py:25
                      reduction="sum",
  N_r               torchtitan/train.py:565
                      local_valid_tokens += (labels != IGNORE_INDEX).sum()
  N = Σ_r N_r       torchtitan/train.py:573
                      global_valid_tokens = dist_utils.dist_sum(local_valid_tokens, batch_mesh)
  S / N (no × W)    torchtitan/train.py:538
                      loss = loss_sum / global_valid_tokens
  FSDP: Σ over r    torchtitan/models/llama3/infra/parallelize.py:284
                      module.set_gradient_divide_factor(1.0)
  DDP: mean over r  torchtitan/models/llama3/infra/parallelize.py:374
                      replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)"""


def test_the_real_code_speaks_the_edition(monkeypatch):
    """real_code.describe: English byte for byte; in French the titles and the
    labels, the label column as wide as the French labels, while the lines
    keep their labels (chapter 08 picks its lines by them) and their code."""
    from course_lib.core import edition
    from course_lib.frameworks import source

    missing = source.Source("t", (source.Line("S (a sum)", source.NOT_FOUND, ("'x'",)),))
    monkeypatch.delenv(edition.ENV, raising=False)
    assert source.describe(*source.QUOTED) == QUOTED_EN
    assert source.describe(missing).splitlines()[1] == "  S (a sum)         " + source.NOT_FOUND
    assert source.installed().title.endswith(", installed here")
    monkeypatch.setenv(edition.ENV, "fr")
    french = source.describe(*source.QUOTED).splitlines()
    assert french[0].startswith("le guide d'accelerate, «\u00a0Gradient accumulation on ")
    assert french[7].startswith("torchtitan #2206, «\u00a0Fix loss computation")
    assert french[8].startswith("  S (une somme)        torchtitan/components/loss.py:25")
    assert french[-2].startswith("  DDP\u00a0: moyenne sur r  torchtitan/")  # the widest
    code = [line.strip() for line in french if line.startswith(" " * 20)]
    assert code == [c for s in source.QUOTED for line in s.lines for c in line.code]
    assert [line.formula for line in source.QUOTED[1].lines][0] == "S (a sum)"
    assert source.describe(missing).splitlines()[1].endswith("absente de cette version")
    installed = source.installed()
    assert installed.title.endswith(", installé ici")
    assert "× W : W·S / N".replace(" :", "\u00a0:") in source.describe(installed)
    assert {line.formula for line in installed.lines} <= {
        w.formula for w in source.TRANSFORMERS}


def test_the_trainers_loss_condition_is_read_or_said_missing(monkeypatch):
    """07 prints the installed `if` above compute_loss's loss_scale lines; a
    release without those lines gets the "not found" line, not a traceback."""
    from course_lib.frameworks import source

    shown = source.trainer_loss_condition()
    assert shown.startswith("if") and "average_tokens_across_devices" in shown
    assert "#" not in shown  # its comments cut

    def compute_loss(self, model, inputs):  # a release that scales elsewhere
        if inputs:
            return model(**inputs)
        return None

    monkeypatch.setattr(source, "_resolve", lambda name: (compute_loss, name))
    assert source.trainer_loss_condition() == source.NOT_FOUND
