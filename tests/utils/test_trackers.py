"""W&B and MLflow writers against the real trackers: W&B offline files, a local MLflow server.

Everything stays on 127.0.0.1: W&B runs offline (an online run points at a closed local
port, without an API key), and MLflow is a ``mlflow server`` started by the module fixture.
"""

import logging
import socket
import sys
import time

import pytest
import torch
from torch import nn

from tests.dist import free_port
from tests.trackers import (
    TcpProxy,
    mlflow_server,
    tracker_env,
    wandb_config,
    wandb_history,
    wandb_runs,
    wandb_summary,
)
from trainkit.config import ConfigError, get_cfg
from trainkit.data import build_train_loader
from trainkit.engine import DefaultTrainer, hooks
from trainkit.engine.writers import build_writers
from trainkit.utils.errors import UnknownNameError, UsageError
from trainkit.utils.events import (
    CommonMetricPrinter,
    EventStorage,
    JSONWriter,
    MLflowWriter,
    TensorboardXWriter,
    WandbWriter,
)
from trainkit.utils.trackers import TrackerUnavailableError


@pytest.fixture(autouse=True)
def _hermetic(tmp_path, monkeypatch):
    for name, value in tracker_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    unset = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI")
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    # MLflow's client reports a lost server at once instead of retrying for minutes.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    yield
    wandb = sys.modules.get("wandb")  # None while a test hides it
    if wandb is not None:  # W&B reads its environment once per process setup
        wandb.teardown()


@pytest.fixture
def trainkit_log(caplog):
    """caplog for trainkit's warnings, whether or not setup_logger() cut "trainkit" off."""
    target = logging.getLogger("trainkit")
    propagate = target.propagate
    target.addHandler(caplog.handler)
    target.propagate = False  # no second copy of each record through the root logger
    caplog.set_level(logging.WARNING, logger="trainkit")
    yield caplog
    target.removeHandler(caplog.handler)
    target.propagate = propagate


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as url:
        yield url


def _client(url):
    from mlflow.tracking import MlflowClient

    return MlflowClient(url)


def _write(writer, iterations):
    """Record ``loss = 1 / (it + 1)`` and ``lr = 0.1`` at each iteration and write."""
    with EventStorage(iterations[0]) as storage:
        for it in iterations:
            storage.put_scalar("loss", 1.0 / (it + 1), smoothing_hint=False, cur_iter=it)
            storage.put_scalar("lr", 0.1, smoothing_hint=False, cur_iter=it)
            storage.put_scalar("[metric]acc", 0.5, smoothing_hint=False, cur_iter=it)
            writer.write()


def _steps(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# ---- W&B ------------------------------------------------------------------------------------
def test_wandb_offline_run_holds_config_and_scalars(tmp_path):
    cfg = get_cfg()
    writer = WandbWriter(str(tmp_path), "tk-tests", "offline", config=cfg)
    _write(writer, [0, 1, 2])
    writer.close()

    (run,) = wandb_runs(tmp_path)
    assert run.project == "tk-tests"
    assert (tmp_path / "wandb_run_id").read_text().strip() == run.run_id == writer.run_id
    config = wandb_config(run)
    assert config["SOLVER.BASE_LR"] == cfg.SOLVER.BASE_LR
    assert config["WRITERS"] == list(cfg.WRITERS)
    history = wandb_history(tmp_path)
    assert sorted(history) == [0, 1, 2]
    assert history[2] == {"loss": pytest.approx(1 / 3), "lr": 0.1, "[metric]acc": 0.5}


def test_a_users_wandb_dir_wins_over_the_output_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "mine"))
    out = tmp_path / "out"
    writer = WandbWriter(str(out), "tk-tests", "offline")
    _write(writer, [0, 1])
    writer.close()
    (run,) = wandb_runs(tmp_path / "mine")  # W&B's convention: $WANDB_DIR/wandb/
    assert sorted(wandb_history(tmp_path / "mine")) == [0, 1]
    assert not (out / "wandb").exists()
    # trainkit's own file stays in the output directory: a resume continues the run
    assert (out / "wandb_run_id").read_text().strip() == run.run_id == writer.run_id


