import itertools
import json
import logging
import warnings

import pytest
import torch
from fvcore.common.param_scheduler import MultiStepParamScheduler
from torch import nn

from trainkit.engine import SimpleTrainer, hooks
from trainkit.engine.train_loop import HookBase, TrainerBase
from trainkit.utils.events import EventWriter, JSONWriter


class _Trainer(TrainerBase):
    """A trainer whose step only records an optional metric; enough to drive hooks."""

    def __init__(self, optimizer=None, step_fn=None):
        super().__init__()
        if optimizer is not None:
            self.optimizer = optimizer
        self._step_fn = step_fn

    def run_step(self):
        if self._step_fn is not None:
            self._step_fn(self)
        if hasattr(self, "optimizer"):
            self.optimizer.step()  # keeps torch's "scheduler before optimizer" warning away


class _RecordingWriter(EventWriter):
    def __init__(self):
        self.write_iters = []
        self.closed = False

    def write(self):
        from trainkit.utils.events import get_event_storage

        self.write_iters.append(get_event_storage().iter)

    def close(self):
        self.closed = True


def test_callback_hook_passes_the_trainer():
    calls = []
    trainer = _Trainer()
    trainer.register_hooks(
        [
            hooks.CallbackHook(
                before_train=lambda t: calls.append(("before_train", t.iter)),
                before_step=lambda t: calls.append(("before_step", t.iter)),
                after_step=lambda t: calls.append(("after_step", t.iter)),
                after_train=lambda t: calls.append(("after_train", t is trainer)),
            )
        ]
    )
    trainer.train(0, 2)
    assert calls == [
        ("before_train", 0),
        ("before_step", 0),
        ("after_step", 0),
        ("before_step", 1),
        ("after_step", 1),
        ("after_train", True),
    ]


def test_iteration_timer_with_fake_clock(caplog):
    # before_train, then (before_step, after_step) per step, then after_train.
    ticks = iter([0.0, 1.0, 3.0, 3.0, 3.5, 4.0, 4.25, 5.0, 6.0, 7.0])
    timer = hooks.IterationTimer(warmup_iter=1, clock=lambda: next(ticks))
    trainer = _Trainer()
    trainer.register_hooks([timer])
    with caplog.at_level(logging.INFO, logger=hooks.__name__):
        trainer.train(0, 4)
    times = trainer.storage.history("time").values()
    # With warmup_iter=1 the first step completes the warm-up and is timed (as detectron2).
    assert times == [(2.0, 0), (0.5, 1), (0.25, 2), (1.0, 3)]
    assert "4 iterations in 3.8 s (0.9375 s / it)" in caplog.text
    assert "Total training time: 7.0 s (3.2 s on hooks)" in caplog.text


def test_iteration_timer_counts_from_start_iter_on_resume():
    ticks = iter(float(i) for i in range(100))
    trainer = _Trainer()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=3, clock=lambda: next(ticks))])
    trainer.train(10, 14)
    # Steps 10 and 11 warm up; 12 (the third step of this call) is the first timed.
    assert [i for _, i in trainer.storage.history("time").values()] == [12, 13]


def test_periodic_writer_writes_at_period_ends_last_iter_and_final():
    writer = _RecordingWriter()
    trainer = _Trainer()
    trainer.register_hooks([hooks.PeriodicWriter([writer], period=3)])
    trainer.train(0, 8)
    # After iterations 2 and 5 (period ends), 7 (last), then the final write at max_iter.
    assert writer.write_iters == [2, 5, 7, 8]
    assert writer.closed


def test_periodic_writer_rejects_non_writers():
    with pytest.raises(TypeError, match="EventWriter"):
        hooks.PeriodicWriter([object()])


def test_eval_hook_flattens_nested_results_into_storage():
    calls = []

    def evaluate():
        calls.append(trainer.iter)
        return {"classification": {"top1": 0.5, "top5": torch.tensor(0.9)}, "loss": 2}

    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(2, evaluate)])
    trainer.train(0, 6)
    # Period ends 1 and 3; the last one (5) is replaced by the evaluation after training.
    assert calls == [1, 3, 6]
    latest = trainer.storage.latest()
    assert latest["classification/top1"] == (0.5, 6)
    assert latest["classification/top5"][0] == pytest.approx(0.9)
    assert latest["loss"] == (2.0, 6)


def test_eval_hook_without_eval_after_train_evaluates_the_last_period_end():
    calls = []
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(3, lambda: calls.append(trainer.iter), False)])
    trainer.train(0, 6)
    assert calls == [2, 5]


