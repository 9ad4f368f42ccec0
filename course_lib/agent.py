"""torchrun, for single-node launches: ``python -m course_lib.agent ARGS``.

This runs ``torch.distributed.run.main`` itself, with its own arguments, and
changes two costs around it (measured on 2 CPU cores):

- ``torch._dynamo`` is imported before the workers are forked. DDP imports
  it lazily in its constructor, 1.4 s in every worker of every launch.
- The agent leaves with ``os._exit`` once torchrun is done and its output is
  flushed: finalizing an interpreter that has loaded torch took 0.46 s.

Multi-node launches keep the plain ``python -m torch.distributed.run``
command line that each node types.
"""

import os
import sys
import traceback


def main() -> int:
    import torch._dynamo  # noqa: F401  (the point: loaded once, before the fork)
    from torch.distributed import run

    try:
        run.main(sys.argv[1:])
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - torchrun's error report, as python would print it
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
