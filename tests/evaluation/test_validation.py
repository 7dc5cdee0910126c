"""validation_losses: the training-mode losses on a test set, per record, over every rank."""

import logging
import random

import numpy as np
import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.data import build_test_loader
from trainkit.evaluation import loss_evaluation_context, validation_losses
from trainkit.utils import comm


class _RecordModel(nn.Module):
    """Loss = mean over the batch of each record's value (x) scaled by one weight.

    BatchNorm and dropout sit in the path, so their mode changes the value.
    """

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))
        self.bn = nn.BatchNorm1d(1)
        self.dropout = nn.Dropout(0.5)
        with torch.no_grad():
            self.bn.running_mean.fill_(2.0)
            self.bn.running_var.fill_(4.0)

    def forward(self, batch):
        x = torch.tensor([[float(r["x"])] for r in batch])
        y = self.dropout(self.bn(x)).squeeze(1) * self.scale
        if not self.training:
            return y
        return {"loss_value": y.mean(), "loss_square": (y * y).mean()}


def _records(n):
    return [{"x": i} for i in range(n)]


def _loader(records, batch_size):
    return build_test_loader(records, mapper=None, batch_size=batch_size)


def _expected(records):
    # eval-mode BN with the running statistics above, no dropout, mean over records
    y = [(r["x"] - 2.0) / np.sqrt(4.0 + 1e-5) for r in records]
    return {
        "loss_value": float(np.mean(y)),
        "loss_square": float(np.mean(np.square(y))),
        "total_loss": float(np.mean(y) + np.mean(np.square(y))),
    }


def test_losses_are_per_record_means_not_means_of_batch_means():
    records = _records(10)
    losses = validation_losses(_RecordModel(), _loader(records, batch_size=4))  # 4, 4, 2
    assert losses == pytest.approx(_expected(records), rel=1e-6)
    batch_means = np.mean(
        [np.mean([(x - 2.0) / 2.0 for x in b]) for b in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9])]
    )
    assert losses["loss_value"] != pytest.approx(batch_means, rel=1e-3)


def test_running_statistics_are_used_and_left_unchanged_and_dropout_is_off():
    model = _RecordModel()
    model.train()
    stats = {k: v.clone() for k, v in model.bn.state_dict().items()}
    first = validation_losses(model, _loader(_records(7), batch_size=3))
    second = validation_losses(model, _loader(_records(7), batch_size=3))
    assert first == second  # dropout would make two passes differ
    assert first == pytest.approx(_expected(_records(7)), rel=1e-6)
    for k, v in model.bn.state_dict().items():
        assert torch.equal(v, stats[k]), k  # running stats (and num_batches_tracked) untouched


def test_every_modules_mode_is_restored_also_after_an_error():
    model = _RecordModel()
    model.train()
    model.dropout.eval()  # a user's choice that must survive
    with pytest.raises(RuntimeError, match="boom"), loss_evaluation_context(model):
        assert model.training and not model.bn.training and not model.dropout.training
        raise RuntimeError("boom")
    assert model.training and model.bn.training and not model.dropout.training
    model.eval()
    validation_losses(model, _loader(_records(3), batch_size=2))
    assert not any(m.training for m in model.modules())


def test_no_gradients_are_recorded():
    model = _RecordModel()
    validation_losses(model, _loader(_records(4), batch_size=2))
    assert all(p.grad is None for p in model.parameters())


class _RandomModel(_RecordModel):
    def forward(self, batch):
        torch.rand(3)  # a model (or mapper) that draws from the global RNGs
        np.random.rand()
        random.random()
        return super().forward(batch)


def test_global_rng_states_are_restored():
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    expected = (torch.rand(2), np.random.rand(), random.random())
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    validation_losses(_RandomModel(), _loader(_records(5), batch_size=2))
    got = (torch.rand(2), np.random.rand(), random.random())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_a_single_tensor_is_total_loss_and_other_outputs_are_refused():
    def tensor_model(batch):
        return torch.tensor(float(len(batch)))

    tensor_model = _Callable(tensor_model)
    assert validation_losses(tensor_model, [[1, 2], [3]]) == pytest.approx({"total_loss": 5 / 3})
    with pytest.raises(TypeError, match="dict of scalar losses"):
        validation_losses(_Callable(lambda b: [1.0]), [[1]])
    with pytest.raises(ValueError, match="'loss_x' must be a one-element tensor"):
        validation_losses(_Callable(lambda b: {"loss_x": torch.ones(2)}), [[1]])


def test_an_empty_test_set_gives_no_losses(caplog):
    with caplog.at_level(logging.INFO, logger="trainkit.evaluation.validation"):
        assert validation_losses(_RecordModel(), []) == {}
    assert "none (no records)" in caplog.text


def test_the_cost_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="trainkit.evaluation.validation"):
        validation_losses(_RecordModel(), _loader(_records(6), batch_size=4))
    assert "Validation losses over 6 records (1 processes)" in caplog.text
    assert "took" in caplog.text and " s" in caplog.text


class _Callable(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, batch):
        return self.fn(batch)


def _losses_on_rank(num_records, batch_size):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    # DDP-wrapped: the bare module must run (no buffer broadcast, no reducer), because the
    # ranks run different numbers of batches (4 records: 2 batches; 3 records: 1).
    model = DistributedDataParallel(_RecordModel())
    # A DDP forward would broadcast rank 0's buffers over this rank's own marker.
    model.module.register_buffer("marker", torch.tensor(float(comm.get_rank())))
    loader = _loader(_records(num_records), batch_size)
    shard = [r["x"] for batch in loader for r in batch]
    losses = validation_losses(model, loader)
    return {"shard": shard, "losses": losses, "marker": float(model.module.marker)}


@pytest.mark.distributed
def test_uneven_shards_on_three_ranks_give_the_one_process_value():
    records = _records(10)
    single = validation_losses(_RecordModel(), _loader(records, batch_size=3))
    results = run_on_ranks(_losses_on_rank, 3, args=(10, 3), timeout_s=90)
    # every record exactly once: InferenceSampler shards, no padding
    assert sorted(x for r in results for x in r["shard"]) == list(range(10))
    assert [len(r["shard"]) for r in results] == [4, 3, 3]
    assert [r["marker"] for r in results] == [0.0, 1.0, 2.0]  # no DDP forward, no broadcast
    for r in results:
        # identical on every rank, equal to one process up to float summation order
        assert r["losses"] == results[0]["losses"]
        assert r["losses"] == pytest.approx(single, rel=1e-6)
    assert single == pytest.approx(_expected(records), rel=1e-6)
