"""DefaultTrainer: a user subclass for a non-vision task, writers, and exact resume.

The regression task below is what the README's "new task" example shows: a model, a loader
with a mapper that uses per-sample randomness, and an evaluator, each supplied by
overriding one ``build_*`` classmethod.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, build_train_loader, sample_rng
from trainkit.data.plans.mixed_sampler import mix_counts
from trainkit.engine import DefaultTrainer, SimpleTrainer, hooks
from trainkit.evaluation import DatasetEvaluator
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng

_TRUE_W = torch.tensor([1.5, -2.0, 0.5, 3.0])


def _records(n=256, seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(n, 4)).astype(np.float32)
    return [{"x": x.tolist(), "y": float(x @ _TRUE_W.numpy()), "width": 1, "height": 1} for x in xs]


def _noisy_mapper(record):
    # per-sample randomness: the same noise whatever worker maps it, before or after resume
    x = torch.tensor(record["x"]) + 0.01 * torch.from_numpy(sample_rng().normal(size=4)).float()
    return {"x": x, "y": torch.tensor(record["y"])}


class RegressionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.dropout = nn.Dropout(0.1)  # consumes the torch RNG: resume must restore it
        self.out = nn.Linear(16, 1)

    def forward(self, batch):
        x = torch.stack([b["x"] for b in batch])
        pred = self.out(self.dropout(torch.relu(self.hidden(x)))).squeeze(1)
        if not self.training:
            return pred
        y = torch.stack([b["y"] for b in batch])
        return {"loss_mse": nn.functional.mse_loss(pred, y)}


class MSEEvaluator(DatasetEvaluator):
    def reset(self):
        self._sq, self._n = 0.0, 0

    def process(self, inputs, outputs):
        y = torch.stack([b["y"] for b in inputs])
        self._sq += float(((outputs - y) ** 2).sum())
        self._n += len(inputs)

    def evaluate(self):
        parts = comm.gather((self._sq, self._n))
        if not comm.is_main_process():
            return {}
        return {"regression": {"mse": sum(s for s, _ in parts) / sum(n for _, n in parts)}}


class RegressionTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return RegressionModel()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_noisy_mapper, dataset=_records())

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        from trainkit.data import build_batch_data_loader
        from trainkit.data.common import DatasetFromList, MapDataset
        from trainkit.data.samplers import InferenceSampler

        records = _records(64, seed=1)
        data = MapDataset(
            DatasetFromList(records),
            lambda r: {"x": torch.tensor(r["x"]), "y": torch.tensor(r["y"])},
        )
        return build_batch_data_loader(
            data, InferenceSampler(len(records)), 8 * comm.get_world_size(), drop_last=False
        )

    @classmethod
    def build_evaluator(cls, cfg, dataset_name):
        return MSEEvaluator()


class _StopAt(hooks.CallbackHook):
    """Simulate a crash right after iteration ``k`` (after its checkpoint was written)."""

    def __init__(self, k):
        def after_step(trainer):
            if trainer.iter == k:
                raise KeyboardInterrupt(f"simulated stop after iteration {k}")

        super().__init__(after_step=after_step)


def _cfg(output_dir, max_iter=12, workers=2, accumulate=1, checkpoint_async=False):
    cfg = get_cfg()
    cfg.SOLVER.CHECKPOINT_ASYNC = checkpoint_async
    cfg.SOLVER.ACCUMULATE_STEPS = accumulate
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.SEED = 3
    cfg.DATASETS.TEST = ("regression_val",)
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.BASE_LR = 0.05
    cfg.SOLVER.MAX_ITER = max_iter
    cfg.SOLVER.STEPS = (8,)
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.CHECKPOINT_PERIOD = 5
    cfg.TEST.EVAL_PERIOD = 6
    cfg.WRITER_PERIOD = 3
    return cfg


def _train(
    output_dir,
    resume=False,
    stop_after=None,
    max_iter=12,
    workers=2,
    accumulate=1,
    checkpoint_async=False,
    seed=3,
):
    seed_all_rng(7 + comm.get_rank())  # what default_setup does in a real script
    cfg = _cfg(output_dir, max_iter, workers, accumulate, checkpoint_async)
    cfg.SEED = seed
    trainer = RegressionTrainer(cfg)
    if stop_after is not None:
        trainer.register_hooks([_StopAt(stop_after)])
    trainer.resume_or_load(resume=resume)
    try:
        results = trainer.train()
    except KeyboardInterrupt:
        results = None
    weights = {k: v.clone() for k, v in trainer.checkpointer.model.state_dict().items()}
    opt = trainer.optimizer.state_dict()["state"]
    return {
        "weights": weights,
        "momentum": [opt[k]["momentum_buffer"] for k in sorted(opt)],
        "results": results,
        "start_iter": trainer.start_iter,
    }


def _assert_same(a, b):
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    assert all(torch.equal(x, y) for x, y in zip(a["momentum"], b["momentum"]))


def test_user_subclass_trains_evaluates_and_writes(tmp_path):
    out = _train(tmp_path, max_iter=40, workers=0)
    assert out["results"]["regression"]["mse"] < 5.0
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert {"total_loss", "loss_mse", "lr", "data_time"} <= set(lines[-1]) | set(lines[-2])
    assert any("regression/mse" in line for line in lines)
    losses = [line["total_loss"] for line in lines if "total_loss" in line]
    assert losses[-1] < losses[0]
    assert (tmp_path / "model_final.pth").exists()
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path))


def test_exact_resume_single_process(tmp_path):
    straight = _train(tmp_path / "straight")
    partial = _train(tmp_path / "resumed", stop_after=4)
    assert partial["results"] is None
    resumed = _train(tmp_path / "resumed", resume=True)
    assert resumed["start_iter"] == 5
    _assert_same(straight, resumed)


def test_a_random_seed_run_resumes_its_own_data_stream(tmp_path):
    # SEED -1 draws a new seed in every process; the resumed run continues the stream of the
    # seed its checkpoint was written with (resume_or_load rebuilds the loader for it).
    _train(tmp_path / "resumed", stop_after=4, workers=0, seed=-1)
    saved = torch.load(tmp_path / "resumed" / "model_0000004.pth", weights_only=True)
    seed = saved["trainer"]["seed"]
    assert seed >= 0
    resumed = _train(tmp_path / "resumed", resume=True, workers=0, seed=-1)
    straight = _train(tmp_path / "straight", workers=0, seed=seed)
    _assert_same(straight, resumed)


def test_exact_resume_with_accumulation(tmp_path):
    straight = _train(tmp_path / "straight", accumulate=2)
    _train(tmp_path / "resumed", stop_after=4, accumulate=2)
    resumed = _train(tmp_path / "resumed", resume=True, accumulate=2)
    assert resumed["start_iter"] == 5
    _assert_same(straight, resumed)
    # ... and accumulation really changed the run (4-image micro-batches, 2 per step).
    assert any(
        not torch.equal(straight["weights"][k], v)
        for k, v in _train(tmp_path / "plain")["weights"].items()
    )


def _record_writer_threads(monkeypatch):
    """Make torch.save record the name of the thread that writes each checkpoint."""
    import threading

    real_save, threads = torch.save, []

    def save(obj, f, *args, **kwargs):
        threads.append(threading.current_thread().name)
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    return threads


def test_exact_resume_with_async_checkpoints(tmp_path, monkeypatch):
    straight = _train(tmp_path / "straight", workers=0)
    writer_threads = _record_writer_threads(monkeypatch)
    _train(tmp_path / "resumed", stop_after=4, workers=0, checkpoint_async=True)
    assert (tmp_path / "resumed" / "last_checkpoint").read_text() == "model_0000004.pth"
    resumed = _train(tmp_path / "resumed", resume=True, workers=0, checkpoint_async=True)
    assert resumed["start_iter"] == 5
    # model_0000004, then model_0000009 and model_final: all written in the background
    assert len(writer_threads) == 3
    assert all(name.startswith("trainkit-ckpt-writer") for name in writer_threads)
    _assert_same(straight, resumed)
    # train() returned with the final checkpoint on disk, tagged
    assert (tmp_path / "resumed" / "last_checkpoint").read_text() == "model_final.pth"
    final = torch.load(tmp_path / "resumed" / "model_final.pth", weights_only=True)["model"]
    assert all(torch.equal(final[k], v) for k, v in straight["weights"].items())


def test_async_checkpoint_blocks_training_only_for_the_copy_in_the_checkpoint_phase(
    tmp_path, monkeypatch
):
    import threading

    from trainkit.checkpoint._background import HostStaging

    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=8, workers=0, checkpoint_async=True))
    phases, gate, steps_during_write = [], threading.Event(), []
    real_copy, real_save = HostStaging.copy, torch.save

    def recording_copy(self, state):
        phases.append(trainer.events.current_phase)
        return real_copy(self, state)

    def gated_save(obj, f, *args, **kwargs):
        assert gate.wait(timeout=60)
        real_save(obj, f, *args, **kwargs)

    def after_step(t):
        if t.checkpointer.write_pending:
            steps_during_write.append(t.iter)
        if t.iter == 6:
            gate.set()  # the write of model_0000004 was blocked for two more steps

    monkeypatch.setattr(HostStaging, "copy", recording_copy)
    monkeypatch.setattr(torch, "save", gated_save)
    trainer.register_hooks([hooks.CallbackHook(after_step=after_step)])
    trainer.train()
    assert phases == ["checkpoint", "checkpoint"]  # model_0000004 and model_final
    assert steps_during_write[:3] == [4, 5, 6]  # training went on while model_0000004 was written
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"


def _two_rank_run(output_dir, mode):
    if mode == "straight":
        out = _train(output_dir)
    elif mode == "stop":
        out = _train(output_dir, stop_after=4)
    else:
        out = _train(output_dir, resume=True)
    return {k: out[k] for k in ("weights", "momentum", "start_iter")}


# In slow runs: the default run's two-process exact resume is the SIGTERM test below (stopped
# by a signal on one rank, resumed on two, equal to a straight run).
@pytest.mark.slow
@pytest.mark.distributed
def test_exact_resume_two_processes(tmp_path):
    straight = run_on_ranks(_two_rank_run, 2, args=(str(tmp_path / "a"), "straight"), timeout_s=120)
    run_on_ranks(_two_rank_run, 2, args=(str(tmp_path / "b"), "stop"), timeout_s=120)
    resumed = run_on_ranks(_two_rank_run, 2, args=(str(tmp_path / "b"), "resume"), timeout_s=120)
    assert resumed[0]["start_iter"] == 5
    for rank in range(2):
        _assert_same(straight[rank], resumed[rank])


def test_without_rng_restore_resume_differs(tmp_path, monkeypatch):
    """Guard against a vacuous equality test: dropping the RNG restore must break it."""
    straight = _train(tmp_path / "straight")
    _train(tmp_path / "resumed", stop_after=4)
    import trainkit.engine.run_state as run_state

    monkeypatch.setattr(run_state, "set_rng_state", lambda state: None)
    resumed = _train(tmp_path / "resumed", resume=True)
    assert any(
        not torch.equal(straight["weights"][k], resumed["weights"][k]) for k in straight["weights"]
    )


def test_unscalable_config_refused(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 3
    with pytest.raises(ValueError, match="not divisible by SOLVER.REFERENCE_WORLD_SIZE=3"):
        RegressionTrainer(cfg)


class _SignalAt(hooks.CallbackHook):
    """Send SIGTERM to this process after iteration ``k`` on rank ``rank`` only."""

    def __init__(self, k, rank=0):
        import signal

        def after_step(trainer):
            if trainer.iter == k and comm.get_rank() == rank:
                os.kill(os.getpid(), signal.SIGTERM)

        super().__init__(after_step=after_step)


def _train_with_signal(output_dir, k, rank=0, checkpoint_async=False):
    from trainkit.engine.hooks.preemption import TrainingPreempted

    seed_all_rng(7 + comm.get_rank())
    trainer = RegressionTrainer(_cfg(output_dir, checkpoint_async=checkpoint_async))
    # registered first so the signal arrives before the PreemptionHandler's check
    trainer._hooks.insert(0, _SignalAt(k, rank))
    trainer._hooks[0].trainer = trainer
    trainer.resume_or_load(resume=False)
    try:
        trainer.train()
    except TrainingPreempted as e:
        return {"iteration": e.iteration, "tag": (Path(output_dir) / "last_checkpoint").read_text()}
    return None


def test_sigterm_saves_and_stops_then_resume_is_exact(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    stopped = _train_with_signal(tmp_path / "pre", k=3)
    assert stopped == {"iteration": 3, "tag": "model_0000003.pth"}
    assert signal.getsignal(signal.SIGTERM) is before  # handler restored
    resumed = _train(tmp_path / "pre", resume=True)
    assert resumed["start_iter"] == 4
    _assert_same(_train(tmp_path / "straight"), resumed)


def test_sigterm_with_async_checkpoints_stops_only_once_the_checkpoint_is_written(
    tmp_path, monkeypatch
):
    import threading
    import time

    import trainkit.engine.hooks.preemption as preemption

    real_save = torch.save
    tag = tmp_path / "pre" / "last_checkpoint"
    tags_at_barrier = []

    def slow_save(obj, f, *args, **kwargs):
        assert threading.current_thread().name.startswith("trainkit-ckpt-writer")
        time.sleep(0.3)  # a write still in progress when a non-waiting stop would go on
        real_save(obj, f, *args, **kwargs)

    def barrier():
        # what every rank waits for before the job stops and gets killed
        tags_at_barrier.append(tag.read_text() if tag.exists() else None)

    monkeypatch.setattr(torch, "save", slow_save)
    monkeypatch.setattr(preemption.comm, "synchronize", barrier)
    stopped = _train_with_signal(tmp_path / "pre", k=3, checkpoint_async=True)
    assert stopped == {"iteration": 3, "tag": "model_0000003.pth"}
    assert tags_at_barrier == ["model_0000003.pth"]
    monkeypatch.setattr(torch, "save", real_save)
    resumed = _train(tmp_path / "pre", resume=True)
    assert resumed["start_iter"] == 4
    _assert_same(_train(tmp_path / "straight"), resumed)


def _two_rank_signal(output_dir):
    return _train_with_signal(output_dir, k=2, rank=1)


@pytest.mark.distributed
def test_sigterm_on_one_rank_stops_all_ranks_at_the_same_iteration(tmp_path):
    stopped = run_on_ranks(_two_rank_signal, 2, args=(str(tmp_path),), timeout_s=120)
    # ranks agree on the flag every 5 iterations: the signal after iteration 2 stops both after 4
    assert [s["iteration"] for s in stopped] == [4, 4]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    resumed = run_on_ranks(_two_rank_run, 2, args=(str(tmp_path), "resume"), timeout_s=120)
    straight = run_on_ranks(_two_rank_run, 2, args=(str(tmp_path / "s"), "straight"), timeout_s=120)
    for rank in range(2):
        _assert_same(straight[rank], resumed[rank])


def _flaky_mapper(record):
    if record["x"][0] > 1.0:  # about 16 % of the records "cannot be read"
        return None
    return _noisy_mapper(record)


class FlakyDataTrainer(RegressionTrainer):
    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_flaky_mapper, dataset=_records())


def test_skipped_records_are_counted_in_metrics(tmp_path, caplog):
    seed_all_rng(0)
    trainer = FlakyDataTrainer(_cfg(tmp_path, max_iter=9, workers=2))
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    counts = [x["data/skipped_records"] for x in lines if "data/skipped_records" in x]
    assert counts and counts[-1] > 0 and counts == sorted(counts)


_MIXED = ("regression_a", "regression_b", "regression_c")


class MixedDataTrainer(RegressionTrainer):
    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_noisy_mapper)  # DATASETS.TRAIN, mixed


def test_mixed_sets_report_their_epoch_and_records_in_metrics(tmp_path):
    records = _records()
    for i, name in enumerate(_MIXED):  # 128, 96 and 32 records
        part = records[[0, 128, 224, 256][i] : [0, 128, 224, 256][i + 1]]
        DatasetCatalog.register(name, lambda part=part: part)
    try:
        cfg = _cfg(tmp_path, max_iter=9, workers=0)
        cfg.DATASETS.TRAIN, cfg.DATASETS.TRAIN_WEIGHTS = _MIXED, (10.0, 5.0, 1.0)
        seed_all_rng(0)
        MixedDataTrainer(cfg).train()
    finally:
        for name in _MIXED:
            DatasetCatalog.remove(name)
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    written = {x["iteration"]: x for x in lines if "data/regression_c/records" in x}
    taken, expected = [0, 0, 0], {}
    for step in range(9):
        counts = mix_counts(8, [10, 5, 1], step, taken)
        taken = [t + n for t, n in zip(taken, counts)]
        expected[step] = counts, [t / size for t, size in zip(taken, (128, 96, 32))]
    assert sorted(written) == [2, 5, 8]  # the writer period (3)
    for step, line in written.items():
        counts, epochs = expected[step]
        assert [line[f"data/{n}/records"] for n in _MIXED] == counts
        assert [line[f"data/{n}/epoch"] for n in _MIXED] == pytest.approx(epochs)


class _GradNormHook(hooks.HookBase):
    """Sees the gradients between backward and the optimizer step (clipping would go here)."""

    def __init__(self):
        self.seen = []

    def after_backward(self):
        grads = [p.grad for p in self.trainer.model.parameters()]
        self.seen.append((self.trainer.iter, all(g is not None for g in grads)))


def test_after_backward_hooks_run_inside_default_trainer_steps(tmp_path):
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=4, workers=0))
    hook = _GradNormHook()
    trainer.register_hooks([hook])
    trainer.train()
    assert hook.seen == [(i, True) for i in range(4)]


class _CountingStep(SimpleTrainer):
    """detectron2's way of customising the step: a SimpleTrainer subclass as _trainer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps_run = []

    def run_step(self):
        self.steps_run.append(self.iter)
        super().run_step()


