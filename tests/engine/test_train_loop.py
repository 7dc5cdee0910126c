import gc
import itertools
import logging
import weakref

import pytest
import torch
from torch import nn

from trainkit.engine import hooks, step_metrics
from trainkit.engine.train_loop import AMPTrainer, HookBase, SimpleTrainer, TrainerBase
from trainkit.utils.events import EventWriter


class _NoopTrainer(TrainerBase):
    def run_step(self):
        pass


class _Recorder(HookBase):
    """Appends (name, event, iteration) to a shared list."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def before_train(self):
        self.log.append((self.name, "before_train", self.trainer.iter))

    def after_train(self):
        self.log.append((self.name, "after_train", self.trainer.iter))

    def before_step(self):
        self.log.append((self.name, "before_step", self.trainer.iter))

    def after_backward(self):
        self.log.append((self.name, "after_backward", self.trainer.iter))

    def after_step(self):
        self.log.append((self.name, "after_step", self.trainer.iter))


class _LateMetric(HookBase):
    def after_train(self):
        self.trainer.storage.put_scalar("late_eval", 0.75, smoothing_hint=False)


class _RecordingWriter(EventWriter):
    def __init__(self):
        self.snapshots = []
        self.closed = False

    def write(self):
        from trainkit.utils.events import get_event_storage

        storage = get_event_storage()
        self.snapshots.append((storage.iter, dict(storage.latest())))

    def close(self):
        self.closed = True


def _regression_data(seed=0, batch_size=16):
    gen = torch.Generator().manual_seed(seed)
    true_w = torch.tensor([[2.0], [-3.0]])

    def batches():
        while True:
            x = torch.randn(batch_size, 2, generator=gen)
            yield x, x @ true_w + 0.5

    return batches()


class _Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(2, 1)
        self.seen_dtypes = []

    def forward(self, batch):
        x, y = batch
        pred = self.linear(x)
        self.seen_dtypes.append(pred.dtype)
        return {"loss_mse": ((pred.float() - y) ** 2).mean()}


def _simple(model=None, period=1, cls=SimpleTrainer, lr=0.05, **kwargs):
    model = model or _Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return cls(model, _regression_data(), optimizer, gather_metric_period=period, **kwargs)


def test_hook_order_and_late_metric_reaches_final_write():
    log = []
    writer = _RecordingWriter()
    trainer = _simple()
    trainer.register_hooks([_Recorder("a", log), None, hooks.PeriodicWriter([writer], period=100)])
    # Registered after the writer, like an extra evaluation added by a user.
    trainer.register_hooks([_Recorder("b", log), _LateMetric()])
    trainer.train(0, 2)

    events = [(name, event) for name, event, _ in log]
    per_step = [
        ("a", "before_step"),
        ("b", "before_step"),
        ("a", "after_backward"),
        ("b", "after_backward"),
        ("a", "after_step"),
        ("b", "after_step"),
    ]
    expected = [("a", "before_train"), ("b", "before_train"), *per_step, *per_step]
    assert events == [*expected, ("a", "after_train"), ("b", "after_train")]
    assert [i for name, _, i in log if name == "a"] == [0, 0, 0, 0, 1, 1, 1, 2]
    assert trainer.iter == 2
    assert trainer.storage.iter == 2
    # The last-iteration write lacks the late metric; the final write (after every
    # after_train) has it.
    assert "late_eval" not in writer.snapshots[0][1]
    assert writer.snapshots[-1][1]["late_eval"] == (0.75, 2)
    assert writer.closed


def test_loss_decreases_on_regression():
    trainer = _simple()
    trainer.train(0, 60)
    losses = trainer.storage.history("loss_mse").values()
    assert len(losses) == 60
    assert losses[-1][0] < 0.01 * losses[0][0]
    assert trainer.storage.history("total_loss").latest() == pytest.approx(losses[-1][0])
    assert "data_time" in trainer.storage.histories()


def test_model_returning_one_tensor_records_total_loss():
    class OneTensor(_Regressor):
        def forward(self, batch):
            return super().forward(batch)["loss_mse"]

    trainer = _simple(OneTensor())
    trainer.train(0, 3)
    names = set(trainer.storage.histories())
    assert "total_loss" in names
    assert "loss_mse" not in names


def test_amp_trainer_on_cpu_uses_bfloat16_without_scaler():
    model = _Regressor()
    trainer = _simple(model, cls=AMPTrainer)
    assert trainer.grad_scaler is None
    assert trainer.precision == torch.bfloat16
    trainer.train(0, 40)
    assert set(model.seen_dtypes) == {torch.bfloat16}
    losses = trainer.storage.history("loss_mse").values()
    assert losses[-1][0] < 0.1 * losses[0][0]
    assert "grad_scaler" not in trainer.state_dict()


def test_non_finite_loss_raises_before_the_weights_change():
    class Exploding(_Regressor):
        def forward(self, batch):
            losses = super().forward(batch)
            if len(self.seen_dtypes) == 3:  # the third step, iteration 2
                losses["loss_mse"] = losses["loss_mse"] * float("nan")
            losses["loss_reg"] = torch.tensor(0.0)
            return losses

    model = Exploding()
    after_train_calls = []
    trainer = _simple(model)
    trainer.register_hooks(
        [hooks.CallbackHook(after_train=lambda t: after_train_calls.append(t.iter))]
    )
    weights = []
    trainer.register_hooks(
        [hooks.CallbackHook(after_step=lambda t: weights.append(model.linear.weight.clone()))]
    )
    with pytest.raises(FloatingPointError, match=r"iteration=2.*loss_mse.*loss_reg"):
        trainer.train(0, 10)
    assert after_train_calls == [2]
    assert torch.equal(model.linear.weight, weights[-1])  # the NaN step never reached the optimizer


def test_metrics_of_every_step_are_gathered_at_period_ends(monkeypatch):
    gathered_at = []

    def fake_all_gather(obj):
        # Pretend a second rank saw twice the loss and a longer data wait.
        buffered, shared = obj  # the metrics and what rides along (nothing here)
        gathered_at.append([cur_iter for cur_iter, _, _, _ in buffered])
        other = [(i, names, [2 * v for v in values], d + 1.0) for i, names, values, d in buffered]
        return [obj, (other, shared)]

    monkeypatch.setattr(step_metrics.comm, "all_gather", fake_all_gather)
    trainer = _simple(period=4, record_every_step=True)
    seen = []
    trainer.register_hooks(
        [hooks.CallbackHook(after_step=lambda t: seen.append(len(t.storage.histories())))]
    )
    trainer.train(0, 10)

    assert gathered_at == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [n > 0 for n in seen] == [False, False, False, True] + [True] * 6
    history = trainer.storage.history("loss_mse").values()
    assert [i for _, i in history] == list(range(10))  # each value filed under its own iteration
    rank_data_time = trainer.storage.history("rank_data_time").values()
    data_time = trainer.storage.history("data_time").values()
    assert [d for d, _ in data_time] == pytest.approx([r + 1.0 for r, _ in rank_data_time])


class _TwoLosses(nn.Module):
    """Two losses of a frozen linear layer; keeps a weak reference to each loss tensor."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.returned = []

    def forward(self, batch):
        out = self.linear(batch)
        losses = {"loss_a": out.pow(2).mean(), "loss_b": out.abs().mean()}
        self.returned += [weakref.ref(loss) for loss in losses.values()]
        return losses


