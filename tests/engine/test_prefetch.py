"""The step trainer's prefetcher: checkpoints record the batches consumed, so resume is exact.

The look-ahead is forced on the CPU (``prefetch_device = cpu``: batches drawn ahead, no copy);
tests/gpu/test_prefetch.py runs the same resume with CUDA copies.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_default_trainer import RegressionTrainer, _assert_same, _cfg
from trainkit.config import get_cfg
from trainkit.data.loading.step_batches import DevicePrefetcher, StepBatches
from trainkit.engine import hooks
from trainkit.engine.step_config import prefetch_device
from trainkit.utils.env import seed_all_rng

_CPU = torch.device("cpu")


class _StopAfter(hooks.CallbackHook):
    """Stop right after iteration ``k`` (its checkpoint written), noting both positions."""

    def __init__(self, k, seen):
        def after_step(trainer):
            if trainer.iter == k:
                seen["loader"] = trainer.data_loader.state_dict()
                seen["consumed"] = trainer._trainer.loader_state_dict()
                raise KeyboardInterrupt(f"simulated stop after iteration {k}")

        super().__init__(after_step=after_step)


def _train(output_dir, *, prefetch=True, resume=False, stop_after=None, accumulate=1):
    seed_all_rng(7)
    trainer = RegressionTrainer(_cfg(output_dir, workers=0, accumulate=accumulate))
    if prefetch:
        trainer._trainer.batches.prefetch_device = _CPU  # what CUDA does, without the copy
    seen = {}
    if stop_after is not None:
        trainer.register_hooks([_StopAfter(stop_after, seen)])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    opt = trainer.optimizer.state_dict()["state"]
    return {
        "weights": {k: v.clone() for k, v in trainer.checkpointer.model.state_dict().items()},
        "momentum": [opt[k]["momentum_buffer"] for k in sorted(opt)],
        "start_iter": trainer.start_iter,
        "seen": seen,
    }


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_checkpoint_with_a_batch_in_flight_resumes_bit_exactly(tmp_path, accumulate):
    straight = _train(tmp_path / "straight", accumulate=accumulate)
    _assert_same(straight, _train(tmp_path / "plain", prefetch=False, accumulate=accumulate))
    stopped = _train(tmp_path / "resumed", stop_after=4, accumulate=accumulate)
    # The loader had handed out one batch more than the step consumed; the checkpoint (at
    # iteration 4) holds the consumed position.
    assert stopped["seen"]["loader"] != stopped["seen"]["consumed"]
    saved = torch.load(tmp_path / "resumed" / "model_0000004.pth", weights_only=True)
    assert saved["trainer"]["ranks"][0]["data"] == stopped["seen"]["consumed"]
    resumed = _train(tmp_path / "resumed", resume=True, accumulate=accumulate)
    assert resumed["start_iter"] == 5
    _assert_same(straight, resumed)


def test_saving_the_loaders_own_position_would_skip_the_batch_in_flight(tmp_path, monkeypatch):
    # The control: what resume gives if checkpoints counted the batch drawn ahead.
    straight = _train(tmp_path / "straight")
    monkeypatch.setattr(StepBatches, "position", lambda self: self.loader.state_dict())
    _train(tmp_path / "resumed", stop_after=4)
    resumed = _train(tmp_path / "resumed", resume=True)
    assert any(
        not torch.equal(straight["weights"][k], resumed["weights"][k]) for k in straight["weights"]
    )


def test_replacing_the_loader_gives_back_the_batch_in_flight(tmp_path):
    trainer = RegressionTrainer(_cfg(tmp_path, workers=0))
    step = trainer._trainer
    step.batches.prefetch_device = _CPU
    expected = [b for _, b in zip(range(3), trainer.build_train_loader(trainer.cfg))]
    first = next(step._data_loader_iter)
    assert isinstance(step._data_loader_iter, DevicePrefetcher)
    assert step._data_loader_iter.num_in_flight == 1
    step.batches.close()
    rest = [next(step._data_loader_iter), next(step._data_loader_iter)]
    for got, want in zip([first, *rest], expected):
        assert all(torch.equal(g["x"], w["x"]) for g, w in zip(got, want))


class _ModelOn:
    """Stands in for a model whose parameters are on ``device`` (there is no GPU here)."""

    def __init__(self, device):
        self.device = torch.device(device)

    def parameters(self):
        yield self


def test_the_config_prefetches_only_to_a_gpu():
    cfg = get_cfg()
    assert cfg.DATALOADER.PREFETCH_TO_DEVICE
    assert prefetch_device(cfg, _ModelOn("cuda:1")) == torch.device("cuda:1")
    assert prefetch_device(cfg, torch.nn.Linear(2, 2)) is None  # the CPU: no prefetcher
    assert prefetch_device(cfg, torch.nn.ReLU()) is None  # no parameters: nothing to follow
    cfg.DATALOADER.PREFETCH_TO_DEVICE = False
    assert prefetch_device(cfg, _ModelOn("cuda:1")) is None
