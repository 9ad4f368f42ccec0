"""Every benchmark's quick run, one after another, in this one interpreter.

``python -m tests.machinery.quick_runs NAME ...`` runs each
``benchmarks/NAME.py --quick`` as ``python benchmarks/NAME.py --quick`` would
(``__main__``, its own argv, its folder first on ``sys.path``), with its
stdout and stderr captured at the file descriptors, so what its launches
print is caught too. It then prints ``{name: {returncode, stdout, stderr}}``
as JSON. Ten fresh interpreters each imported torch and started an agent
server of their own; here the scripts share one of each (per preload set).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import traceback
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # sys.exit("message"), as python shows it
    return 1


def run_one(script: Path) -> dict:
    argv, path0 = sys.argv, sys.path[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.argv, sys.path[0] = [str(script), "--quick"], str(script.parent)
        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001 - the script's traceback, as python prints it
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sys.argv, sys.path[0] = argv, path0
        out.seek(0)
        err.seek(0)
        return {"returncode": code, "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


def main(names: list[str]) -> int:
    found = {name: run_one(BENCHMARKS / f"{name}.py") for name in names}
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
