"""The per-rank JSON-lines logs, ``<out>/logs/<job>-rank<R>.jsonl``: one reader.

Every rank appends one record per event (``start``, ``step``, ``error``, ...)
with its ``time``; the launcher's diagnosis, the timing of a launch, the
loss curves and the tests all read them through ``read``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def rank_of(path: Path) -> int | None:
    """``train-rank1.jsonl`` -> 1."""
    try:
        return int(Path(path).stem.rsplit("rank", 1)[1])
    except (IndexError, ValueError):
        return None


def read(dirs: Path | Iterable[Path], job: str = "*", since: float | None = None
         ) -> dict[int, list[tuple[Path, Record]]]:
    """{rank: [(log file, record), ...]} in time order, for one job or all.

    ``since``: only records written at or after this wall-clock time. A line
    cut short (a worker killed mid-write) or not a record is skipped.
    """
    dirs = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    by_rank: dict[int, list[tuple[Path, Record]]] = {}
    for d in dirs:
        for path in sorted((d / "logs").glob(f"{job}-rank*.jsonl")):
            rank = rank_of(path)
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            if rank is None:
                continue
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("time"), (int, float)):
                    continue
                if since is None or rec["time"] >= since:
                    by_rank.setdefault(rank, []).append((path, rec))
    for recs in by_rank.values():
        recs.sort(key=lambda pr: pr[1]["time"])
    return by_rank


def records(run_dir: Path, job: str = "train") -> dict[int, list[Record]]:
    """{rank: [record, ...]} of one job's logs in ``run_dir``."""
    return {rank: [rec for _, rec in recs] for rank, recs in read(run_dir, job).items()}


def loss_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, window loss per token) from the per-rank train logs."""
    per_step: dict[int, list[Record]] = {}
    for recs in records(run_dir).values():
        for rec in recs:
            if rec["event"] == "step":
                per_step.setdefault(rec["step"], []).append(rec)
    return [
        (step, sum(r["local_loss_sum"] for r in recs) / recs[0]["global_tokens"])
        for step, recs in sorted(per_step.items())
    ]