class _CustomStepTrainer(RegressionTrainer):
    def __init__(self, cfg):
        super().__init__(cfg)
        self._trainer = _CountingStep(self.model, self.data_loader, self.optimizer)


def test_a_custom_step_trainer_runs_inside_default_trainer_with_its_hooks(tmp_path):
    trainer = _CustomStepTrainer(_cfg(tmp_path, max_iter=4, workers=0))
    hook = _GradNormHook()
    trainer.register_hooks([hook])
    trainer.train()
    assert trainer._trainer.steps_run == [0, 1, 2, 3]  # it sees the loop's iteration
    assert hook.seen == [(i, True) for i in range(4)]  # and the loop's hooks
    assert trainer._trainer.storage is trainer.storage
    state = trainer.state_dict()
    assert set(state["_trainer"]) == {"optimizer", "parameter_names"}  # the loop's saved once


def test_an_assigned_step_adopts_the_configs_wiring(tmp_path):
    """detectron2's `self._trainer = SimpleTrainer(model, loader, optimizer)` keeps the recipe."""
    cfg = _cfg(tmp_path, max_iter=7, workers=0, accumulate=2)
    cfg.WATCHDOG_TIMEOUT_S = 600.0

    class Trainer(RegressionTrainer):
        def __init__(self, cfg):
            super().__init__(cfg)
            first = self._trainer
            self._trainer_built_first = first.events.step_listeners
            self._trainer = SimpleTrainer(
                self.model, self._trainer.data_loader, self.optimizer, accumulate_steps=2
            )

    trainer = Trainer(cfg)
    step = trainer._trainer
    assert step.gather_metric_period == cfg.WRITER_PERIOD == 3
    assert step.record_every_step
    assert step.data_loader is trainer.data_loader  # no wrapper: the step announces 'data'
    # The step announces its phases on the loop's events, which the watchdog hears, and its
    # own listeners replaced those of the step built in __init__; one process: no stragglers.
    assert step.events is trainer.events
    assert trainer.watchdog in trainer.events.listeners
    assert trainer.events.step_listeners == [step._loss_check, step._metrics]
    assert not {*trainer._trainer_built_first} & {*trainer.events.listeners}
    assert trainer.stragglers is None
    trainer.train()
    # Every step's loss is recorded (synchronised every WRITER_PERIOD = 3 steps, at the end).
    assert [it for _, it in trainer.storage.history("loss_mse").values()] == list(range(7))
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines if "loss_mse" in line] == [2, 5, 6]


