"""The synthetic corpus and its data lock.

Everything random here uses Python's ``random.Random`` so the corpus is the
same on every machine and every torch version. Sequences come from a seeded
Markov source whose conditional entropy is known, so the irreducible loss
is known. The data lock is the sha256 of a canonical serialisation.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.core import files, paths
from course_lib.core.config import Config

FORMAT_VERSION = 1


class DataLockError(RuntimeError):
    """The data on disk is not the data the config describes."""


# --- the Markov source -------------------------------------------------------


@dataclass(frozen=True)
class MarkovSource:
    """First-order Markov chain over ``vocab_size`` symbols.

    Each state favours a few successors and keeps a little mass on every
    symbol, so no transition is impossible and the entropy floor is finite.
    """

    transitions: tuple[tuple[float, ...], ...]
    stationary: tuple[float, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.transitions)

    def entropy_rate(self) -> float:
        """Conditional entropy H(X_t+1 | X_t) in nats: the best loss per token."""
        return sum(
            pi * -sum(p * math.log(p) for p in row if p > 0)
            for pi, row in zip(self.stationary, self.transitions, strict=True)
        )

    def sample(self, rng: random.Random, length: int) -> list[int]:
        state = _draw(rng, self.stationary)
        seq = [state]
        for _ in range(length - 1):
            state = _draw(rng, self.transitions[state])
            seq.append(state)
        return seq


def _draw(rng: random.Random, probs: tuple[float, ...]) -> int:
    cumulative, total = [], 0.0
    for p in probs:
        total += p
        cumulative.append(total)
    index = bisect.bisect_right(cumulative, rng.random() * total)
    return min(index, len(probs) - 1)


def make_source(seed: int, vocab_size: int, successors: int) -> MarkovSource:
    rng = random.Random(seed)
    smoothing = 0.05
    rows = []
    for _ in range(vocab_size):
        favoured = rng.sample(range(vocab_size), successors)
        weights = [rng.random() + 0.1 for _ in favoured]
        total = sum(weights)
        row = [smoothing / vocab_size] * vocab_size
        for sym, w in zip(favoured, weights, strict=True):
            row[sym] += (1 - smoothing) * w / total
        rows.append(tuple(row))
    return MarkovSource(tuple(rows), _stationary(rows))


def _stationary(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    n = len(rows)
    pi = [1.0 / n] * n
    for _ in range(2000):
        nxt = [0.0] * n
        for i, row in enumerate(rows):
            for j, p in enumerate(row):
                nxt[j] += pi[i] * p
        if max(abs(a - b) for a, b in zip(pi, nxt, strict=True)) < 1e-15:
            pi = nxt
            break
        pi = nxt
    total = sum(pi)
    return tuple(p / total for p in pi)


# --- the corpus --------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    sequences: tuple[tuple[int, ...], ...]  # indexed by id
    splits: dict[str, tuple[int, ...]]  # split name -> ids
    source: MarkovSource
    lock: str

    @property
    def pad_id(self) -> int:
        return self.source.vocab_size

    @property
    def entropy_floor(self) -> float:
        return self.source.entropy_rate()

    def lengths(self, split: str) -> list[int]:
        return [len(self.sequences[i]) for i in self.splits[split]]


def generate_corpus(cfg: Config) -> Corpus:
    d = cfg.data
    source = make_source(cfg.seed, d.vocab_size, d.successors_per_state)
    rng = random.Random(cfg.seed + 1)
    sequences: list[tuple[int, ...]] = []
    splits: dict[str, tuple[int, ...]] = {}
    for split, count in (
        ("train", d.train_sequences),
        ("validation", d.validation_sequences),
        ("test", d.test_sequences),
    ):
        start = len(sequences)
        for _ in range(count):
            length = rng.randint(d.min_length, d.max_length)
            sequences.append(tuple(source.sample(rng, length)))
        splits[split] = tuple(range(start, len(sequences)))
    payload = _canonical_bytes(cfg, source, sequences, splits)
    return Corpus(tuple(sequences), splits, source, _sha256(payload))


def _canonical_bytes(cfg: Config, source: MarkovSource, sequences: Sequence[tuple[int, ...]],
                     splits: Mapping[str, tuple[int, ...]]) -> bytes:
    doc = {
        "format": FORMAT_VERSION,
        "seed": cfg.seed,
        "data": cfg.to_dict()["data"],
        "entropy_floor": source.entropy_rate(),
        "transitions": [list(r) for r in source.transitions],
        "stationary": list(source.stationary),
        "splits": {k: list(v) for k, v in splits.items()},
        "sequences": [list(s) for s in sequences],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def corpus_id(cfg: Config) -> str:
    """Name of the corpus files: one corpus per (seed, data section)."""
    key = json.dumps([cfg.seed, cfg.to_dict()["data"]], sort_keys=True)
    return f"corpus-{cfg.seed}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def corpus_paths(cfg: Config, data_dir: Path) -> tuple[Path, Path]:
    stem = Path(data_dir) / corpus_id(cfg)
    return stem.with_suffix(".json"), stem.with_suffix(".lock.json")


def write_corpus(cfg: Config, data_dir: Path) -> Corpus:
    corpus = generate_corpus(cfg)
    data_path, lock_path = corpus_paths(cfg, data_dir)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomically(data_path, _canonical_bytes(cfg, corpus.source, corpus.sequences,
                                                  corpus.splits))
    files.write_atomically(lock_path,
                      (json.dumps(lock_record(cfg, corpus), indent=2) + "\n").encode())
    return corpus


def _has_corpus(cfg: Config, data_dir: Path) -> bool:
    return any(p.exists() for p in corpus_paths(cfg, data_dir))


def generated_home(data_dir: Path) -> Path:
    """Where corpora that ``data_dir`` lacks are generated: never the committed
    ``data/`` (it holds the committed configs' corpora only), but the
    git-ignored ``runs/data/``; any other directory holds its own."""
    if Path(data_dir).resolve() == paths.data_dir().resolve():
        return paths.generated_data_dir()
    return Path(data_dir)


def locate(cfg: Config, data_dir: Path) -> Path:
    """The directory holding this config's corpus, generated there if needed.

    A corpus is deterministic from the config, so a learner's own config needs
    no separate ``prepare`` step.
    """
    if _has_corpus(cfg, data_dir):
        return Path(data_dir)
    home = generated_home(data_dir)
    if not all(p.is_file() for p in corpus_paths(cfg, home)):
        write_corpus(cfg, home)
    return home


def lock_record(cfg: Config, corpus: Corpus) -> dict[str, Any]:
    return {
        "sha256": corpus.lock,
        "corpus": corpus_id(cfg),
        "format": FORMAT_VERSION,
        "sequences": {k: len(v) for k, v in corpus.splits.items()},
        "entropy_floor": corpus.entropy_floor,
    }


def load_corpus(cfg: Config, data_dir: Path) -> Corpus:
    """Read the committed corpus and check it against its lock and the config."""
    data_path, lock_path = corpus_paths(cfg, data_dir)
    if not data_path.is_file() or not lock_path.is_file():
        raise DataLockError(
            f"no corpus for this config in {data_dir} (run `course-lib prepare`)"
        )
    raw = data_path.read_bytes()
    lock = json.loads(lock_path.read_text())["sha256"]
    if _sha256(raw) != lock:
        raise DataLockError(f"{data_path.name} does not match its lock {lock[:12]}")
    doc = json.loads(raw)
    if doc["data"] != cfg.to_dict()["data"] or doc["seed"] != cfg.seed:
        raise DataLockError(f"{data_path.name} was made from another config")
    source = MarkovSource(
        tuple(tuple(r) for r in doc["transitions"]), tuple(doc["stationary"])
    )
    return Corpus(
        tuple(tuple(s) for s in doc["sequences"]),
        {k: tuple(v) for k, v in doc["splits"].items()},
        source,
        lock,
    )


def prepare(cfg: Config, data_dir: Path) -> tuple[Corpus, str]:
    """Regenerate the corpus and compare it with the committed one.

    Returns (corpus, status) where status is "written" (nothing was there) or
    "verified". Raises DataLockError on any mismatch. A corpus that is not in
    ``data_dir`` is looked for, or written, in ``generated_home(data_dir)``.
    """
    if not _has_corpus(cfg, data_dir):
        data_dir = generated_home(data_dir)
    data_path, lock_path = corpus_paths(cfg, data_dir)
    if not data_path.exists() and not lock_path.exists():
        return write_corpus(cfg, data_dir), "written"
    fresh = generate_corpus(cfg)
    committed = load_corpus(cfg, data_dir)
    if committed.lock != fresh.lock:
        raise DataLockError(
            f"regenerated corpus {fresh.lock[:12]} differs from the committed "
            f"lock {committed.lock[:12]}"
        )
    return committed, "verified"


