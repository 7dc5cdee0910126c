"""Launching: processes and machines, the elastic agent, SLURM, restarts, pre-emption signals.

Below :mod:`trainkit.engine` (utils <- config <- data, solver, checkpoint, modeling,
evaluation <- launcher <- engine): the launcher never imports the engine. What the trainer
and the launcher agree on (exit statuses, environment variables, heartbeat keys, the stall
rule) is :mod:`trainkit.launcher.protocol`; the engine uses that module and the names below,
nothing else of this package.

Importing it is cheap: torch.distributed.elastic, the job store's server and SLURM's parsing
are imported by :func:`launch` when it needs them.
"""

from trainkit.launcher.launching import DEFAULT_TIMEOUT, LaunchError, launch
from trainkit.launcher.preemption import PreemptionSignal
from trainkit.launcher.protocol import connect_job_store
from trainkit.launcher.restarts import record_run_id, resumes_by_itself

__all__ = [
    "DEFAULT_TIMEOUT",
    "LaunchError",
    "PreemptionSignal",
    "connect_job_store",
    "launch",
    "record_run_id",
    "resumes_by_itself",
]
