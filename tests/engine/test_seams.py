"""The core's seams: one set of parts, one step with one event channel.

* a trainer built the unbiased-teacher way (``DefaultTrainer.__init__`` skipped) trains with
  DefaultTrainer's own ``build_hooks``, and a part it forgot is named in one line;
* ``trainer.data_loader is trainer._trainer.data_loader``;
* each phase is announced once per iteration, whatever ``ACCUMULATE_STEPS``, on 2 processes;
* a hook's exception carries the hook's name and is not captured as a failing step.
"""

import collections
import os

import pytest
import torch

from tests.dist import run_on_ranks
from tests.engine.test_default_trainer import RegressionTrainer, _cfg
from trainkit.checkpoint import DetectionCheckpointer
from trainkit.engine import DefaultTrainer, SimpleTrainer, TrainerBase, hooks
from trainkit.engine.events import StepListener
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError


class SkipsInit(RegressionTrainer):
    """unbiased-teacher's way: TrainerBase.__init__, the parts by hand, DefaultTrainer's hooks."""

    forget = ""

    def __init__(self, cfg):
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        data_loader = self.build_train_loader(cfg)
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        TrainerBase.__init__(self)
        parts = {
            "_trainer": SimpleTrainer(model, data_loader, optimizer),
            "scheduler": self.build_lr_scheduler(cfg, optimizer),
            "checkpointer": DetectionCheckpointer(model, cfg.OUTPUT_DIR, optimizer=optimizer),
            "start_iter": 0,
            "max_iter": cfg.SOLVER.MAX_ITER,
            "cfg": cfg,
        }
        for name, value in parts.items():
            if name != self.forget:
                setattr(self, name, value)
        self.register_hooks(self.build_hooks())


def test_a_trainer_that_skips_init_trains_with_default_trainers_hooks(tmp_path):
    seed_all_rng(7)
    trainer = SkipsInit(_cfg(tmp_path, max_iter=6, workers=0))
    names = [type(h).__name__ for h in trainer.hooks]
    assert names[:2] == ["IterationTimer", "LRScheduler"] and "PeriodicCheckpointer" in names
    assert trainer.model_ema is None and not trainer.watchdog.enabled  # the defaults
    assert trainer.data_loader is trainer._trainer.data_loader
    trainer.train()
    assert trainer.iter == 6
    assert os.path.isfile(tmp_path / "model_final.pth")  # its own checkpointer, every rank
    history = trainer.storage.history("loss_mse").values()
    assert [i for _, i in history] == list(range(6))


@pytest.mark.parametrize("missing", ["_trainer", "cfg", "checkpointer", "scheduler", "max_iter"])
def test_a_part_a_trainer_that_skips_init_forgot_is_named_in_one_line(tmp_path, missing):
    class Forgets(SkipsInit):
        forget = missing

    with pytest.raises(UsageError) as raised:
        Forgets(_cfg(tmp_path, max_iter=6, workers=0))
    message = str(raised.value)
    assert f"Forgets.{missing} is not set" in message and "\n" not in message


def test_the_loader_is_the_steps_also_when_replaced(tmp_path):
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=2, workers=0))
    assert trainer.data_loader is trainer._trainer.data_loader
    other = trainer.build_train_loader(trainer.cfg)
    trainer.data_loader = other
    assert trainer.data_loader is other and trainer._trainer.data_loader is other


class _Phases(StepListener):
    def __init__(self):
        self.seen = []

    def on_phase(self, phase, iteration):
        self.seen.append((iteration, phase))


def _phases_per_iteration(output_dir):
    seed_all_rng(7 + comm.get_rank())
    cfg = _cfg(output_dir, max_iter=4, workers=0, accumulate=3)
    cfg.defrost()
    cfg.SOLVER.IMS_PER_BATCH = 12
    cfg.SOLVER.CHECKPOINT_PERIOD = 100  # only model_final, after the last step
    cfg.TEST.EVAL_PERIOD = 0
    cfg.DATASETS.TEST = ()
    cfg.freeze()
    trainer = RegressionTrainer(cfg)
    listener = _Phases()
    trainer.events.subscribe(listener)
    trainer.train()
    counts = collections.Counter(listener.seen)
    return {i: {p: counts[(i, p)] for p in {p for j, p in counts if j == i}} for i in range(3)}


@pytest.mark.distributed
def test_each_phase_is_announced_once_per_iteration_with_accumulation_on_two_processes(tmp_path):
    per_rank = run_on_ranks(_phases_per_iteration, 2, args=(str(tmp_path),), timeout_s=120)
    once = {"data": 1, "forward/backward": 1, "collective": 1, "optimizer": 1, "hooks": 1}
    for phases in per_rank:
        assert phases == {0: once, 1: once, 2: once}


class _FailsAt(hooks.HookBase):
    def after_step(self):
        if self.trainer.iter == 2:
            raise ValueError("the evaluator could not read its metric")


def test_a_hooks_exception_is_named_and_not_captured_as_a_failing_step(tmp_path):
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=6, workers=0))
    trainer.register_hooks([_FailsAt()])
    with pytest.raises(ValueError, match="could not read") as raised:
        trainer.train()
    assert "(raised in hook _FailsAt.after_step at iteration 2)" in raised.value.__notes__
    assert not any("failing step" in note for note in raised.value.__notes__)
    assert not (tmp_path / "failed_steps").exists()


class _BadBatch(RegressionTrainer):
    def run_step(self):
        if self.iter == 2:
            raise ValueError("a step that raises")
        super().run_step()


def test_what_the_step_raises_is_captured(tmp_path):
    trainer = _BadBatch(_cfg(tmp_path, max_iter=6, workers=0))
    with pytest.raises(ValueError, match="a step that raises") as raised:
        trainer.train()
    assert any("failed_steps/iter_2" in note for note in raised.value.__notes__)
    assert (tmp_path / "failed_steps" / "iter_2" / "step.json").is_file()


def test_a_step_trainer_and_its_replacement_do_not_both_listen(tmp_path):
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=3, workers=0))
    first = trainer._trainer
    trainer._trainer = SimpleTrainer(trainer.model, trainer.data_loader, trainer.optimizer)
    assert first._metrics not in trainer.events.listeners
    assert trainer._trainer._metrics in trainer.events.listeners
    trainer.train()
    # One writer filed each step once.
    assert [i for _, i in trainer.storage.history("loss_mse").values()] == [0, 1, 2]
    assert torch.isfinite(torch.tensor(trainer.storage.history("loss_mse").latest()))


class _FailsAfterBackward(hooks.HookBase):
    def after_backward(self):
        if self.trainer.iter == 1:
            raise ValueError("a gradient hook that raises")


def test_an_after_backward_hooks_exception_is_the_hooks_too(tmp_path):
    # It runs inside the step, but it is the hook that failed, not the step's records.
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=4, workers=0))
    trainer.register_hooks([_FailsAfterBackward()])
    with pytest.raises(ValueError, match="gradient hook") as raised:
        trainer.train()
    assert "(raised in hook _FailsAfterBackward.after_backward at iteration 1)" in (
        raised.value.__notes__
    )
    assert trainer.step_error is None and not (tmp_path / "failed_steps").exists()
