"""``WandbWriter``: a run's config and scalars to Weights & Biases (``trainkit[wandb]`` extra)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from trainkit.utils import trackers

__all__ = ["WandbWriter"]

logger = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id"
"""The file in the output directory that keeps the W&B run id for a resume."""

_MODES = ("online", "offline")


class WandbWriter(trackers.TrackerWriter):
    """Log scalars to a W&B run, with the iteration as the step.

    The run lives in ``output_dir/wandb/`` (offline: ``offline-run-*`` directories to upload
    later with ``wandb sync``), or in ``$WANDB_DIR/wandb/`` (W&B's own convention) when the
    ``WANDB_DIR`` environment variable is set. A writer built where ``output_dir/wandb_run_id``
    exists continues that run. W&B's client sends scalars in the background; its first error
    turns the writer off (:class:`~trainkit.utils.trackers.TrackerWriter`).
    """

    name = "W&B"

    def __init__(
        self,
        output_dir: str,
        project: str = "trainkit",
        mode: str = "online",
        *,
        config: Mapping[str, Any] | None = None,
        run_name: str | None = None,
        window_size: int = 20,
        connect_timeout_s: float = 5.0,
        init_timeout_s: float = 60.0,
    ) -> None:
        """Check W&B and start (or continue) the run.

        Args:
            output_dir: directory of the run: the run id goes there, and the W&B files unless
                ``WANDB_DIR`` is set.
            project: the W&B project.
            mode: ``"online"`` (needs the server and a login) or ``"offline"`` (only local
                files; no network).
            config: the resolved config, logged as the run's config with flattened keys
                (``SOLVER.BASE_LR``).
            run_name: name of a new run; defaults to the name of ``output_dir``.
            window_size: number of iterations the median of smoothed scalars covers.
            connect_timeout_s: how long the check that the server is reachable waits.
            init_timeout_s: how long W&B may take to start the run (its ``init_timeout``).

        Raises:
            ValueError: If ``mode`` is neither ``"online"`` nor ``"offline"``.
            TrackerUnavailableError: If wandb is not installed, or (online) the server is
                not reachable or the login fails.
        """
        if mode not in _MODES:
            raise ValueError(f"W&B mode must be one of {_MODES}, got {mode!r}")
        super().__init__(window_size)
        wandb = trackers.import_tracker("wandb", "wandb", "wandb")
        if mode == "online":
            # The URL W&B would use: WANDB_BASE_URL, else its settings files, else its cloud.
            base_url = wandb.setup().settings.base_url
            trackers.check_reachable(
                base_url, "WANDB_BASE_URL", "wandb", connect_timeout_s, "set WANDB.MODE offline"
            )
        os.makedirs(output_dir, exist_ok=True)
        # A user's WANDB_DIR is W&B's documented place for its files: it wins over OUTPUT_DIR.
        files_dir = os.environ.get("WANDB_DIR") or output_dir
        id_file = os.path.join(output_dir, RUN_ID_FILE)
        run_id = trackers.read_run_id(id_file)
        try:
            self._run = wandb.init(
                project=project,
                dir=files_dir,
                mode=mode,
                id=run_id,
                resume=None if run_id is None else "allow",
                name=run_name or trackers.default_run_name(output_dir) if run_id is None else None,
                config=trackers.flatten_config(config or {}),
                reinit="create_new",  # another run the user started in this process stays open
                settings=wandb.Settings(init_timeout=init_timeout_s),
            )
        except Exception as e:
            raise trackers.TrackerUnavailableError(
                f"W&B could not start a run in project {project!r} (WANDB.MODE={mode}): "
                f"{trackers.first_line(e)}; log in with `wandb login`, set WANDB.MODE offline, "
                "or remove 'wandb' from WRITERS."
            ) from None
        self.run_id: str = self._run.id
        trackers.save_run_id(id_file, self.run_id)
        verb = "started" if run_id is None else "continuing"
        logger.info("W&B: %s run %s (%s) in %s", verb, self.run_id, mode, files_dir)

    def _log(self, iteration: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=iteration)

    def _log_stop_reason(self, iteration: int, reason: str) -> None:
        self._run.summary["stop_reason"] = reason
        self._run.summary["stopped_at_iteration"] = iteration

    def _finish(self, success: bool) -> None:
        self._run.finish(exit_code=0 if success else 1)
