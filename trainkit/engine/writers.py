"""The writers a run publishes its metrics with."""

from __future__ import annotations

import os

from trainkit.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardXWriter
from trainkit.utils.file_io import PathManager

__all__ = ["default_writers"]


def default_writers(output_dir: str, max_iter: int | None = None) -> list[EventWriter]:
    """Return the standard writers: console (with ETA), ``metrics.json`` and TensorBoard.

    Args:
        output_dir: directory for ``metrics.json`` and the TensorBoard event files.
        max_iter: total iterations, for the ETA.
    """
    PathManager.mkdirs(output_dir)
    return [
        CommonMetricPrinter(max_iter),
        JSONWriter(os.path.join(output_dir, "metrics.json")),
        TensorboardXWriter(output_dir),
    ]
