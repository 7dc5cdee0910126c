"""Gradient accumulation: k micro-batches make the update of one batch k times larger."""

import itertools

import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.engine import SimpleTrainer
from trainkit.utils import comm


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(6, 3).double()
        self.head = nn.Linear(3, 1).double()

    def forward(self, batch):
        x, y = batch
        pred = self.head(torch.tanh(self.layer(x))).squeeze(1)
        return {"loss_mse": ((pred - y) ** 2).mean(), "loss_l1": (pred - y).abs().mean() * 0.1}


def _samples(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randn(
        n, generator=g, dtype=torch.float64
    )


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _batches(x, y, size):
    return itertools.cycle([(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)])


def _train(batch_size, accumulate_steps, steps=3, x=None, y=None):
    x, y = _samples(24) if x is None else (x, y)
    model = _Net()
    trainer = SimpleTrainer(
        model, _batches(x, y, batch_size), _optimizer(model), accumulate_steps=accumulate_steps
    )
    trainer.train(0, steps)
    return model, trainer


def test_accumulated_update_equals_the_big_batch_update():
    big, big_trainer = _train(batch_size=8, accumulate_steps=1)
    small, small_trainer = _train(batch_size=2, accumulate_steps=4)
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # An iteration is an optimizer step; the recorded loss is the step's mean.
    assert small_trainer.iter == big_trainer.iter == 3
    assert [i for _, i in small_trainer.storage.history("total_loss").values()] == [0, 1, 2]
    big_losses = [v for v, _ in big_trainer.storage.history("loss_mse").values()]
    small_losses = [v for v, _ in small_trainer.storage.history("loss_mse").values()]
    assert small_losses == pytest.approx(big_losses, abs=1e-12)


class _ListNet(_Net):
    """Takes a batch as trainkit's loaders make it: a list of samples."""

    def forward(self, batch):
        return super().forward(
            (torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch]))
        )


def test_unequal_micro_batches_are_weighted_by_their_size():
    x, y = _samples(6)
    samples = list(zip(x, y))

    def uneven():
        while True:  # micro-batches of 4 and 2 samples: one step of 6
            yield samples[:4]
            yield samples[4:]

    model = _ListNet()
    SimpleTrainer(model, uneven(), _optimizer(model), accumulate_steps=2).train(0, 1)
    reference = _ListNet()
    SimpleTrainer(reference, itertools.repeat(samples), _optimizer(reference)).train(0, 1)
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_hooks_and_the_optimizer_run_once_per_step():
    from trainkit.engine import hooks

    calls = []
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original_step = optimizer.step
    optimizer.step = lambda *a, **k: (calls.append("step"), original_step(*a, **k))[1]
    read = []
    batches = (read.append(batch) or batch for batch in _batches(*_samples(24), 2))
    trainer = SimpleTrainer(model, batches, optimizer, accumulate_steps=3)

    class Probe(hooks.HookBase):
        def after_backward(self):
            calls.append("after_backward")

    trainer.register_hooks([Probe()])
    trainer.train(0, 2)
    assert calls == ["after_backward", "step"] * 2
    assert len(read) == 6  # 3 micro-batches per step, 2 steps


def test_accumulate_steps_must_be_positive():
    with pytest.raises(ValueError, match="ACCUMULATE_STEPS"):
        _train(batch_size=2, accumulate_steps=0)


def _ddp_accumulation(batch_size, accumulate_steps):
    from torch.nn.parallel import DistributedDataParallel

    x, y = _samples(32)
    rank, world = comm.get_rank(), comm.get_world_size()
    # Each rank gets its strided share of every global batch, as the train loader does.
    per_rank = [
        (x[i : i + batch_size * world][rank::world], y[i : i + batch_size * world][rank::world])
        for i in range(0, len(x), batch_size * world)
    ]
    model = DistributedDataParallel(_Net())
    reduces = []

    def counting_hook(state, bucket):
        reduces.append(1)
        tensor = bucket.buffer().div_(world)
        return (
            torch.distributed.all_reduce(tensor, async_op=True)
            .get_future()
            .then(lambda f: f.value()[0])
        )

    model.register_comm_hook(None, counting_hook)
    trainer = SimpleTrainer(
        model, itertools.cycle(per_rank), _optimizer(model), accumulate_steps=accumulate_steps
    )
    trainer.train(0, 2)
    return [p.detach().clone() for p in model.module.parameters()], len(reduces)


@pytest.mark.distributed
def test_two_processes_accumulating_match_one_big_batch_with_one_all_reduce_per_step():
    # 2 ranks x 2 micro-batches of 2 = one step of 8, as one process with batches of 8.
    results = run_on_ranks(_ddp_accumulation, 2, args=(2, 2), timeout_s=120)
    reference, _ = _train(
        batch_size=8, accumulate_steps=1, steps=2, x=_samples(32)[0], y=_samples(32)[1]
    )
    for params, num_reduces in results:
        for a, b in zip(reference.parameters(), params):
            torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-10)
        assert (
            num_reduces == 2
        )  # one bucket, all-reduced once per optimizer step, not per micro-batch