@pytest.mark.parametrize(
    ("setting", "step_kwargs", "key"),
    [
        ({"accumulate": 2}, {}, "SOLVER.ACCUMULATE_STEPS is 2"),
        ({}, {"accumulate_steps": 2}, "SOLVER.ACCUMULATE_STEPS is 1"),
        ({"amp": True}, {}, "SOLVER.AMP.ENABLED is True"),
    ],
)
def test_an_assigned_step_that_changes_the_update_is_refused(tmp_path, setting, step_kwargs, key):
    from trainkit.utils import UsageError

    cfg = _cfg(tmp_path, max_iter=2, workers=0, accumulate=setting.get("accumulate", 1))
    cfg.SOLVER.AMP.ENABLED = setting.get("amp", False)
    trainer = RegressionTrainer(cfg)
    with pytest.raises(UsageError, match=key) as info:
        trainer._trainer = SimpleTrainer(
            trainer.model, trainer.data_loader, trainer.optimizer, **step_kwargs
        )
    assert "\n" not in str(info.value) and "DefaultTrainer._trainer" in str(info.value)


def test_an_assigned_amp_step_with_another_precision_is_refused(tmp_path):
    from trainkit.engine import AMPTrainer
    from trainkit.utils import UsageError

    cfg = _cfg(tmp_path, max_iter=2, workers=0)
    cfg.SOLVER.AMP.ENABLED = True
    trainer = RegressionTrainer(cfg)
    with pytest.raises(UsageError, match="autocasts to torch.float16"):
        trainer._trainer = AMPTrainer(
            trainer.model, trainer.data_loader, trainer.optimizer, precision=torch.float16
        )
    trainer._trainer = AMPTrainer(trainer.model, trainer.data_loader, trainer.optimizer)


