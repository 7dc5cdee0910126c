"""``MLflowWriter``: a run's config and scalars to an MLflow server (``trainkit[mlflow]`` extra)."""

from __future__ import annotations

import logging
import os
import posixpath
import re
import time
from collections.abc import Mapping
from typing import Any

from trainkit.utils import trackers

__all__ = ["MLflowWriter"]

logger = logging.getLogger(__name__)

RUN_ID_FILE = "mlflow_run_id"
"""The file in the output directory that keeps the MLflow run id for a resume."""

# MLflow's limits on one log_batch request.
_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000


class MLflowWriter(trackers.TrackerWriter):
    """Log scalars to an MLflow run, with the iteration as the step.

    When built, it checks that the tracking server accepts connections and opens the run
    (the one whose id is in ``output_dir/mlflow_run_id`` if that file exists and the run is
    still there, else a new one in ``experiment``). A background thread sends the scalars,
    so a slow server does not stall training. A character MLflow forbids in a scalar name is
    replaced (``[metric]x`` becomes ``_metric_x``). MLflow's first error turns the writer off
    (:class:`~trainkit.utils.trackers.TrackerWriter`); the ``MLFLOW_HTTP_REQUEST_*``
    environment variables set how long its client retries before it reports an error.
    """

    name = "MLflow"

    def __init__(
        self,
        output_dir: str,
        tracking_uri: str = "",
        experiment: str = "trainkit",
        *,
        config: Mapping[str, Any] | None = None,
        config_yaml: str | None = None,
        run_name: str | None = None,
        window_size: int = 20,
        connect_timeout_s: float = 5.0,
        close_timeout_s: float = 60.0,
    ) -> None:
        """Check the server and open the run.

        Args:
            output_dir: directory of the run; the run id is kept there.
            tracking_uri: the tracking server or store; ``""`` uses MLflow's own default
                (the ``MLFLOW_TRACKING_URI`` environment variable, else a local store).
            experiment: name of the experiment, created if missing.
            config: the resolved config, logged as parameters with flattened keys
                (``SOLVER.BASE_LR``).
            config_yaml: the config file's text, logged as the artifact ``config.yaml``.
            run_name, window_size, connect_timeout_s: as for
                :class:`~trainkit.utils.wandb_writer.WandbWriter`.
            close_timeout_s: how long :meth:`close` waits for scalars still being sent.

        Raises:
            TrackerUnavailableError: If mlflow is not installed, the server is not
                reachable, or it refuses to open the run.
        """
        super().__init__(window_size)
        trackers.import_tracker("mlflow", "mlflow", "mlflow")
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric_cls = Metric
        self._close_timeout_s = close_timeout_s
        self._client = MlflowClient(tracking_uri or None)
        self._uri = self._client.tracking_uri
        setting = "MLFLOW.TRACKING_URI" if tracking_uri else "MLFLOW_TRACKING_URI"
        trackers.check_reachable(self._uri, setting, "mlflow", connect_timeout_s)
        self._id_file = os.path.join(output_dir, RUN_ID_FILE)
        try:
            self.run_id = self._open_run(
                experiment, run_name or trackers.default_run_name(output_dir)
            )
            self._log_config(config or {}, config_yaml)
        except trackers.TrackerUnavailableError:
            raise
        except Exception as e:
            raise trackers.TrackerUnavailableError(
                f"MLflow at MLFLOW.TRACKING_URI={self._uri} could not open a run in experiment "
                f"{experiment!r}: {trackers.first_line(e)}; check the server and "
                "MLFLOW.EXPERIMENT, or remove 'mlflow' from WRITERS."
            ) from None
        trackers.save_run_id(self._id_file, self.run_id)
        self._calls = trackers.BackgroundCalls("trainkit-mlflow", self._disable)
        self._keys: dict[str, str] = {}  # scalar name -> MLflow metric name

    def _open_run(self, experiment: str, run_name: str) -> str:
        """Return the id of the run to log to: the saved one if it still exists, else a new one."""
        from mlflow.exceptions import MlflowException

        client = self._client
        run_id = trackers.read_run_id(self._id_file)
        if run_id is not None:
            try:
                active = client.get_run(run_id).info.lifecycle_stage == "active"
            except MlflowException:  # the server does not have it
                active = False
            if active:
                client.update_run(run_id, status="RUNNING")
                logger.info("MLflow: continuing run %s at %s", run_id, self._uri)
                return run_id
            logger.warning(
                "MLflow: run %s (from %s) is not on %s or was deleted; starting a new run.",
                run_id,
                self._id_file,
                self._uri,
            )
        found = client.get_experiment_by_name(experiment)
        if found is not None and found.lifecycle_stage != "active":
            raise trackers.TrackerUnavailableError(
                f"MLFLOW.EXPERIMENT={experiment!r} is deleted on {self._uri}; restore it there "
                "or choose another experiment name."
            )
        experiment_id = (
            client.create_experiment(experiment) if found is None else found.experiment_id
        )
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        logger.info("MLflow: started run %s in experiment %r at %s", run_id, experiment, self._uri)
        return run_id

    def _log_config(self, config: Mapping[str, Any], config_yaml: str | None) -> None:
        from mlflow.entities import Param

        logged = self._client.get_run(self.run_id).data.params
        params = {k: str(v) for k, v in trackers.flatten_config(config).items()}
        # MLflow refuses to change a parameter; a resumed run keeps the values it started
        # with and the new config.yaml shows what changed.
        if changed := sorted(k for k, v in params.items() if k in logged and logged[k] != v):
            logger.warning(
                "MLflow: run %s keeps its first values of %s; this run's config.yaml (the "
                "artifact) has the new ones.",
                self.run_id,
                ", ".join(changed),
            )
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for start in range(0, len(new), _MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=new[start : start + _MAX_PARAMS_PER_BATCH])
        if config_yaml is not None:
            self._client.log_text(self.run_id, config_yaml, "config.yaml")

    def _log(self, iteration: int, scalars: dict[str, float]) -> None:
        timestamp_ms = int(time.time() * 1000)
        keys = self._keys
        for name in scalars.keys() - keys.keys():
            keys[name] = _mlflow_key(name)
        metric = self._metric_cls
        metrics = [metric(keys[n], float(v), timestamp_ms, iteration) for n, v in scalars.items()]
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            chunk = metrics[start : start + _MAX_METRICS_PER_BATCH]
            self._calls.submit(self._client.log_batch, self.run_id, metrics=chunk)

    def _log_stop_reason(self, iteration: int, reason: str) -> None:
        # MLflow tag values are strings of at most 5,000 characters (8,000 on newer servers).
        self._calls.submit(self._client.set_tag, self.run_id, "stop_reason", reason[:5000])
        self._calls.submit(
            self._client.set_tag, self.run_id, "stopped_at_iteration", str(iteration)
        )

    def _finish(self, success: bool) -> None:
        if success:
            self._calls.submit(self._client.set_terminated, self.run_id, status="FINISHED")
        if not self._calls.close(self._close_timeout_s):
            logger.warning(
                "MLflow: scalars still being sent to %s after %g s are dropped.",
                self._uri,
                self._close_timeout_s,
            )


def _mlflow_key(name: str) -> str:
    """``name`` with the characters MLflow forbids in a metric name replaced by ``_``."""
    key = re.sub(r"[^/\w.\- :]", "_", name)
    # MLflow also wants a normalised relative path: no "//", "./", "../" or leading "/".
    parts = [p for p in key.split("/") if p not in ("", ".", "..")]
    return posixpath.join(*parts) if parts else "_"
