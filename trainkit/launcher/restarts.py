"""Whether this process runs a restart of a job, so that training resumes by itself.

A job restarts when torch.distributed.elastic's agent starts its processes again
(``launch(..., max_restarts=N)``, ``torchrun --max-restarts N``, a machine joining or leaving
a ``torchrun --nnodes MIN:MAX`` job) or when SLURM requeues it; ``DefaultTrainer.resume_or_load``
then resumes from the newest checkpoint even without ``--resume``.

The answer must be the same on every rank and must not take another run's checkpoints for
this run's, so it comes from the checkpoints' directory, where rank 0 writes the job's run id
before its first checkpoint (:func:`record_run_id`). The restart count alone would not do:
each elastic agent counts only its own restarts, and a membership change restarts the
processes without counting at all.
"""

from __future__ import annotations

import logging
import os

from trainkit.launcher.protocol import RESTART_COUNT_VAR
from trainkit.utils.file_io import atomic_write

__all__ = [
    "RUN_ID_FILE",
    "is_restart",
    "record_run_id",
    "restart_count",
    "resumes_by_itself",
    "run_id",
]

logger = logging.getLogger(__name__)

RUN_ID_FILE = "run_id"
"""In ``OUTPUT_DIR``: the run id of the job that wrote the checkpoints there."""


def restart_count() -> int:
    """Return how many times this job was restarted before this round (0 the first time).

    The same on every rank of a job joined by :mod:`trainkit.launcher.job`; otherwise
    torchrun's or SLURM's own count.
    """
    for name in (RESTART_COUNT_VAR, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def run_id() -> str:
    """Return the id every round of this job shares, or ``""`` if it has none.

    torch.distributed.elastic's run id (``launch()`` draws one; ``torchrun --rdzv-id``, or
    drawn by ``--standalone``), else SLURM's job id (kept when a job is requeued). torchrun's
    default ``none`` is no id: unrelated jobs would share it.
    """
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return f"elastic-{elastic}"
    slurm = os.environ.get("SLURM_JOB_ID", "")
    return f"slurm-{slurm}" if slurm else ""


def is_restart(output_dir: str) -> bool:
    """Return whether this process continues the run that wrote ``output_dir``'s checkpoints.

    Without a run id, whether the job says it was restarted (:func:`restart_count`).
    """
    current = run_id()
    return _recorded_run_id(output_dir) == current if current else restart_count() > 0


def resumes_by_itself(output_dir: str, newest_checkpoint: str) -> bool:
    """Return whether training must resume because this job restarted; log the decision.

    Args:
        output_dir: where the run's checkpoints are.
        newest_checkpoint: the checkpoint a resume starts from (for the log).
    """
    count = restart_count()
    if is_restart(output_dir):
        logger.warning(
            "restart %s: resuming from %s",
            count or "after a change of machines",
            newest_checkpoint or "MODEL.WEIGHTS (no checkpoint yet)",
        )
        return True
    if count > 0:
        logger.warning(
            "restart %d: this run wrote no checkpoint yet; starting from the beginning", count
        )
    return False


def record_run_id(output_dir: str) -> None:
    """Write this job's run id into ``output_dir`` (rank 0, before its checkpoints)."""
    current = run_id()
    if not current or not output_dir or _recorded_run_id(output_dir) == current:
        return
    with atomic_write(os.path.join(output_dir, RUN_ID_FILE), "w") as f:
        f.write(current + "\n")


def _recorded_run_id(output_dir: str) -> str | None:
    try:
        with open(os.path.join(output_dir, RUN_ID_FILE)) as f:
            return f.read().strip()
    except OSError:
        return None  # this run has written no checkpoint yet