def test_wandb_resume_continues_the_same_run(tmp_path):
    first = WandbWriter(str(tmp_path), "tk-tests", "offline")
    _write(first, [0, 1])
    first.close()
    second = WandbWriter(str(tmp_path), "tk-tests", "offline")
    _write(second, [2, 3])
    second.close()

    assert second.run_id == first.run_id
    assert [run.run_id for run in wandb_runs(tmp_path)] == [first.run_id] * 2
    assert sorted(wandb_history(tmp_path)) == [0, 1, 2, 3]


def test_wandb_online_refuses_an_unreachable_server(tmp_path):
    start = time.monotonic()
    with pytest.raises(TrackerUnavailableError) as error:
        WandbWriter(str(tmp_path), "tk-tests", "online", connect_timeout_s=5)
    assert time.monotonic() - start < 10
    message = str(error.value)
    assert "\n" not in message
    assert "WANDB_BASE_URL=http://127.0.0.1:" in message and "WANDB.MODE offline" in message
    assert not (tmp_path / "wandb_run_id").exists()


def test_wandb_online_without_a_login_is_refused(tmp_path, monkeypatch):
    # A server that accepts connections, and no API key anywhere: the login fails.
    with socket.create_server(("127.0.0.1", 0)) as server:
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        with pytest.raises(TrackerUnavailableError, match="wandb login") as error:
            WandbWriter(str(tmp_path), "tk-tests", "online", init_timeout_s=10)
    assert "\n" not in str(error.value)


# ---- MLflow ---------------------------------------------------------------------------------
def test_mlflow_round_trip_through_a_server(tmp_path, mlflow_url):
    cfg = get_cfg()
    writer = MLflowWriter(
        str(tmp_path), mlflow_url, "tk-round-trip", config=cfg, config_yaml=cfg.dump()
    )
    _write(writer, [0, 1, 2])
    writer.close()

    client = _client(mlflow_url)
    run = client.get_run(writer.run_id)
    assert (tmp_path / "mlflow_run_id").read_text().strip() == writer.run_id
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "tk-round-trip"
    assert run.data.params["SOLVER.BASE_LR"] == str(cfg.SOLVER.BASE_LR)
    assert run.data.params["MODEL.META_ARCHITECTURE"] == cfg.MODEL.META_ARCHITECTURE
    assert _steps(client, writer.run_id, "loss") == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert _steps(client, writer.run_id, "_metric_acc") == [(0, 0.5), (1, 0.5), (2, 0.5)]
    artifact = client.download_artifacts(writer.run_id, "config.yaml", str(tmp_path / "dl"))
    assert open(artifact).read() == cfg.dump()


def test_mlflow_run_says_why_training_stopped_early(tmp_path, mlflow_url):
    writer = MLflowWriter(str(tmp_path), mlflow_url, "tk-stop")
    _write(writer, [0, 1])
    writer.write_stop_reason(1, "early stopping: validation/loss has not improved")
    writer.close()

    tags = _client(mlflow_url).get_run(writer.run_id).data.tags
    assert tags["stop_reason"] == "early stopping: validation/loss has not improved"
    assert tags["stopped_at_iteration"] == "1"


def test_wandb_run_summary_says_why_training_stopped_early(tmp_path):
    writer = WandbWriter(str(tmp_path), "tk-tests", "offline")
    _write(writer, [0, 1])
    writer.write_stop_reason(1, "early stopping: validation/loss has not improved")
    writer.close()

    summary = wandb_summary(tmp_path)
    assert summary["stop_reason"] == "early stopping: validation/loss has not improved"
    assert summary["stopped_at_iteration"] == 1