def test_eval_hook_rejects_non_numbers():
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"a": {"b": "high"}})])
    with pytest.raises(ValueError, match="a/b"):
        trainer.train(0, 1)


def test_eval_hook_skips_final_eval_after_a_failure():
    calls = []

    def fail(t):
        raise RuntimeError("step failed")

    trainer = _Trainer(step_fn=fail)
    trainer.register_hooks([hooks.EvalHook(1, lambda: calls.append(1))])
    with pytest.raises(RuntimeError, match="step failed"):
        trainer.train(0, 3)
    assert calls == []


def test_eval_hook_evaluates_after_a_project_loop_that_leaves_iter_at_the_last_step():
    # unbiased-teacher's own train_loop (written for older detectron2) never sets
    # iter = max_iter; its finished last step still earns the final evaluation.
    from trainkit.utils.events import EventStorage

    calls = []
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(2, lambda: calls.append(trainer.iter))])
    trainer.max_iter = 4
    with EventStorage(0) as trainer.storage:
        trainer.before_train()
        for trainer.iter in range(0, 4):
            trainer.before_step()
            trainer.run_step()
            trainer.after_step()
        trainer.after_train()
    assert calls == [1, 3]


def test_eval_hook_skips_final_eval_when_the_last_step_of_a_project_loop_fails():
    from trainkit.utils.events import EventStorage

    calls = []
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(2, lambda: calls.append(trainer.iter))])
    trainer.max_iter = 4
    with EventStorage(0) as trainer.storage:
        trainer.before_train()
        for trainer.iter in range(0, 3):  # the last step (3) never finishes
            trainer.before_step()
            trainer.after_step()
        trainer.after_train()
    assert calls == [1]


def test_eval_metric_from_after_train_reaches_metrics_json(tmp_path):
    path = tmp_path / "metrics.json"
    trainer = _Trainer(step_fn=lambda t: t.storage.put_scalar("total_loss", 1.0))
    trainer.register_hooks([hooks.PeriodicWriter([JSONWriter(str(path))], period=2)])
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"acc": 0.9})])
    trainer.train(0, 4)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[-1] == {"iteration": 4, "acc": 0.9}


def _sgd(lrs=(0.1,), sizes=(3,)):
    params = [
        {"params": [nn.Parameter(torch.zeros(1)) for _ in range(n)], "lr": lr}
        for lr, n in zip(lrs, sizes)
    ]
    return torch.optim.SGD(params, lr=lrs[0])


def test_lr_scheduler_records_lr_of_the_largest_group_then_steps():
    optimizer = _sgd(lrs=(1.0, 0.1), sizes=(1, 4))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    trainer = _Trainer(optimizer)
    trainer.register_hooks([hooks.LRScheduler(scheduler=scheduler)])
    trainer.train(0, 5)
    lrs = [lr for lr, _ in trainer.storage.history("lr").values()]
    assert lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])
    assert scheduler.last_epoch == 5


def test_lr_scheduler_wraps_a_param_scheduler_and_resumes_it():
    multiplier = MultiStepParamScheduler([1.0, 0.1], milestones=[3], num_updates=6)

    def build():
        optimizer = _sgd()
        trainer = _Trainer(optimizer)
        hook = hooks.LRScheduler(scheduler=multiplier)
        trainer.register_hooks([hook])
        return trainer, hook, optimizer

    trainer, _hook, optimizer = build()
    trainer.train(0, 4)
    state = trainer.state_dict()
    assert state["hooks"]["LRScheduler"]["last_epoch"] == 4

    resumed, resumed_hook, resumed_optimizer = build()
    # What SimpleTrainer.load_state_dict does; the optimizer state carries "initial_lr".
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(state)  # before train(): the LRMultiplier does not exist yet
    resumed.train(4, 6)
    lrs = [lr for lr, _ in resumed.storage.history("lr").values()]
    assert lrs == pytest.approx([0.01, 0.01])
    assert resumed_hook.scheduler.last_epoch == 6


def test_lr_scheduler_uses_trainer_scheduler_when_none_given():
    optimizer = _sgd()
    trainer = _Trainer(optimizer)
    trainer.scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer.register_hooks([hooks.LRScheduler()])
    trainer.train(0, 2)
    assert trainer.scheduler.last_epoch == 2

    bare = _Trainer()
    bare.register_hooks([hooks.LRScheduler()])
    # The error names the hook that needed it (a note on Python's own message).
    with pytest.raises(AttributeError, match=r"no attribute 'optimizer'\n.*LRScheduler\.before"):
        bare.train(0, 1)