def test_hooks_run_by_priority_and_the_order_is_logged(tmp_path, caplog):
    import logging

    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=2, workers=0))

    class Late(hooks.HookBase):
        pass

    class Early(hooks.HookBase):
        priority = hooks.HookPriority.HIGH

    trainer.register_hooks([Late(), Early()])
    names = [type(h).__name__ for h in trainer.hooks]
    assert names.index("Early") < names.index("PeriodicCheckpointer") < names.index("Late")
    assert names[-1] == "PeriodicWriter"
    with caplog.at_level(logging.INFO, logger="trainkit.engine.trainer_base"):
        trainer.train()
    assert (
        "Hooks, in the order they run: ProgressWatchdog (priority 0), IterationTimer (priority 0)"
        in caplog.text
    )


def test_build_hooks_keeps_detectron2s_positions(tmp_path):
    # Projects index the list: [1] = their own LR hook, insert(-1) = before the writer.
    trainer = RegressionTrainer(_cfg(tmp_path, max_iter=2, workers=0))
    built = trainer.build_hooks()
    assert isinstance(built[0], hooks.IterationTimer)
    assert type(built[1]) is hooks.LRScheduler
    assert built[2] is None  # PreciseBN's slot, off here
    assert isinstance(built[-1], hooks.PeriodicWriter)

    class ValLoss(hooks.HookBase):
        pass

    class PlateauLR(hooks.LRScheduler):
        pass

    class Trainer(RegressionTrainer):
        def build_hooks(self):
            built = super().build_hooks()
            built[1] = PlateauLR()
            built.insert(-1, ValLoss())
            return built

    names = [type(h).__name__ for h in Trainer(_cfg(tmp_path, max_iter=2, workers=0)).hooks]
    assert names[:3] == ["ProgressWatchdog", "IterationTimer", "PlateauLR"]
    assert "LRScheduler" not in names
    assert names[-2:] == ["ValLoss", "PeriodicWriter"]


