"""Slow ranks named on CUDA: phases timed with events, never a host-device wait between periods."""

import pytest
import torch

from tests.gpu.test_step import (
    _batches,
    _SyncDebugBetweenPeriods,
    _SyncDebugOff,
    _TinyConvNet,
)
from trainkit.engine import SimpleTrainer
from trainkit.engine.straggler_rule import StragglerRule
from trainkit.engine.stragglers import PhaseClock, StragglerDetector

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_phase_clock_times_the_device_without_waiting():
    clock = PhaseClock("cuda")
    assert clock.uses_cuda_events
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(200):  # more marks than are kept before completed ones are folded
            clock.enter("forward/backward")
            a = (a @ a).tanh()
            clock.enter("data")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    phases_s = clock.take()  # waits (the writer period's metrics do anyway)
    assert set(phases_s) == {"forward/backward", "data"}
    assert phases_s["forward/backward"] > 10 * phases_s["data"] > 0


class _KeepFigures(StragglerDetector):
    def __init__(self):
        super().__init__(StragglerRule(), rank=0, local_rank=0, host="here", device="cuda")
        self.figures = []

    def period_figures(self, cur_iter):
        figures = super().period_figures(cur_iter)
        self.figures.append((cur_iter, figures))
        return figures


def test_a_timed_step_waits_for_nothing_between_writer_periods():
    model = _TinyConvNet().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    period = 10
    trainer = SimpleTrainer(
        model, _batches(), optimizer, gather_metric_period=period, record_every_step=True
    )
    detector = _KeepFigures()
    trainer.events.subscribe(detector)
    sync_debug = _SyncDebugBetweenPeriods(period, warmup=2)
    trainer.register_hooks([sync_debug, _SyncDebugOff()])
    try:
        trainer.train(0, 30)  # raises "called a synchronizing CUDA operation" on a wait
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert sync_debug.checked == [*range(2, 9), *range(10, 19), *range(20, 29)]
    assert [cur_iter for cur_iter, _ in detector.figures] == [9, 19, 29]
    assert detector.figures[0][1] is None  # the warm-up period
    for _, figures in detector.figures[1:]:
        phases_s = figures["phases_s"]
        assert phases_s["forward/backward"] > 0 and phases_s["optimizer"] > 0
        assert set(phases_s) <= {"data", "forward/backward", "optimizer", "collective"}
    assert trainer.storage.latest()["straggler/count"][0] == 0  # one rank: nobody to name