def test_step_metrics_wait_as_floats_and_reach_the_storage_at_period_ends():
    model = _TwoLosses()
    trainer = SimpleTrainer(
        model,
        itertools.repeat(torch.ones(4, 2)),
        torch.optim.SGD(model.parameters(), lr=0.0),  # the losses stay the same every step
        gather_metric_period=5,
        record_every_step=True,
    )
    seen = []

    def after_step(t):
        # No gc.collect(): a loss tensor in a reference cycle would hold GPU memory until the
        # next collection, so it counts as alive here.
        # The step's loss tensors (and their graphs) are gone: what waits is plain numbers.
        alive = sum(ref() is not None for ref in model.returned)
        seen.append((len(t.storage.histories()), alive))

    trainer.register_hooks([hooks.CallbackHook(after_step=after_step)])
    trainer.train(0, 7)
    assert [n > 0 for n, _ in seen] == [False] * 4 + [True] * 3  # iteration 4 ends the period
    assert all(alive == 0 for _, alive in seen)
    with torch.no_grad():
        out = model.linear(torch.ones(4, 2))
        expected = {"loss_a": float(out.pow(2).mean()), "loss_b": float(out.abs().mean())}
    storage = trainer.storage
    for name, value in expected.items():
        history = storage.history(name).values()
        assert [i for _, i in history] == list(range(7))  # the last iteration flushes too
        assert all(type(v) is float for v, _ in history)
        assert history[-1][0] == pytest.approx(value)
    assert storage.history("total_loss").latest() == pytest.approx(sum(expected.values()))


