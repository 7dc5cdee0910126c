"""detectron2's check of the installed PyTorch version (``min_torch_version``)."""

from __future__ import annotations

import torch

__all__ = ["min_torch_version"]


def min_torch_version(min_version: str) -> bool:
    """Return whether the installed PyTorch is at least ``min_version`` (``"2.1"``, ``"1.13.1"``).

    The comparison follows PEP 440 on ``torch.__version__``: a local suffix such as ``+cpu``
    does not lower the version, and a pre-release (``2.6.0a0``) is below its release.
    """
    return torch.__version__ >= min_version