class _FakeCheckpointer:
    def __init__(self):
        self.saves = []
        self.path_manager = None
        self.save_dir = ""
        self.save_to_disk = True

    def save(self, name, **extra):
        self.saves.append((name, extra))


def test_periodic_checkpointer_hook_saves_periodically_and_final():
    checkpointer = _FakeCheckpointer()
    trainer = _Trainer()
    trainer.register_hooks([hooks.PeriodicCheckpointer(checkpointer, period=2)])
    trainer.train(0, 5)
    names = [name for name, _ in checkpointer.saves]
    assert names == ["model_0000001", "model_0000003", "model_final"]
    assert checkpointer.saves[-1][1] == {"iteration": 4}


def test_best_checkpointer_saves_on_improvement_and_keeps_best_across_resume():
    scores = iter([0.5, 0.4, 0.7, 0.6])
    checkpointer = _FakeCheckpointer()

    def build():
        trainer = _Trainer()
        best = hooks.BestCheckpointer(2, checkpointer, "val/acc", mode="max")
        trainer.register_hooks([hooks.EvalHook(2, lambda: {"val": {"acc": next(scores)}}), best])
        return trainer, best

    trainer, best = build()
    trainer.train(0, 6)  # evals after iterations 1, 3 and after training
    assert [extra["iteration"] for _, extra in checkpointer.saves] == [1, 6]
    assert best.best_metric == 0.7

    resumed, resumed_best = build()
    resumed.load_state_dict(trainer.state_dict())
    resumed.train(6, 7)  # the final eval gives 0.6 < 0.7: no save
    assert len(checkpointer.saves) == 2
    assert resumed_best.best_iter == 6


def test_best_checkpointer_validates_mode():
    with pytest.raises(ValueError, match="mode"):
        hooks.BestCheckpointer(1, _FakeCheckpointer(), "acc", mode="best")


class _BNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(2, momentum=0.3)

    def forward(self, x):
        return self.bn(x)


