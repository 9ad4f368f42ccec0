"""Typed course configuration, loaded from YAML and validated field by field."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad configuration value; the message names the field."""


@dataclass(frozen=True)
class DataConfig:
    train_sequences: int = 1024
    validation_sequences: int = 128
    test_sequences: int = 256
    min_length: int = 16
    max_length: int = 128
    rank_length_bands: tuple[tuple[int, int], ...] = ((16, 64), (65, 128))
    vocab_size: int = 32
    successors_per_state: int = 4


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1


@dataclass(frozen=True)
class TrainConfig:
    world_size: int = 2
    updates: int = 100
    stop_at: int = 50
    checkpoint_every: int = 25
    accumulation: int = 2
    batch_size_per_rank: int = 8
    lr: float = 0.5
    momentum: float = 0.9
    dtype: str = "float32"
    # Test and chapter-09 knob: force these ranks' windows to hold no token.
    empty_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class ParityConfig:
    atol: float = 1e-6
    rtol: float = 1e-4
    step: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens: tuple[int, ...]

    @property
    def label(self) -> str:
        """The scenario's name in the learner's language (``balanced``)."""
        from course_lib.core.edition import tr
        return tr(self.name)


@dataclass(frozen=True)
class ExerciseConfig:
    per_token_loss: tuple[float, ...] = (1.0, 3.0)
    scenarios: tuple[Scenario, ...] = ()


@dataclass(frozen=True)
class Config:
    name: str = "minimum"
    seed: int = 1234
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)
    exercise: ExerciseConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = _plain(dataclasses.asdict(self))
        return doc

    def protocol_fingerprint(self) -> str:
        """sha256 of everything that shapes a trajectory.

        Run-control fields (where to stop, how often to save) are left out, so
        a run stopped at 50 can be resumed to 100 under the same fingerprint.
        """
        d = self.to_dict()
        for key in ("stop_at", "checkpoint_every"):
            d["train"].pop(key)
        return hashlib.sha256(_canonical(d)).hexdigest()

    def with_world_size(self, world_size: int | None) -> Config:
        """This config at ``world_size`` ranks; None keeps its own
        ``train.world_size``: the one place that default is resolved."""
        if world_size is None or world_size == self.train.world_size:
            return self
        train = dataclasses.replace(self.train, world_size=world_size)
        cfg = dataclasses.replace(self, train=train)
        validate(cfg)
        return cfg


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


_SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "parity": ParityConfig,
}


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


def _key(key: Any) -> str:
    """A YAML key as one short line of a message."""
    plain = isinstance(key, str) and key.isprintable() and 0 < len(key) <= 40
    return key if plain else _show(key, 40)


