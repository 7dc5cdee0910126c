"""Every rank's micro-batches in one process: gradients averaged as DDP does, per-rank state."""

import pytest
import torch
from torch import nn

from trainkit.engine import SimpleTrainer
from trainkit.engine.rank_replay import (
    RankLocalState,
    copy_buffers,
    ddp_average,
    gradient_norm,
    losses_of_batches,
    run_rank,
)


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


def _step(model):
    return SimpleTrainer(model, [], torch.optim.SGD(model.parameters(), lr=0.1))


def test_ddp_average_is_the_mean_of_the_ranks_gradients_scaled_before_the_sum():
    g0, g1 = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    (averaged,) = ddp_average([[g0], [g1]])
    assert torch.equal(averaged, g0 * 0.5 + g1 * 0.5)  # DDP's 1/W in the bucket, then a sum
    assert torch.allclose(averaged, (g0 + g1) / 2)
    (three,) = ddp_average([[g0], [g1], [g0]])
    assert torch.equal(three, g0 * (1 / 3) + g1 * (1 / 3) + g0 * (1 / 3))
    # One process has no DDP wrapper: its gradients are the step's as they are.
    assert ddp_average([[g0, None]])[0] is g0
    # A parameter without a gradient on one rank: zeros there; on none: stays None.
    assert torch.equal(ddp_average([[g0, None], [None, None]])[0], g0 * 0.5)
    assert ddp_average([[g0, None], [g1, None]])[1] is None
    with pytest.raises(ValueError, match="one gradient per parameter"):
        ddp_average([[g0], [g0, g1]])


@pytest.mark.parametrize("accumulate", [1, 2])
def test_ranks_run_in_one_process_give_the_gradient_of_the_whole_batch(accumulate):
    model = _Linear()
    step = _step(model)
    params = list(model.parameters())
    world_size, per_micro = 2, 4
    slots = [[_batch(per_micro, 10 * r + j) for j in range(accumulate)] for r in range(world_size)]
    results = [run_rank(step, slots[r], params) for r in range(world_size)]
    averaged = ddp_average([r.gradients for r in results])
    assert all(p.grad is None for p in params)  # taken off the parameters

    whole = [record for rank in slots for batch in rank for record in batch]
    model.zero_grad()
    model(whole)["loss_mse"].backward()
    for got, expected in zip(averaged, (p.grad for p in params)):
        assert torch.allclose(got, expected, atol=1e-6)
    assert [len(r.losses) for r in results] == [accumulate] * world_size
    assert gradient_norm(averaged) == pytest.approx(
        float(torch.cat([g.flatten() for g in averaged]).norm())
    )


def test_a_rank_whose_micro_batch_raises_reports_it_when_asked():
    model = _Linear()
    step = _step(model)
    bad = [{"x": torch.randn(4), "y": torch.zeros(())}]  # the wrong width
    with pytest.raises(RuntimeError):
        run_rank(step, [bad], list(model.parameters()))
    result = run_rank(step, [_batch(2, 0), bad], list(model.parameters()), catch=True)
    assert result.error is not None and result.error[0] == 1
    assert len(result.losses) == 1


def test_each_rank_keeps_its_own_buffers_and_rng():
    model = _Linear(norm=True)
    step = _step(model)
    params = list(model.parameters())
    start = copy_buffers(model)
    ranks = [RankLocalState(), RankLocalState()]
    for r, local in enumerate(ranks):
        with local.active(model):
            run_rank(step, [_batch(4, r)], params)
    # Rank 0's running statistics are those of its own batch alone, as in a DDP job with
    # broadcast_buffers=False (the ones its checkpoint holds).
    alone = _Linear(norm=True)
    run_rank(_step(alone), [_batch(4, 0)], list(alone.parameters()))
    assert torch.equal(ranks[0].buffers["norm.running_mean"], alone.norm.running_mean)
    assert not torch.equal(
        ranks[0].buffers["norm.running_mean"], ranks[1].buffers["norm.running_mean"]
    )
    assert not torch.equal(start["norm.running_mean"], ranks[0].buffers["norm.running_mean"])
    # Its RNG states go on where it left them.
    ranks[0].rng = None
    with ranks[0].active(model):
        torch.manual_seed(5)
    with ranks[0].active(model):
        drawn = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(1))


def test_losses_of_batches_run_each_batch_and_leave_the_model_as_it_was():
    model = _Linear(norm=True)
    step = _step(model)
    batch = _batch(4, 0)
    batch[1]["x"] = torch.full((3,), float("nan"))
    before = copy_buffers(model)
    wrong_width = [{"x": torch.randn(4), "y": torch.zeros(())}] * 2
    found = losses_of_batches(step, [batch[:1], batch[2:], batch[:2], wrong_width])
    # BatchNorm1d cannot train on one record; a NaN record spoils its batch's statistics.
    assert isinstance(found[0], ValueError)
    assert found[1]["loss_mse"] == found[1]["loss_mse"]
    assert found[2]["loss_mse"] != found[2]["loss_mse"]
    assert isinstance(found[3], RuntimeError)
    assert all(torch.equal(before[k], v) for k, v in copy_buffers(model).items())
