"""world_size_invariance: one fixed set of sequences over W = 1, 2 and 4.

Each W is a torchrun launch of its own (``course_lib.jobs.world_size``);
the parent compares what they saved."""

from __future__ import annotations

from course_lib.checks.base import Check

WORLD_SIZES = (1, 2, 4)
SEQUENCES = 32  # divisible by every W above, and by 8

CHECK = Check("world_size_invariance", f"one fixed set of {SEQUENCES} sequences over "
              "W = 1, 2 and 4 ranks (a torchrun launch each)")
