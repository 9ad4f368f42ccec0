import json
import shutil

import pytest

from course_lib.core import data
from course_lib.core.data import corpus as corpus_mod
from tests.conftest import ROOT, course_lib_cli


def test_committed_corpus_matches_its_lock_and_regenerates(cfg, data_dir):
    corpus, status = data.prepare(cfg, data_dir)
    assert status == "verified"
    assert data.generate_corpus(cfg).lock == corpus.lock
    assert {k: len(v) for k, v in corpus.splits.items()} == {
        "train": 1024, "validation": 128, "test": 256}
    assert all(16 <= len(s) <= 128 for s in corpus.sequences)


def test_entropy_floor_is_the_source_conditional_entropy(corpus):
    floor = corpus.entropy_floor
    assert 0 < floor < __import__("math").log(corpus.source.vocab_size)
    pi, rows = corpus.source.stationary, corpus.source.transitions
    assert sum(pi) == pytest.approx(1.0)
    for j in range(len(pi)):  # stationary: pi P = pi
        assert sum(pi[i] * rows[i][j] for i in range(len(pi))) == pytest.approx(pi[j])


def test_prepare_exits_1_when_the_committed_corpus_was_edited(cfg, tmp_path):
    shutil.copytree(ROOT / "data", tmp_path / "data")
    data_path, lock_path = data.corpus_paths(cfg, tmp_path / "data")
    doc = json.loads(data_path.read_text())
    doc["sequences"][0][0] = (doc["sequences"][0][0] + 1) % 32
    data_path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))
    with pytest.raises(data.DataLockError, match="does not match its lock"):
        data.load_corpus(cfg, tmp_path / "data")
    proc = course_lib_cli("prepare", "--data-dir", tmp_path / "data", "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "lock" in proc.stderr
    # A consistent edit (data + lock) is still caught: regeneration differs.
    lock = json.loads(lock_path.read_text())
    lock["sha256"] = corpus_mod._sha256(data_path.read_bytes())
    lock_path.write_text(json.dumps(lock))
    with pytest.raises(data.DataLockError, match="differs from the committed"):
        data.prepare(cfg, tmp_path / "data")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_plan_invariants(cfg, corpus, world):
    plan = data.make_plan(cfg.with_world_size(world), corpus, world)
    bands = data.rank_bands(cfg, world)
    t = cfg.train
    assert len(plan) == t.updates
    for window in plan:
        assert len(window) == world
        seen = set()
        for rank, micros in enumerate(window):
            assert len(micros) == t.accumulation
            ids = [i for micro in micros for i in micro]
            assert len(ids) == t.accumulation * t.batch_size_per_rank
            assert len(set(ids)) == len(ids), "an id repeats inside a window"
            assert not seen & set(ids), "two ranks share an id"
            seen |= set(ids)
            lo, hi = bands[rank]
            assert all(lo <= len(corpus.sequences[i]) <= hi for i in ids)
            assert all(i in corpus.splits["train"] for i in ids)


def test_bands_w2_is_the_seed_split_and_others_tile_the_range(cfg):
    assert data.rank_bands(cfg, 2) == [(16, 64), (65, 128)]
    for world in (1, 3, 4, 8):
        bands = data.rank_bands(cfg, world)
        assert bands[0][0] == 16 and bands[-1][1] == 128
        assert all(b[1] + 1 == c[0] for b, c in zip(bands, bands[1:]))


def test_same_seed_same_plan_other_seed_other_plan(cfg, corpus):
    import dataclasses

    assert data.make_plan(cfg, corpus, 2) == data.make_plan(cfg, corpus, 2)
    other = dataclasses.replace(cfg, seed=cfg.seed + 1)
    assert data.make_plan(other, corpus, 2) != data.make_plan(cfg, corpus, 2)


def test_sampler_state_resumes_and_reseeding_replays(cfg, corpus):
    a = data.make_sampler(cfg, corpus, 2)
    for _ in range(50):
        a.next_window()
    state = json.loads(json.dumps(a.state_dict()))  # survives JSON
    b = data.make_sampler(cfg, corpus, 2)
    b.load_state_dict(state)
    assert b.position == 50
    assert b.next_window() == a.next_window()
    fresh = data.make_sampler(cfg, corpus, 2)
    assert fresh.next_window() == a.history[0] != a.history[50]


def test_padding_is_never_counted(corpus):
    ids = [0, 1, 2]
    inputs, labels = data.collate(corpus, ids)
    lengths = [len(corpus.sequences[i]) for i in ids]
    assert inputs.shape == (3, max(lengths) - 1)
    assert int((labels != data.IGNORE_INDEX).sum()) == sum(n - 1 for n in lengths)
    assert int((inputs == corpus.pad_id).sum()) == sum(max(lengths) - n for n in lengths)
    _, none = data.collate(corpus, ids, supervised=False)
    assert int((none != data.IGNORE_INDEX).sum()) == 0


def test_pool_too_small_is_a_clear_error(corpus):
    with pytest.raises(ValueError, match="rank 1's pool holds 2"):
        data.WindowSampler([list(range(50)), [1, 2]], 2, 4, seed=0)