def _ema_cfg(output_dir, **kwargs):
    cfg = _cfg(output_dir, **kwargs)
    cfg.MODEL_EMA.ENABLED = True
    cfg.MODEL_EMA.DECAY = 0.9
    return cfg


def _train_ema(output_dir, resume=False, stop_after=None, use_for_eval=False):
    seed_all_rng(7)
    cfg = _ema_cfg(output_dir, workers=0)
    cfg.MODEL_EMA.USE_FOR_EVAL = use_for_eval
    trainer = RegressionTrainer(cfg)
    if stop_after is not None:
        trainer.register_hooks([_StopAt(stop_after)])
    trainer.resume_or_load(resume=resume)
    try:
        results = trainer.train()
    except KeyboardInterrupt:
        results = None
    return trainer, results


def test_ema_is_the_average_of_the_weights_and_resume_is_bit_exact(tmp_path):
    trainer, _ = _train_ema(tmp_path / "straight")
    ema = trainer.model_ema.ema_model.state_dict()
    weights = trainer.model.state_dict()
    assert any(not torch.equal(ema[k], weights[k]) for k in weights)  # it is not a copy
    # EMA runs after the optimizer step and before the checkpointer (priority HIGH)
    names = [type(h).__name__ for h in trainer.hooks]
    assert names.index("ModelEMA") < names.index("PeriodicCheckpointer")

    _train_ema(tmp_path / "resumed", stop_after=4)
    resumed, _ = _train_ema(tmp_path / "resumed", resume=True)
    for k, v in resumed.model_ema.ema_model.state_dict().items():
        assert torch.equal(v, ema[k]), k


def test_ema_weights_are_used_for_evaluation_and_loadable_for_eval_only(tmp_path):
    trainer, results = _train_ema(tmp_path, use_for_eval=True)
    expected = trainer.test(trainer.cfg, trainer.model_ema.ema_model)
    assert results == expected
    trained = trainer.test(trainer.cfg, trainer.model)
    assert trained != expected

    model = RegressionModel()
    assert hooks.load_ema_weights(model, str(tmp_path / "model_final.pth"))
    assert trainer.test(trainer.cfg, model) == expected


def test_ema_decay_is_validated():
    with pytest.raises(ValueError, match="MODEL_EMA.DECAY"):
        hooks.ModelEMA(nn.Linear(1, 1), decay=1.0)
