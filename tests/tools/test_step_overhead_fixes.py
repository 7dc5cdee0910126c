"""The two trainkit changes made while profiling the ``train`` benchmark (issue 7)."""

import math

import numpy as np
import torch

from trainkit.engine import SimpleTrainer
from trainkit.utils.events import EventStorage


def test_history_median_and_avg_match_numpy():
    rng = np.random.default_rng(0)
    with EventStorage() as storage:
        for i, v in enumerate(rng.normal(size=37)):
            storage.put_scalar("x", float(v), cur_iter=i)
        history = storage.history("x")
        values = [v for v, _ in history.values()]
        for window in (1, 2, 5, 20, 1000):
            assert history.median(window) == float(np.median(values[-window:]))
            assert math.isclose(history.avg(window), float(np.mean(values[-window:])))
            assert isinstance(history.median(window), float)


def test_cpu_losses_are_buffered_as_floats_and_flushed():
    model = torch.nn.Linear(2, 1)

    def loss_model(batch):
        return {"loss_a": model(batch).pow(2).mean(), "loss_b": model(batch).abs().mean()}

    module = torch.nn.Module()
    module.forward = loss_model  # type: ignore[method-assign]
    module.lin = model
    data = iter([torch.ones(4, 2)] * 10)
    trainer = SimpleTrainer(
        module,
        data,
        torch.optim.SGD(model.parameters(), lr=0.0),
        gather_metric_period=5,
        record_every_step=True,
    )
    trainer.register_hooks([])
    with EventStorage() as trainer.storage:
        for trainer.iter in range(4):
            trainer.run_step()
        assert all(
            isinstance(v, float) for _, _, values, _ in trainer._metric_buffer for v in values
        )
        trainer.max_iter = 10
        trainer.iter = 4
        trainer.run_step()  # iteration 4 closes the period: flush
        assert trainer._metric_buffer == []
        with torch.no_grad():
            expected = float(
                model(torch.ones(4, 2)).pow(2).mean() + model(torch.ones(4, 2)).abs().mean()
            )
        assert trainer.storage.history("total_loss").latest() == np.float32(
            expected
        ).item() or math.isclose(
            trainer.storage.history("total_loss").latest(), expected, rel_tol=1e-6
        )
        assert len(trainer.storage.history("loss_a").values()) == 5
