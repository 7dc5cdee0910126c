"""A detectron2 user's engine code, with ``detectron2`` replaced by ``trainkit``, behaves the same.

Each test exercises one behaviour detectron2's own engine tests check, through trainkit's
public names. The model sleeps nowhere: timing-dependent behaviour is checked by counts.
"""

import json
import math
from unittest import mock

import pytest
import torch
from fvcore.common.checkpoint import Checkpointer as FvcoreCheckpointer
from torch import nn

from trainkit.config import configurable, get_cfg
from trainkit.data import DatasetCatalog
from trainkit.engine import AMPTrainer, DefaultTrainer, SimpleTrainer, default_setup, hooks
from trainkit.modeling import META_ARCH_REGISTRY
from trainkit.utils.events import CommonMetricPrinter, JSONWriter


@META_ARCH_REGISTRY.register()
class _TinyModel(nn.Module):
    @configurable
    def __init__(self, width=4):
        super().__init__()
        self.linear = nn.Linear(width, 2)

    @classmethod
    def from_config(cls, cfg):
        return {"width": 4}

    def forward(self, x):
        if isinstance(x, list):  # a batch of records from a trainkit loader
            x = torch.stack([torch.as_tensor(r["x"], dtype=torch.float32) for r in x])
        return {"loss": self.linear(x).pow(2).mean() + x.sum() * 0.0}


def _batches():
    generator = torch.Generator().manual_seed(0)
    while True:
        yield torch.rand(3, 4, generator=generator)


def _trainer(**kwargs):
    model = _TinyModel()
    return SimpleTrainer(model, _batches(), torch.optim.SGD(model.parameters(), 0.1), **kwargs)


def test_simple_trainer_trains_and_ends_at_max_iter():
    trainer = _trainer()
    trainer.train(0, 10)
    assert trainer.iter == 10


def test_reset_data_loader_rebuilds_the_iterator():
    trainer = _trainer()
    trainer.train(0, 3)
    seen = []

    def builder():
        seen.append("built")
        return _batches()

    trainer.reset_data_loader(builder)
    assert seen == ["built"]
    trainer.train(3, 6)
    assert trainer.iter == 6


def test_writers_write_at_period_ends_last_iteration_and_after_eval(tmp_path):
    trainer = _trainer()
    json_file = tmp_path / "metrics.json"
    writers = [CommonMetricPrinter(50), JSONWriter(str(json_file))]
    trainer.register_hooks(
        [hooks.EvalHook(0, lambda: {"metric": 100}), hooks.PeriodicWriter(writers)]
    )
    with mock.patch.object(writers[0].logger, "info") as info:
        trainer.train(0, 50)
    lines = [json.loads(line) for line in json_file.read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [19, 39, 49, 50]
    assert "metric" in lines[-1]
    printed = [
        call.args[0] % call.args[1:] if call.args[1:] else call.args[0]
        for call in info.call_args_list
    ]
    assert len(printed) == 3
    for text, cur_iter in zip(printed, [19, 39, 49]):
        assert f"iter: {cur_iter}" in text
    assert "eta: 0:00:00" in printed[-1]


def test_gather_metric_period_records_only_period_ends(tmp_path):
    trainer = _trainer(gather_metric_period=5)
    json_file = tmp_path / "metrics.json"
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.PeriodicWriter([JSONWriter(str(json_file), window_size=10)], period=10),
        ]
    )
    trainer.train(0, 50)
    lines = [json.loads(line) for line in json_file.read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [9, 19, 29, 39, 49]
    # IterationTimer skips the first 2 of the 3 warm-up steps, as detectron2's does.
    assert len(trainer.storage.history("time").values()) == 48
    for key in ("data_time", "total_loss"):
        history = trainer.storage.history(key).values()
        assert [cur_iter for _, cur_iter in history] == list(range(4, 50, 5))
        for i, line in enumerate(lines):
            # the written value is the median of the two values recorded in its 10 iterations
            assert line[key] == pytest.approx((history[2 * i][0] + history[2 * i + 1][0]) / 2)


def test_async_write_metrics_is_accepted_and_writes_every_step(tmp_path):
    from trainkit.engine import simple_trainer

    for trainer_cls in (SimpleTrainer, AMPTrainer):
        model = _TinyModel()
        with mock.patch.object(simple_trainer.logger, "info") as info:
            trainer = trainer_cls(
                model,
                _batches(),
                torch.optim.SGD(model.parameters(), 0.1),
                async_write_metrics=True,
            )
        # Said, not silently dropped: metrics never wait for the device between periods.
        assert (
            "async_write_metrics=True is not needed"
            in info.call_args.args[0] % info.call_args.args[1:]
        )
        trainer.train(0, 6)
        assert [i for _, i in trainer.storage.history("total_loss").values()] == list(range(6))


def test_amp_trainer_takes_detectron2s_arguments():
    model = _TinyModel()
    trainer = AMPTrainer(
        model,
        _batches(),
        torch.optim.SGD(model.parameters(), 0.1),
        gather_metric_period=1,
        zero_grad_before_forward=True,
        grad_scaler=None,
        precision=torch.bfloat16,
        log_grad_scaler=False,
        async_write_metrics=False,
    )
    trainer.train(0, 2)


def test_write_metrics_is_a_static_method_filing_into_the_storage():
    from trainkit.utils.events import EventStorage

    with EventStorage(0) as storage:
        SimpleTrainer.write_metrics(
            {"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, 0.5, 7, prefix="val_"
        )
    assert storage.history("val_total_loss").values() == [(3.0, 7)]
    assert storage.history("a").values() == [(1.0, 7)]
    assert storage.history("data_time").values() == [(0.5, 7)]
    with EventStorage(0), pytest.raises(FloatingPointError):
        SimpleTrainer.write_metrics({"a": torch.tensor(float("nan"))}, 0.0, 3)


def _register_tiny_dataset():
    name = "_compat_engine_records"
    if name not in DatasetCatalog.list():
        DatasetCatalog.register(name, lambda: [{"x": [float(i)] * 4} for i in range(32)])
    return name


def test_default_trainer_model_property_has_a_setter(tmp_path):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "_TinyModel"
    cfg.DATASETS.TRAIN = (_register_tiny_dataset(),)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 0
    cfg.OUTPUT_DIR = str(tmp_path)
    trainer = DefaultTrainer(cfg)
    assert trainer.model is trainer._trainer.model
    trainer.model = _TinyModel()
    assert trainer.model is trainer._trainer.model
    optimizer = torch.optim.SGD(trainer.model.parameters(), 0.1)
    trainer.optimizer = optimizer
    assert trainer._trainer.optimizer is optimizer
    loader = _batches()
    trainer.data_loader = loader
    assert trainer.data_loader is loader and trainer._trainer.data_loader is loader


def test_checkpoint_resume_with_fvcore_checkpointer_and_torch_scheduler(tmp_path):
    model = _TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3)
    trainer = SimpleTrainer(model, _batches(), optimizer)
    checkpointer = FvcoreCheckpointer(model, str(tmp_path), opt=optimizer, trainer=trainer)
    trainer.register_hooks(
        [hooks.LRScheduler(scheduler=scheduler), hooks.PeriodicCheckpointer(checkpointer, 10)]
    )
    trainer.train(0, 12)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)
    assert scheduler.last_epoch == 12
    del trainer

    optimizer = torch.optim.SGD(model.parameters(), 999)
    trainer = SimpleTrainer(model, _batches(), optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3)
    trainer.register_hooks([hooks.LRScheduler(scheduler=scheduler)])
    checkpointer = FvcoreCheckpointer(model, str(tmp_path), opt=optimizer, trainer=trainer)
    checkpointer.resume_or_load("does_not_exist.pth")
    assert trainer.iter == 11
    assert scheduler.last_epoch == 12
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)


