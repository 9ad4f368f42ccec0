import dataclasses
import json

import pytest
import torch

from course_lib.core import checkpoint as ck
from course_lib.core import data
from course_lib.core.model import build_model


@pytest.fixture()
def saved(tmp_path, cfg, corpus):
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = data.make_sampler(cfg, corpus, 2)
    sampler.next_window()
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()  # momentum buffers now exist
    kw = dict(model=model, optimizer=opt, sampler=sampler, cfg=cfg.with_world_size(1),
              data_lock=corpus.lock, rank=0, world_size=1, device=torch.device("cpu"))
    path = ck.save(tmp_path, 7, **kw)
    return path, kw


def test_save_writes_every_piece_and_a_manifest(saved, cfg, corpus):
    path, kw = saved
    assert path.name == "step-0007"
    names = {p.name for p in path.iterdir()}
    assert names == {"model.pt", "optimizer.pt", "trainer.json", "rank-00.pt",
                     "manifest.json"}
    trainer = ck.verify(path, cfg=kw["cfg"], data_lock=corpus.lock, world_size=1)
    assert trainer["step"] == 7 and trainer["sampler"]["position"] == 1
    own = torch.load(path / "rank-00.pt", weights_only=True)
    assert own["rank"] == 0 and set(own["rng"]) >= {"python", "torch"}
    assert not list(path.parent.glob("*.tmp")), "no temp folder left"


def test_trainer_json_reads_back_typed(saved, corpus):
    path, kw = saved
    raw = ck.verify(path, data_lock=corpus.lock)
    trainer = ck.Trainer.of(raw)
    assert trainer == ck.Trainer.read(path)
    assert (trainer.step, trainer.world_size, trainer.data_lock) == (7, 1, corpus.lock)
    assert trainer.sampler.position == 1
    assert trainer.sampler.history == raw["sampler"]["history"]
    assert trainer.config == kw["cfg"].to_dict() and trainer.run is None


def test_load_restores_model_optimizer_sampler_and_rng(saved, cfg, corpus):
    path, kw = saved
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = data.make_sampler(cfg, corpus, 2)
    expected_draw = torch.rand(3)  # what the RNG produced right after saving
    torch.manual_seed(999)
    ck.load(path, model=model, optimizer=opt, sampler=sampler, rank=0,
            device=torch.device("cpu"))
    for a, b in zip(model.parameters(), kw["model"].parameters()):
        assert torch.equal(a, b)
    assert opt.state_dict()["state"][0]["momentum_buffer"] is not None
    assert sampler.position == 1 and sampler.next_window() == kw["sampler"].next_window()
    assert torch.equal(torch.rand(3), expected_draw)


@pytest.mark.parametrize("damage,needle", [
    (lambda p: (p / "model.pt").write_bytes((p / "model.pt").read_bytes()[:100]),
     "model.pt: sha256 mismatch"),
    (lambda p: (p / "rank-00.pt").unlink(), "rank-00.pt: missing"),
    (lambda p: (p / "manifest.json").unlink(), "manifest.json is missing"),
    (lambda p: (p / "trainer.json").write_text("{}"), "trainer.json: sha256 mismatch"),
    (lambda p: (p / "stray.bin").write_bytes(b"x"), "stray.bin: not listed"),
])
def test_corruption_is_named(saved, damage, needle):
    path, _ = saved
    damage(path)
    with pytest.raises(ck.CheckpointError) as err:
        ck.verify(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_fit_checks_name_what_differs(saved, cfg, corpus):
    path, kw = saved
    with pytest.raises(ck.CheckpointError, match="world size 1, this run has 2"):
        ck.verify(path, world_size=2)
    with pytest.raises(ck.CheckpointError, match="data lock"):
        ck.verify(path, data_lock="0" * 64)
    other = dataclasses.replace(kw["cfg"], train=dataclasses.replace(kw["cfg"].train,
                                                                     lr=0.01))
    with pytest.raises(ck.CheckpointError, match="train.lr: 0.5 in the checkpoint"):
        ck.verify(path, cfg=other)


def test_latest_valid_skips_partial_and_corrupt(saved, tmp_path):
    path, kw = saved
    later = ck.save(tmp_path, 9, **kw)
    (tmp_path / "checkpoints" / "step-0011.tmp").mkdir()  # a killed write
    assert ck.latest_valid(tmp_path) == later
    (later / "optimizer.pt").write_bytes(b"garbage")
    assert ck.latest_valid(tmp_path) == path


def test_compare_params(saved):
    path, _ = saved
    a = ck.load_params(path)
    b = {k: v.clone() for k, v in a.items()}
    assert ck.compare_params(a, b)["max_abs_param_diff"] == 0.0
    key = next(iter(b))
    b[key].view(-1)[0] += 0.25
    out = ck.compare_params(a, b)
    assert out["max_abs_param_diff"] == pytest.approx(0.25) and not out["identical"]
    assert out["compared_values"] == sum(v.numel() for v in a.values())


def test_manifest_lists_sha256_of_each_file(saved):
    path, _ = saved
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "trainer.json",
                                      "rank-00.pt"}
    assert all(len(h) == 64 for h in manifest["files"].values())


def test_a_save_killed_before_deleting_the_old_folder_does_not_block_the_next(saved):
    path, kw = saved
    # the state a save of step 7 leaves when killed after its second rename,
    # before it deleted the folder it had moved aside
    old = path.with_name(path.name + ".old")
    old.mkdir()
    (old / "model.pt").write_bytes(b"the previous step 7")
    again = ck.save(path.parent.parent, 7, **kw)
    assert again == path and not old.exists()
    assert ck.verify(again)["step"] == 7
