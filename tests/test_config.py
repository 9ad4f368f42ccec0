import pytest
import yaml

from course_lib.core.config import ConfigError, from_dict, load


def _raw(root):
    return yaml.safe_load((root / "configs" / "minimum.yaml").read_text())


def test_minimum_config_is_the_protocol(cfg):
    d, t = cfg.data, cfg.train
    assert (d.train_sequences, d.validation_sequences, d.test_sequences) == (1024, 128, 256)
    assert d.rank_length_bands == ((16, 64), (65, 128))
    assert (t.updates, t.stop_at, t.accumulation, t.dtype) == (100, 50, 2, "float32")
    assert (cfg.parity.atol, cfg.parity.rtol) == (1e-6, 1e-4)


@pytest.mark.parametrize("section,key,value,needle", [
    ("train", "updates", -1, "train.updates"),
    ("train", "lr", "fast", "train.lr"),
    ("train", "accumulaton", 2, "train.accumulaton: unknown field"),
    ("data", "rank_length_bands", [[16, 64], [65, 999]], "data.rank_length_bands[1]"),
    ("model", "d_model", 66, "model.d_model"),
    ("parity", "atol", -1, "parity.atol"),
    ("train", "empty_ranks", [5], "train.empty_ranks"),
])
def test_bad_field_is_named(section, key, value, needle):
    from tests.conftest import ROOT

    raw = _raw(ROOT)
    raw[section][key] = value
    with pytest.raises(ConfigError) as err:
        from_dict(raw)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    from tests.conftest import ROOT, course_lib_cli

    raw = _raw(ROOT)
    raw["train"]["batch_size_per_rank"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    proc = course_lib_cli("parity", "--config", bad, "--out", tmp_path / "out")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.batch_size_per_rank" in lines[0]
    assert not (tmp_path / "out").exists(), "bad input must not start a job"


def test_missing_file_and_broken_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(broken)


def test_fingerprint_ignores_run_control_only(cfg):
    import dataclasses

    later = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, stop_at=10))
    assert later.protocol_fingerprint() == cfg.protocol_fingerprint()
    faster = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=0.1))
    assert faster.protocol_fingerprint() != cfg.protocol_fingerprint()
