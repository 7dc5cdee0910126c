"""The writers a run publishes its metrics with, chosen by the config's ``WRITERS``."""

from __future__ import annotations

import os
from collections.abc import Callable

from trainkit.config import CfgNode, ConfigError
from trainkit.utils.errors import UnknownNameError
from trainkit.utils.events import (
    CommonMetricPrinter,
    EventWriter,
    JSONWriter,
    MLflowWriter,
    TensorboardXWriter,
    WandbWriter,
)
from trainkit.utils.file_io import PathManager

__all__ = ["WRITER_NAMES", "build_writers", "default_writers"]


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


def _wandb(cfg: CfgNode, max_iter: int | None) -> EventWriter:
    if cfg.WANDB.MODE not in ("online", "offline"):
        raise ConfigError(
            f"WANDB.MODE={cfg.WANDB.MODE!r} is not a W&B mode; use 'online' or 'offline'."
        )
    return WandbWriter(cfg.OUTPUT_DIR, cfg.WANDB.PROJECT, cfg.WANDB.MODE, config=cfg)


def _mlflow(cfg: CfgNode, max_iter: int | None) -> EventWriter:
    uri, experiment = cfg.MLFLOW.TRACKING_URI, cfg.MLFLOW.EXPERIMENT
    return MLflowWriter(cfg.OUTPUT_DIR, uri, experiment, config=cfg, config_yaml=cfg.dump())


# name in WRITERS -> builder(cfg, max_iter). Trackers check that they are installed and
# reachable when built, so a problem shows before training starts.
_BUILDERS: dict[str, Callable[[CfgNode, int | None], EventWriter]] = {
    "console": lambda cfg, max_iter: CommonMetricPrinter(max_iter),
    "json": lambda cfg, max_iter: JSONWriter(os.path.join(cfg.OUTPUT_DIR, "metrics.json")),
    "tensorboard": lambda cfg, max_iter: TensorboardXWriter(cfg.OUTPUT_DIR),
    "wandb": _wandb,
    "mlflow": _mlflow,
}

WRITER_NAMES: tuple[str, ...] = tuple(_BUILDERS)
"""The names ``WRITERS`` may hold."""


def build_writers(cfg: CfgNode, max_iter: int | None = None) -> list[EventWriter]:
    """Return the writers named in ``cfg.WRITERS``, in that order; on rank 0 only.

    Args:
        cfg: ``WRITERS``, ``OUTPUT_DIR``, ``WANDB`` and ``MLFLOW`` are read; the trackers
            among the writers open a run and log the whole config.
        max_iter: total iterations, for the console's ETA.

    Raises:
        UnknownNameError: If ``WRITERS`` holds a name that is not a writer.
        ConfigError: If ``WRITERS`` names a writer twice, or ``WANDB.MODE`` is invalid.
        TrackerUnavailableError: If a tracker is not installed or not reachable.
    """
    names = tuple(cfg.WRITERS)
    unknown = [name for name in names if name not in _BUILDERS]
    if unknown:
        raise UnknownNameError(
            f"WRITERS={names!r} names unknown writer(s) {', '.join(map(repr, unknown))}; "
            f"known writers: {', '.join(WRITER_NAMES)}."
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"WRITERS={names!r} names {', '.join(repeated)} twice; list each once.")
    PathManager.mkdirs(cfg.OUTPUT_DIR)
    built: dict[str, EventWriter] = {}
    try:
        # Trackers first: the checks most likely to fail run before any file is opened.
        for name in sorted(names, key=lambda name: name not in ("wandb", "mlflow")):
            built[name] = _BUILDERS[name](cfg, max_iter)
    except BaseException:
        # Close what was opened (files, a tracker run) before the error ends the run.
        for writer in built.values():
            writer.close()
        raise
    return [built[name] for name in names]