def _coerce(path: str, value: Any, typ: Any) -> Any:
    """Convert a YAML value to the annotated type, or raise naming the field."""
    if typ in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
        return value
    if typ in ("float", float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {_show(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{path}: expected a finite number, got {_show(value)}")
        return number
    if typ in ("str", str):
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_show(value)}")
        return value
    if typ == "tuple[int, ...]":
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list of integers, got {_show(value)}")
        return tuple(_coerce(f"{path}[{i}]", v, int) for i, v in enumerate(value))
    if typ == "tuple[float, ...]":
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list of numbers, got {_show(value)}")
        return tuple(_coerce(f"{path}[{i}]", v, float) for i, v in enumerate(value))
    if typ == "tuple[tuple[int, int], ...]":
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list of [low, high] pairs")
        bands = []
        for i, pair in enumerate(value):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ConfigError(f"{path}[{i}]: expected [low, high], got {_show(pair)}")
            bands.append(tuple(_coerce(f"{path}[{i}]", v, int) for v in pair))
        return tuple(bands)
    raise TypeError(f"unsupported config type {typ!r} at {path}")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: expected a mapping, got {_show(raw)}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{prefix}.{_key(key)}: unknown field")
    kwargs = {
        key: _coerce(f"{prefix}.{key}", value, known[key].type)
        for key, value in raw.items()
    }
    return cls(**kwargs)


def _build_exercise(raw: Any) -> ExerciseConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"exercise: expected a mapping, got {_show(raw)}")
    unknown = set(raw) - {"per_token_loss", "scenarios"}
    if unknown:
        raise ConfigError(f"exercise.{_key(sorted(unknown, key=str)[0])}: unknown field")
    losses = _coerce(
        "exercise.per_token_loss", raw.get("per_token_loss", [1, 3]), "tuple[float, ...]"
    )
    scenarios = []
    if not isinstance(raw.get("scenarios") or [], list):
        raise ConfigError("exercise.scenarios: expected a list of {name, tokens}")
    for i, item in enumerate(raw.get("scenarios") or []):
        where = f"exercise.scenarios[{i}]"
        if not isinstance(item, dict) or set(item) != {"name", "tokens"}:
            raise ConfigError(f"{where}: expected {{name, tokens}}, got {_show(item)}")
        name = _coerce(f"{where}.name", item["name"], str)
        tokens = _coerce(f"{where}.tokens", item["tokens"], "tuple[int, ...]")
        scenarios.append(Scenario(name=name, tokens=tokens))
    return ExerciseConfig(per_token_loss=losses, scenarios=tuple(scenarios))


def from_dict(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping at the top level")
    allowed = {"name", "seed", "exercise", *_SECTIONS}
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{_key(key)}: unknown field")
    kwargs: dict[str, Any] = {}
    if "name" in raw:
        kwargs["name"] = _coerce("name", raw["name"], str)
    if "seed" in raw:
        kwargs["seed"] = _coerce("seed", raw["seed"], int)
    for section, cls in _SECTIONS.items():
        kwargs[section] = _build(cls, raw.get(section), section)
    if raw.get("exercise") is not None:
        kwargs["exercise"] = _build_exercise(raw["exercise"])
    cfg = Config(**kwargs)
    validate(cfg)
    return cfg


def _require(ok: bool, field_path: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{field_path}: {message}")


def validate(cfg: Config) -> None:
    d, m, t, p = cfg.data, cfg.model, cfg.train, cfg.parity
    _require(cfg.name.replace("-", "").replace("_", "").isalnum() and cfg.name.isascii()
             and len(cfg.name) <= 64, "name",
             "use at most 64 ASCII letters, digits, '-' and '_'")
    _require(0 <= cfg.seed < 2**31, "seed", "must be in [0, 2**31)")
    # Caps keep every command quick on a laptop: the corpus is generated in
    # pure Python, the plan is drawn window by window.
    for key in ("train_sequences", "validation_sequences", "test_sequences"):
        _require(0 < getattr(d, key) <= 100_000, f"data.{key}", "must be in [1, 100000]")
    total = d.train_sequences + d.validation_sequences + d.test_sequences
    _require(total * d.max_length <= 4_000_000, "data.train_sequences",
             "all sequences x data.max_length must be at most 4,000,000 tokens")
    _require(2 <= d.min_length <= d.max_length, "data.min_length",
             "must be at least 2 and at most data.max_length")
    _require(d.max_length <= 512, "data.max_length", "must be at most 512")
    _require(2 <= d.vocab_size <= 1024, "data.vocab_size", "must be in [2, 1024]")
    _require(1 <= d.successors_per_state <= d.vocab_size,
             "data.successors_per_state", "must be in [1, data.vocab_size]")
    for i, (lo, hi) in enumerate(d.rank_length_bands):
        _require(d.min_length <= lo <= hi <= d.max_length,
                 f"data.rank_length_bands[{i}]",
                 f"[{lo}, {hi}] must lie inside [min_length, max_length]")
    _require(0 < m.n_heads <= 64, "model.n_heads", "must be in [1, 64]")
    _require(0 < m.d_model <= 1024 and m.d_model % m.n_heads == 0, "model.d_model",
             "must be a multiple of model.n_heads in [1, 1024]")
    _require(0 < m.n_layers <= 24, "model.n_layers", "must be in [1, 24]")
    _require(0 < m.d_ff <= 8192, "model.d_ff", "must be in [1, 8192]")
    _require(0.0 <= m.dropout < 1.0, "model.dropout", "must be in [0, 1)")
    _require(1 <= t.world_size <= 64, "train.world_size", "must be in [1, 64]")
    _require(len(d.rank_length_bands) == t.world_size
             or d.max_length - d.min_length + 1 >= t.world_size, "train.world_size",
             "needs one band in data.rank_length_bands per rank, or at least one "
             "length in [min_length, max_length] per rank")
    _require(0 < t.updates <= 100_000, "train.updates", "must be in [1, 100000]")
    _require(0 < t.stop_at <= t.updates, "train.stop_at", "must be in [1, updates]")
    _require(t.checkpoint_every > 0, "train.checkpoint_every", "must be positive")
    _require(0 < t.accumulation <= 1024, "train.accumulation", "must be in [1, 1024]")
    _require(0 < t.batch_size_per_rank <= 4096, "train.batch_size_per_rank",
             "must be in [1, 4096]")
    _require(0 < t.lr <= 1000, "train.lr", "must be in (0, 1000]")
    _require(t.updates * t.accumulation * t.batch_size_per_rank <= 2_000_000,
             "train.updates", "updates x accumulation x batch_size_per_rank must be at "
             "most 2,000,000 draws per rank")
    _require(0 <= t.momentum < 1, "train.momentum", "must be in [0, 1)")
    _require(t.dtype in ("float32", "float64"), "train.dtype",
             "must be float32 or float64")
    for r in t.empty_ranks:
        _require(0 <= r < t.world_size, "train.empty_ranks",
                 f"rank {r} is outside [0, world_size)")
    _require(p.atol >= 0, "parity.atol", "must be non-negative")
    _require(p.rtol >= 0, "parity.rtol", "must be non-negative")
    _require(0 <= p.step < t.updates, "parity.step", "must be in [0, updates)")
    if cfg.exercise is not None:
        _require(len(cfg.exercise.per_token_loss) == t.world_size,
                 "exercise.per_token_loss", "needs one value per rank")
        for i, sc in enumerate(cfg.exercise.scenarios):
            _require(len(sc.tokens) == t.world_size,
                     f"exercise.scenarios[{i}].tokens", "needs one count per rank")
            _require(all(1 <= n < d.max_length for n in sc.tokens),
                     f"exercise.scenarios[{i}].tokens",
                     "each count must be in [1, data.max_length)")


def load(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config: no such file: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"{path.name}: not valid YAML{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name}: not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:  # e.g. a date like 2024-13-45
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path.name}: unreadable value ({why})") from None
    return from_dict(raw)
