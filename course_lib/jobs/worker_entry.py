"""torchrun's ``--run-path`` script: each worker's entry, forked from the agent.

With ``--start-method fork`` torchrun forks the workers from its agent, which
has already imported torch, so no worker pays for that import again.
"""

import signal
import sys

# A forked worker inherits the agent's handlers, which turn SIGTERM into a
# Python exception; a worker the launcher stops must die, not report an error.
for _sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(_sig, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.default_int_handler)

from course_lib.jobs.worker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))  # torch's @record turns exit 0 into a return
