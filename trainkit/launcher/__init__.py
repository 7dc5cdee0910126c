"""Launching: processes and machines, the elastic agent, SLURM, restarts, pre-emption signals.

Below :mod:`trainkit.engine`, which uses only the names below and :mod:`trainkit.launcher.protocol`
(what the two agree on). Importing it is cheap (see :mod:`trainkit.launcher.launching`).
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
