"""Importing the light parts of trainkit does not pull in heavy optional modules."""

import subprocess
import sys

import pytest

HEAVY = (
    "torch.utils.tensorboard",
    "tensorboard",
    "matplotlib",
    "wandb",
    "mlflow",
    # LazyConfig's dependency: imported when a LazyConfig is used
    "omegaconf",
    # the launcher's heavy parts: launch() imports them when it needs them
    "torch.distributed.elastic",
    "trainkit.launcher.elastic",
    "trainkit.launcher.job",
    "trainkit.launcher.job_store",
    "trainkit.launcher.slurm",
)


@pytest.mark.parametrize(
    "module",
    [
        "trainkit.config",
        "trainkit.utils.comm",
        "trainkit.utils.events",
        "trainkit.launcher",
        "trainkit.engine",
    ],
)
def test_light_import(module):
    code = f"import sys, {module}; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", f"{module} pulls in {out.stdout.strip()}"