def test_ranks_returning_different_loss_names_are_named(monkeypatch):
    def fake_all_gather(obj):
        other = [(i, ("loss_other", "total_loss"), values, d) for i, _, values, d in obj[0]]
        return [obj, (other, None)]

    monkeypatch.setattr(step_metrics.comm, "all_gather", fake_all_gather)
    trainer = _simple()
    trainer.register_hooks([])
    with pytest.raises(RuntimeError, match=r"rank 1 returned \['loss_other', 'total_loss'\]"):
        trainer.train(0, 1)


def test_metrics_average_over_ranks(monkeypatch):
    monkeypatch.setattr(
        step_metrics.comm,
        "all_gather",
        lambda obj: [obj, ([(i, n, [3 * v for v in vs], d) for i, n, vs, d in obj[0]], None)],
    )
    trainer = _simple(lr=0.0)
    local = []
    trainer.register_hooks([hooks.CallbackHook(after_step=lambda t: local.append(None))])
    trainer.train(0, 1)
    # mean(x, 3x) = 2x; with lr 0 the local loss is easy to recompute.
    batch = next(_regression_data())
    expected = trainer.model(batch)["loss_mse"].item()
    assert trainer.storage.history("loss_mse").latest() == pytest.approx(2 * expected)


class _Counter(HookBase):
    def __init__(self):
        self.count = 0

    def after_step(self):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_state_dict_round_trip_restores_iteration_hooks_and_optimizer():
    def build():
        model = _Regressor()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        trainer = SimpleTrainer(model, _regression_data(), optimizer)
        counter = _Counter()
        trainer.register_hooks([hooks.LRScheduler(scheduler=scheduler), counter])
        return trainer, scheduler, counter

    trainer, scheduler, _ = build()
    trainer.train(0, 7)
    state = trainer.state_dict()
    assert state["iteration"] == 7
    assert set(state["hooks"]) == {"LRScheduler", "_Counter"}

    restored, restored_scheduler, counter = build()
    restored.load_state_dict(state)
    assert restored.iter == 7
    assert counter.count == 7
    assert restored_scheduler.last_epoch == scheduler.last_epoch == 7
    assert restored.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)
    momentum = restored.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, trainer.optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_load_state_dict_warns_on_missing_and_unknown_hooks(caplog):
    trainer = _NoopTrainer()
    trainer.register_hooks([_Counter()])
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.hook_base"):
        trainer.load_state_dict({"iteration": 3, "hooks": {"Gone": {"x": 1}}})
    assert trainer.iter == 3
    assert "_Counter" in caplog.text
    assert "Gone" in caplog.text


def test_two_stateful_hooks_with_one_name_are_refused():
    trainer = _NoopTrainer()
    trainer.register_hooks([_Counter(), hooks.CallbackHook(), hooks.CallbackHook()])
    with pytest.raises(ValueError, match="_Counter"):
        trainer.register_hooks([_Counter()])


def test_hook_trainer_reference_is_checked():
    hook = _Counter()
    with pytest.raises(RuntimeError, match="not registered"):
        _ = hook.trainer
    trainer = _NoopTrainer()
    trainer.register_hooks([hook])
    assert hook.trainer is trainer
    del trainer
    gc.collect()
    with pytest.raises(RuntimeError, match="live trainer"):
        _ = hook.trainer


