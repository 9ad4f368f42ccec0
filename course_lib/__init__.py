"""Token-weighted DDP: the engine behind the course's notebooks."""

from . import quiz, reports
from .arithmetic import counter_example, global_mean, mean_of_means
from .audits import audit, bugs
from .audits import describe as describe_audit
from .config import Config, ConfigError
from .launch import LaunchError

# protocol.reference is not re-exported: it would shadow the reference module.
from .protocol import (
    evaluate_run,
    exercise,
    load_config,
    parity,
    prepare,
    resume_check,
    run_all,
    stop_and_continuous,
    summary,
    train,
)

__all__ = [
    "Config", "ConfigError", "LaunchError", "audit", "bugs", "counter_example",
    "describe_audit", "evaluate_run", "quiz", "reports",
    "exercise", "global_mean", "load_config", "mean_of_means", "parity", "prepare",
    "resume_check", "run_all", "stop_and_continuous", "summary", "train",
]
__version__ = "0.1.0"