def test_mlflow_resume_continues_the_same_run(tmp_path, mlflow_url, trainkit_log):
    cfg = get_cfg()
    first = MLflowWriter(str(tmp_path), mlflow_url, "tk-resume", config=cfg)
    _write(first, [0, 1])
    first.close()
    cfg.SOLVER.MAX_ITER = cfg.SOLVER.MAX_ITER * 2  # a resume that trains longer
    second = MLflowWriter(str(tmp_path), mlflow_url, "tk-resume", config=cfg)
    _write(second, [2, 3])
    second.close()

    assert second.run_id == first.run_id
    client = _client(mlflow_url)
    assert [step for step, _ in _steps(client, first.run_id, "loss")] == [0, 1, 2, 3]
    # MLflow cannot change a parameter: the first value stays, and the change is reported.
    assert client.get_run(first.run_id).data.params["SOLVER.MAX_ITER"] == str(
        get_cfg().SOLVER.MAX_ITER
    )
    assert any("SOLVER.MAX_ITER" in r.getMessage() for r in trainkit_log.records)
    runs = client.search_runs([client.get_experiment_by_name("tk-resume").experiment_id])
    assert len(runs) == 1


def test_mlflow_refuses_a_closed_port(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(TrackerUnavailableError) as error:
        MLflowWriter(str(tmp_path), url, "tk", connect_timeout_s=5)
    assert time.monotonic() - start < 10
    message = str(error.value)
    assert "\n" not in message and f"MLFLOW.TRACKING_URI={url} is not reachable" in message


def test_mlflow_server_lost_mid_run_is_logged_once(tmp_path, mlflow_url, trainkit_log):
    proxy = TcpProxy(int(mlflow_url.rsplit(":", 1)[1]))
    writer = MLflowWriter(str(tmp_path), f"http://127.0.0.1:{proxy.port}", "tk-lost")
    _write(writer, [0, 1])
    client = _client(mlflow_url)
    deadline = time.monotonic() + 30  # scalars are sent in the background
    while len(_steps(client, writer.run_id, "loss")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.stop()
    _write(writer, [2, 3, 4, 5])
    writer.close()
    errors = [r for r in trainkit_log.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "MLflow writer failed" in errors[0].getMessage()
    assert errors[0].exc_info is not None
    assert writer.failed
    assert [step for step, _ in _steps(client, writer.run_id, "loss")] == [0, 1]


# ---- choosing writers -----------------------------------------------------------------------
def test_writers_come_from_the_config(tmp_path):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    writers = build_writers(cfg, 10)
    assert [type(w) for w in writers] == [CommonMetricPrinter, JSONWriter, TensorboardXWriter]
    for w in writers:
        w.close()
    cfg.WRITERS = ("json", "wandb")
    cfg.WANDB.MODE = "offline"
    writers = build_writers(cfg)
    assert [type(w) for w in writers] == [JSONWriter, WandbWriter]
    for w in writers:
        w.close()


def test_unknown_or_repeated_writer_names_are_refused(tmp_path):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    cfg.WRITERS = ("console", "wandbb")
    with pytest.raises(UnknownNameError) as error:
        build_writers(cfg)
    message = str(error.value)
    assert "\n" not in message and "'wandbb'" in message
    assert "console, json, tensorboard, wandb, mlflow" in message
    cfg.WRITERS = ("json", "json")
    with pytest.raises(ConfigError, match="json"):
        build_writers(cfg)
    cfg.WRITERS = ("wandb",)
    cfg.WANDB.MODE = "offlin"
    with pytest.raises(ConfigError, match="WANDB.MODE='offlin'"):
        build_writers(cfg)


@pytest.mark.parametrize(("writer", "module"), [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_that_is_not_installed_is_a_usage_error(tmp_path, monkeypatch, writer, module):
    monkeypatch.setitem(sys.modules, module, None)  # "import wandb" now raises ImportError
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    cfg.WRITERS = ("json", writer)
    with pytest.raises(UsageError) as error:
        build_writers(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert f"pip install 'trainkit[{writer}]'" in message and f"remove '{writer}'" in message


# ---- through DefaultTrainer -----------------------------------------------------------------
class _Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, batch):
        x = torch.stack([b["x"] for b in batch])
        y = torch.stack([b["y"] for b in batch])
        return {"loss_mse": nn.functional.mse_loss(self.fc(x).squeeze(1), y)}


def _records():
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 2, generator=g)
    return [{"x": x, "y": x.sum() * 2.0} for x in xs]


class _Trainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _Linear()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=lambda r: r, dataset=_records())


def _train(output_dir, mlflow_url, max_iter, resume=False, extra_hooks=()):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.SEED = 1
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.BASE_LR = 0.01
    cfg.SOLVER.MAX_ITER = max_iter
    cfg.SOLVER.STEPS = ()
    cfg.SOLVER.WARMUP_ITERS = 0
    cfg.SOLVER.CHECKPOINT_PERIOD = 4
    cfg.WRITER_PERIOD = 2
    cfg.WRITERS = ("json", "wandb", "mlflow")
    cfg.WANDB.MODE = "offline"
    cfg.WANDB.PROJECT = "tk-e2e"
    cfg.MLFLOW.TRACKING_URI = mlflow_url
    cfg.MLFLOW.EXPERIMENT = "tk-e2e"
    trainer = _Trainer(cfg)
    trainer.register_hooks(list(extra_hooks))
    trainer.resume_or_load(resume=resume)
    trainer.train()
    return trainer


def test_default_trainer_logs_to_both_trackers_and_a_resume_continues_them(tmp_path, mlflow_url):
    _train(tmp_path, mlflow_url, max_iter=8)
    wandb_id = (tmp_path / "wandb_run_id").read_text().strip()
    mlflow_id = (tmp_path / "mlflow_run_id").read_text().strip()
    _train(tmp_path, mlflow_url, max_iter=12, resume=True)  # continues after iteration 7

    assert (tmp_path / "wandb_run_id").read_text().strip() == wandb_id
    assert (tmp_path / "mlflow_run_id").read_text().strip() == mlflow_id
    assert {run.run_id for run in wandb_runs(tmp_path)} == {wandb_id}
    history = wandb_history(tmp_path)
    assert [s for s in sorted(history) if "total_loss" in history[s]] == [1, 3, 5, 7, 9, 11]
    assert wandb_config(wandb_runs(tmp_path)[0])["WRITERS"] == ["json", "wandb", "mlflow"]
    client = _client(mlflow_url)
    steps = [step for step, _ in _steps(client, mlflow_id, "total_loss")]
    assert steps == [1, 3, 5, 7, 9, 11]
    assert client.get_run(mlflow_id).data.params["WANDB.MODE"] == "offline"


def test_trackers_failing_mid_run_never_stop_training(
    tmp_path, mlflow_url, monkeypatch, trainkit_log
):
    import wandb

    proxy = TcpProxy(int(mlflow_url.rsplit(":", 1)[1]))

    def broken_log(self, *args, **kwargs):
        raise RuntimeError("simulated W&B failure")

    def break_both(trainer):
        if trainer.iter == 4:
            proxy.stop()  # the MLflow server is gone...
            monkeypatch.setattr(wandb.Run, "log", broken_log)  # ...and W&B raises

    trainer = _train(
        tmp_path,
        f"http://127.0.0.1:{proxy.port}",
        max_iter=10,
        extra_hooks=[hooks.CallbackHook(after_step=break_both)],
    )
    assert trainer.iter == trainer.max_iter and (tmp_path / "model_final.pth").exists()
    failures = [r.getMessage() for r in trainkit_log.records if r.levelno >= logging.ERROR]
    assert sorted(failures) == sorted(
        [f"The {name} writer failed and is off for the rest of this run; training and the "
         "other writers go on." for name in ("MLflow", "W&B")]
    )  # fmt: skip
    # The other writers went on to the end.
    metrics = (tmp_path / "metrics.json").read_text().splitlines()
    assert '"iteration": 9' in metrics[-1]
    assert max(wandb_history(tmp_path)) == 3