def test_precise_bn_recomputes_statistics_as_an_equal_weight_average():
    torch.manual_seed(0)
    batches = [torch.randn(8, 2) * (i + 1) + i for i in range(4)]
    model = _BNModel()
    hook = hooks.PreciseBN(period=0, model=model, data_loader=batches, num_iter=4)
    trainer = _Trainer()
    trainer.register_hooks([hook])
    trainer.train(0, 2)  # runs once, at the last iteration
    expected_mean = torch.stack([b.mean(0) for b in batches]).mean(0)
    expected_var = torch.stack([b.var(0, unbiased=True) for b in batches]).mean(0)
    assert torch.allclose(model.bn.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(model.bn.running_var, expected_var, atol=1e-5)
    assert model.bn.momentum == 0.3


def test_precise_bn_reports_a_short_loader():
    hook = hooks.PreciseBN(period=1, model=_BNModel(), data_loader=[torch.randn(4, 2)], num_iter=3)
    trainer = _Trainer()
    trainer.register_hooks([hook])
    with pytest.raises(RuntimeError, match="ran out after 1 of 3"):
        trainer.train(0, 1)


def test_precise_bn_without_bn_does_nothing():
    hook = hooks.PreciseBN(period=1, model=nn.Linear(2, 2), data_loader=[], num_iter=3)
    trainer = _Trainer()
    trainer.register_hooks([hook])
    trainer.train(0, 2)


def test_torch_memory_stats_is_a_no_op_without_cuda(caplog):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU behaviour")
    trainer = _Trainer()
    trainer.register_hooks([hooks.TorchMemoryStats(period=1)])
    with caplog.at_level(logging.INFO, logger=hooks.__name__):
        trainer.train(0, 3)
    assert "CUDA is not available" in caplog.text
    assert not any(name.startswith("memory/") for name in trainer.storage.histories())


def test_torch_profiler_writes_a_chrome_trace_for_enabled_steps(tmp_path):
    trainer = _Trainer(step_fn=lambda t: torch.ones(4).sum())
    profiler = hooks.TorchProfiler(
        lambda t: t.iter == 1,
        str(tmp_path),
        activities=[torch.profiler.ProfilerActivity.CPU],
        save_tensorboard=False,
    )
    trainer.register_hooks([profiler])
    trainer.train(0, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["profiler-trace-iter1.json"]


def test_hooks_fail_clearly_when_not_registered():
    class Probe(HookBase):
        pass

    with pytest.raises(RuntimeError, match="Probe is not registered"):
        _ = Probe().trainer


def test_lr_scheduler_subclass_reads_detectron2s_attributes():
    # A detectron2 project replaces after_step and reads the optimizer and the index of the
    # recorded param group, as detectron2's hook sets them in before_train.
    seen = {}

    class LossDrivenLR(hooks.LRScheduler):
        def after_step(self):
            seen["lr"] = self._optimizer.param_groups[self._best_param_group_id]["lr"]
            self.scheduler.step()

    optimizer = _sgd(lrs=(1.0, 0.1), sizes=(1, 4))
    trainer = _Trainer(optimizer)
    trainer.scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer.register_hooks([LossDrivenLR()])
    trainer.train(0, 2)
    assert seen["lr"] == pytest.approx(0.05)  # group 1 (4 params), stepped once before
    assert hooks.LRScheduler.get_best_param_group_id(optimizer) == 1
    assert hooks.LRScheduler.get_best_param_group_id(_sgd(lrs=(0.1, 1.0), sizes=(1, 1))) == 1


class _HelperLR(torch.optim.lr_scheduler.StepLR):
    """A scheduler subclass that keeps a helper object: its state_dict sweeps it in."""

    def __init__(self, optimizer):
        super().__init__(optimizer, step_size=1, gamma=0.5)
        self._warmup = MultiStepParamScheduler([1.0, 0.1], milestones=[3], num_updates=6)


def test_hook_state_leaves_out_what_weights_only_cannot_load(caplog):
    optimizer = _sgd()
    trainer = _Trainer(optimizer)
    trainer.scheduler = _HelperLR(optimizer)
    trainer.register_hooks([hooks.LRScheduler()])
    trainer.train(0, 3)
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.hook_base"):
        state = trainer.state_dict()["hooks"]["LRScheduler"]
        trainer.state_dict()
    assert "_warmup" not in state and state["last_epoch"] == 3
    # Only this hook's records: other loggers may warn too, depending on the tests run before.
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainkit.engine.hook_base"]
    assert len(warnings) == 1  # once per entry, not at every checkpoint
    assert (
        "state['_warmup'] is a fvcore.common.param_scheduler.MultiStepParamScheduler"
        in (warnings[0])
    )

    resumed = _Trainer(_sgd())
    resumed.scheduler = _HelperLR(resumed.optimizer)
    resumed.register_hooks([hooks.LRScheduler()])
    resumed.load_state_dict(trainer.state_dict())
    assert resumed.scheduler.last_epoch == 3
    assert isinstance(resumed.scheduler._warmup, MultiStepParamScheduler)  # the constructor's


def test_model_ema_update_matches_torchs_averaged_model():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from trainkit.engine.hooks.ema import _tensor_pairs, _update_average

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    make = lambda: AveragedModel(  # noqa: E731
        model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True
    )
    ours, torchs = make(), make()
    for _ in range(3):
        model(torch.randn(8, 3))  # moves the BN statistics and num_batches_tracked
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        _update_average(
            _tensor_pairs(ours.module, model), ours.n_averaged, get_ema_multi_avg_fn(0.9)
        )
        torchs.update_parameters(model)
    for a, b in zip(ours.state_dict().values(), torchs.state_dict().values()):
        assert torch.equal(a, b)
    assert int(ours.n_averaged) == 3 and ours.n_averaged.device.type == "cpu"


def test_device_wait_counter_tells_the_models_waits_from_the_trainers(caplog):
    from trainkit.engine.hooks import DeviceWaitCounter
    from trainkit.utils.torch_private import CUDA_SYNC_WARNING as SYNC_WARNING

    class _WaitingModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)
            self.calls = 0

        def forward(self, batch):
            if self.calls in (1, 2, 4):  # what set_sync_debug_mode("warn") says at a wait
                warnings.warn(SYNC_WARNING, stacklevel=1)
            self.calls += 1
            return {"loss": self.linear(batch).square().mean()}

    def hook_waits(trainer):
        if trainer.iter == 2:
            warnings.warn(SYNC_WARNING, stacklevel=1)

    model = _WaitingModel()
    trainer = SimpleTrainer(
        model, itertools.repeat(torch.ones(4, 2)), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    counter = DeviceWaitCounter(period=5, warmup_iter=1)
    trainer.register_hooks([counter, hooks.CallbackHook(after_step=hook_waits)])
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.hooks.device_waits"):
        trainer.train(0, 8)
    # Step 0 warms up, step 4 ends a period (and 7 is the last): not counted.
    assert counter.waits == {"model": 2, "trainer": 1}
    assert counter.num_steps_counted == 5
    assert "Iteration 1 waited for the device" in caplog.text and "the model's" in caplog.text
    assert "Iteration 2 waited for the device" in caplog.text and "the trainer's" in caplog.text
