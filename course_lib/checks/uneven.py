"""uneven_microbatches: the window's sequences re-batched by a token budget,
so the ranks make different numbers of microbatches.

With token-budget batching (fairseq's ``max_tokens``, packing), a rank of
long sequences makes more, smaller microbatches than a rank of short ones.
A step must still give the window's gradient, and every rank must take
part in the same collectives: a collective per microbatch pairs with
nothing on the rank that ran out of microbatches, and the step deadlocks.
A deadlock fails its launch, so the check runs in launches of its own
(``course_lib.jobs.uneven``), and the deadlocked rank is named.
"""

from __future__ import annotations

from course_lib.checks.base import Check

# 384 padded tokens: on the course's skewed window, 3 microbatches of short
# sequences on rank 0 against 6 of long ones on rank 1.
MAX_TOKENS = 384

# Every rank runs the parity window in well under a second: a rank that has
# not finished this long after the others is deadlocked (or the step timeout
# is shorter, and decides).
DEADLINE = 10.0

CHECK = Check("uneven_microbatches", f"the window re-batched by a budget of {MAX_TOKENS} "
              "padded tokens, so ranks make different numbers of microbatches; a step "
              "that deadlocks is named (a launch of its own)")