@pytest.mark.parametrize(
    ("total_iter", "period", "expected_calls"), [(30, 15, 2), (31, 15, 3), (20, 0, 1)]
)
def test_eval_hook_call_count(total_iter, period, expected_calls):
    test_func = mock.Mock(return_value={"metric": 3.0})
    trainer = _trainer()
    trainer.register_hooks([hooks.EvalHook(period, test_func)])
    trainer.train(0, total_iter)
    assert test_func.call_count == expected_calls


@pytest.mark.parametrize(
    ("mode", "values", "expected_saves"),
    [
        ("max", [0.3, 0.4, 0.35, 0.5], 3),
        ("min", [1.0, 0.8, 0.9, 0.9], 2),
        ("min", [math.nan, 0.8, 0.9, 0.9], 1),
    ],
)
def test_best_checkpointer_saves_on_improvement(tmp_path, mode, values, expected_saves):
    trainer = _trainer()
    checkpointer = FvcoreCheckpointer(trainer.model, str(tmp_path), trainer=trainer)
    metrics = iter(values)
    trainer.register_hooks(
        [
            hooks.EvalHook(10, lambda: {"metric": next(metrics)}),
            hooks.BestCheckpointer(10, checkpointer, "metric", mode=mode),
        ]
    )
    with mock.patch.object(checkpointer, "save") as save:
        trainer.train(0, 40)
    assert save.call_count == expected_saves


def test_default_setup_accepts_a_dict_of_args(tmp_path):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path / "yacs")
    default_setup(cfg, {})
    assert (tmp_path / "yacs" / "config.yaml").is_file()


def test_a_projects_write_metrics_override_runs_every_step_as_in_detectron2():
    # detectron2's run_step calls self._write_metrics(loss_dict, data_time); projects override
    # it (unbiased-teacher gathers its own metrics) and call the static write_metrics.
    class OwnMetrics(SimpleTrainer):
        def _write_metrics(self, loss_dict, data_time, prefix="", iter=None):
            self.seen.append((self.iter, sorted(loss_dict), data_time >= 0))
            SimpleTrainer.write_metrics(loss_dict, data_time, self.iter, prefix="own_")

    model = _TinyModel()
    trainer = OwnMetrics(model, _batches(), torch.optim.SGD(model.parameters(), 0.1))
    trainer.seen = []
    trainer.train(0, 3)
    assert trainer.seen == [(i, ["loss"], True) for i in range(3)]
    assert [i for _, i in trainer.storage.history("own_total_loss").values()] == [0, 1, 2]
    # The default implementation, bypassed, filed nothing of its own.
    assert "total_loss" not in trainer.storage.histories()
