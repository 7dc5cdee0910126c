"""The environment table bug reports should include: ``python -m trainkit.utils.collect_env``."""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys

__all__ = ["collect_env_info"]

_ENV_VARS = (
    "CUDA_VISIBLE_DEVICES MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK OMP_NUM_THREADS "
    "TRAINKIT_DATASETS"
).split()
_PACKAGES = ("numpy", "fvcore", "iopath", "yacs", "tensorboard", "yaml", "PIL")


def _git_sha() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = ["git", "-C", root, "rev-parse", "--short", "HEAD"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "not a git checkout"
    return out.stdout.strip() if out.returncode == 0 else "not a git checkout"


def _version(module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return "not installed"
    return str(getattr(module, "__version__", "unknown"))


def collect_env_info() -> list[tuple[str, str]]:
    """Return the environment as (item, value) rows, one per line of the printed table."""
    import torch
    import torch.distributed as dist

    import trainkit

    cuda_build = torch.version.cuda
    rows = [
        ("Python", sys.version.replace("\n", " ")),
        ("Python executable", sys.executable),
        ("Platform", platform.platform()),
        ("trainkit", f"{trainkit.__version__} @ {os.path.dirname(trainkit.__file__)}"),
        ("trainkit git SHA", _git_sha()),
        ("PyTorch", f"{torch.__version__} @ {os.path.dirname(torch.__file__)}"),
        ("PyTorch build", f"CUDA {cuda_build}" if cuda_build else "CPU"),
        ("PyTorch git version", str(torch.version.git_version)),
        ("CUDA available", str(torch.cuda.is_available())),
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = ".".join(map(str, torch.cuda.get_device_capability(i)))
            rows.append((f"GPU {i}", f"{torch.cuda.get_device_name(i)} (compute {cap})"))
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else "unknown"
        rows.append(("NCCL", ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
    rows += [
        ("distributed: Gloo", str(dist.is_available() and dist.is_gloo_available())),
        ("distributed: NCCL", str(dist.is_available() and dist.is_nccl_available())),
        ("CPU count", str(os.cpu_count())),
        ("torch threads", str(torch.get_num_threads())),
    ]
    rows += [(f"${name}", os.environ.get(name, "<unset>")) for name in _ENV_VARS]
    rows += [(name, _version(name)) for name in _PACKAGES]
    return rows


def format_env_info(rows: list[tuple[str, str]] | None = None) -> str:
    """Return the rows as an aligned two-column table."""
    rows = collect_env_info() if rows is None else rows
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


if __name__ == "__main__":
    print(format_env_info())  # noqa: T201 - this is the command-line entry point
