"""Every rank's micro-batches in one process, through the step's own ``accumulate``.

The replay's gradient combiner (``EmulatedRanks``) gives each emulated rank its RNG states,
buffers and gradients, and averages the gradients as DDP does.
"""

import pytest
import torch
from torch import nn

from trainkit.engine import SimpleTrainer
from trainkit.engine.gradients import EmulatedRanks, gradient_norm
from trainkit.engine.gradients import copy_buffers as _copy_buffers
from trainkit.engine.replay import _losses_of


class _Linear(nn.Module):
    def __init__(self, norm=False):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.BatchNorm1d(3) if norm else nn.Identity()
        self.fc = nn.Linear(3, 1)

    def forward(self, batch):
        x = torch.stack([b["x"] for b in batch])
        y = torch.stack([b["y"] for b in batch])
        return {"loss_mse": nn.functional.mse_loss(self.fc(self.norm(x)).squeeze(1), y)}


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(3, generator=g), "y": torch.randn((), generator=g)} for _ in range(n)]


def _emulated(model, world_size):
    step = SimpleTrainer(model, [], torch.optim.SGD(model.parameters(), lr=0.1))
    step.gradient_combiner = ranks = EmulatedRanks(model, [None] * world_size)
    return step, ranks


def _interleaved(slots):
    """The one process's micro-batches: q is micro-batch q // W of rank q % W."""
    world_size, accumulate = len(slots), len(slots[0])
    return [slots[q % world_size][q // world_size] for q in range(world_size * accumulate)]


def test_the_average_is_the_mean_of_the_ranks_gradients_scaled_before_the_sum():
    model = _Linear()
    _, ranks = _emulated(model, 2)
    g0, g1 = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    ranks.ranks[0].grads, ranks.ranks[1].grads = [g0, g0, None], [g1, None, None]
    averaged = ranks.averaged()
    assert torch.equal(averaged[0], g0 * 0.5 + g1 * 0.5)  # DDP's 1/W in the bucket, then a sum
    assert torch.equal(averaged[1], g0 * 0.5)  # no gradient on one rank: zeros there
    assert averaged[2] is None  # on none: stays None
    _, one = _emulated(model, 1)
    one.ranks[0].grads = [g0]
    assert one.averaged()[0] is g0  # one process has no DDP wrapper


@pytest.mark.parametrize("accumulate", [1, 2])
def test_accumulate_over_emulated_ranks_gives_the_gradient_of_the_whole_batch(accumulate):
    model = _Linear()
    step, ranks = _emulated(model, 2)
    slots = [[_batch(4, 10 * r + j) for j in range(accumulate)] for r in range(2)]
    result = step.accumulate(_interleaved(slots))
    assert result.error is None and len(result.losses) == 2 * accumulate
    got = [p.grad.clone() for p in model.parameters()]

    whole = [record for rank in slots for batch in rank for record in batch]
    model.zero_grad()
    model(whole)["loss_mse"].backward()
    for g, expected in zip(got, (p.grad for p in model.parameters())):
        assert torch.allclose(g, expected, atol=1e-6)
    assert gradient_norm(got) == pytest.approx(float(torch.cat([g.flatten() for g in got]).norm()))


def test_a_micro_batch_that_raises_is_returned_not_raised():
    model = _Linear()
    step, _ = _emulated(model, 2)
    bad = [{"x": torch.randn(4), "y": torch.zeros(())}]  # the wrong width
    result = step.accumulate([_batch(2, 0), bad])
    assert isinstance(result.error, RuntimeError) and len(result.losses) == 1


def test_each_rank_keeps_its_own_buffers_and_rng():
    model = _Linear(norm=True)
    step, ranks = _emulated(model, 2)
    start = _copy_buffers(model)
    step.accumulate([_batch(4, 0), _batch(4, 1)])
    # Rank 0's running statistics are those of its own batch alone, as in a DDP job with
    # broadcast_buffers=False (the ones its checkpoint holds), and the model keeps them.
    alone = _Linear(norm=True)
    alone(_batch(4, 0))
    assert torch.equal(ranks.ranks[0].buffers["norm.running_mean"], alone.norm.running_mean)
    assert torch.equal(model.norm.running_mean, alone.norm.running_mean)
    assert not torch.equal(
        ranks.ranks[0].buffers["norm.running_mean"], ranks.ranks[1].buffers["norm.running_mean"]
    )
    assert not torch.equal(start["norm.running_mean"], ranks.ranks[0].buffers["norm.running_mean"])
    # Its RNG states go on where it left them.
    ranks.ranks[0].rng = None
    with ranks.active(ranks.ranks[0]):
        torch.manual_seed(5)
    with ranks.active(ranks.ranks[0]):
        drawn = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(1))


def test_losses_of_batches_run_each_batch_and_leave_the_model_as_it_was():
    model = _Linear(norm=True)
    step, _ = _emulated(model, 1)
    batch = _batch(4, 0)
    batch[1]["x"] = torch.full((3,), float("nan"))
    before = _copy_buffers(model)
    wrong_width = [{"x": torch.randn(4), "y": torch.zeros(())}] * 2
    found = _losses_of(step, [batch[:1], batch[2:], batch[:2], wrong_width])
    # BatchNorm1d cannot train on one record; a NaN record spoils its batch's statistics.
    assert isinstance(found[0], ValueError)
    assert found[1]["loss_mse"] == found[1]["loss_mse"]
    assert found[2]["loss_mse"] != found[2]["loss_mse"]
    assert isinstance(found[3], RuntimeError)
    assert all(torch.equal(before[k], v) for k, v in _copy_buffers(model).items())