def test_register_hooks_rejects_non_hooks():
    with pytest.raises(TypeError, match="HookBase"):
        _NoopTrainer().register_hooks([object()])


def test_step_error_still_runs_every_after_train_and_is_reraised():
    class Boom(TrainerBase):
        def run_step(self):
            if self.iter == 1:
                raise KeyError("bad batch")

    log = []

    class FailingAfterTrain(HookBase):
        def after_train(self):
            raise RuntimeError("hook cleanup failed")

    trainer = Boom()
    trainer.register_hooks([FailingAfterTrain(), _Recorder("r", log)])
    with pytest.raises(KeyError, match="bad batch"):
        trainer.train(0, 5)
    assert log[-1] == ("r", "after_train", 1)


def test_finite_data_loader_gives_a_clear_error():
    model = _Regressor()
    batches = list(itertools.islice(_regression_data(), 2))
    trainer = SimpleTrainer(model, batches, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="ran out after 2 batches at iteration 2"):
        trainer.train(0, 5)


def test_data_loader_is_iterated_lazily_and_once():
    class CountingLoader:
        def __init__(self):
            self.num_iters = 0

        def __iter__(self):
            self.num_iters += 1
            return _regression_data()

    loader = CountingLoader()
    model = _Regressor()
    trainer = SimpleTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loader.num_iters == 0
    trainer.train(0, 3)
    trainer.train(3, 5)
    assert loader.num_iters == 1


def test_storage_before_train_is_an_error():
    with pytest.raises(RuntimeError, match="train"):
        _ = _NoopTrainer().storage


class _RankLoss(nn.Module):
    """Loss = (rank + 1) * w with w = 1, so the rank average is known exactly."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, batch):
        from trainkit.utils import comm

        return {"loss_rank": (comm.get_rank() + 1) * self.w}


def _train_on_rank():
    model = _RankLoss()
    trainer = SimpleTrainer(
        model,
        itertools.repeat(None),
        torch.optim.SGD(model.parameters(), lr=0.0),
        2,
        record_every_step=True,
    )
    trainer.train(0, 3)
    storage = trainer.storage
    return {
        "loss_rank": storage.history("loss_rank").values(),
        "num_data_time": len(storage.history("data_time").values()),
    }


# slow: starting two ranks costs ~4-5 s of process start-up, whatever the test does.
@pytest.mark.slow
@pytest.mark.distributed
def test_metrics_are_averaged_over_real_ranks():
    from tests.dist import run_on_ranks

    results = run_on_ranks(_train_on_rank, 2, timeout_s=60)
    # Ranks see losses 1 and 2; both record the mean for every iteration.
    for result in results:
        assert result["loss_rank"] == [(1.5, 0), (1.5, 1), (1.5, 2)]
        assert result["num_data_time"] == 3


def test_without_record_every_step_only_period_ends_are_recorded(monkeypatch):
    # detectron2's gather_metric_period: iterations 3 and 7 of 10 with period 4, nothing at
    # the last iteration, one gather per recorded step.
    gathered_at = []

    def fake_all_gather(obj):
        gathered_at.append([cur_iter for cur_iter, _, _, _ in obj[0]])
        return [obj]

    monkeypatch.setattr(step_metrics.comm, "all_gather", fake_all_gather)
    trainer = _simple(period=4)
    trainer.train(0, 10)
    assert gathered_at == [[3], [7]]
    assert [i for _, i in trainer.storage.history("total_loss").values()] == [3, 7]


class _NanAtStep(_Regressor):
    def __init__(self, nan_step):
        super().__init__()
        self.nan_step = nan_step

    def forward(self, batch):
        losses = super().forward(batch)
        if len(self.seen_dtypes) == self.nan_step + 1:
            losses["loss_mse"] = losses["loss_mse"] * float("nan")
        return losses


def test_a_non_finite_loss_is_caught_on_a_step_that_is_not_recorded():
    trainer = _simple(model=_NanAtStep(2), period=5)
    with pytest.raises(FloatingPointError, match="iteration=2"):
        trainer.train(0, 10)
