"""Slow ranks named, in one process: the phase clock, the marks of a step, the detector, config."""

import itertools
import json
import logging
import socket
import time

import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import ConfigError, get_cfg
from trainkit.data import build_train_loader
from trainkit.engine import DefaultTrainer, SimpleTrainer
from trainkit.engine.events import StepListener
from trainkit.engine.straggler_rule import StragglerRule
from trainkit.engine.stragglers import PhaseClock, StragglerDetector, build_straggler_detector
from trainkit.utils import comm
from trainkit.utils.events import EventStorage


def test_phase_clock_adds_up_each_phase_and_the_current_one_goes_on(monkeypatch):
    now = iter([0.0, 1.0, 1.5, 4.0, 4.25, 5.0, 7.0])
    monkeypatch.setattr("trainkit.engine.stragglers.time.perf_counter", lambda: next(now))
    clock = PhaseClock("cpu")
    assert not clock.uses_cuda_events
    clock.enter("data")  # 0.0
    clock.enter("forward/backward")  # 1.0
    clock.enter("data")  # 1.5
    clock.enter("optimizer")  # 4.0
    assert clock.take() == {"data": 3.5, "forward/backward": 0.5, "optimizer": 0.25}  # 4.25
    clock.enter("hooks")  # 5.0
    assert clock.take() == {"optimizer": 0.75, "hooks": 2.0}  # 7.0


class _Figures(StepListener):
    """Records what rides along with each period's metrics, and the phases announced."""

    def __init__(self):
        self.phases, self.collected, self.compared = [], [], []

    def on_phase(self, phase, iteration):
        self.phases.append((iteration, phase))

    def period_figures(self, cur_iter):
        self.collected.append(cur_iter)
        return {"iter": cur_iter}

    def compare_figures(self, per_rank, storage):
        self.compared.append((per_rank, storage.iter))


def _batches():
    return itertools.repeat(torch.ones(4, 2))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, batch):
        return {"loss": self.linear(batch).pow(2).mean()}


def test_a_step_names_its_phases_and_shares_figures_with_the_period_metrics():
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = SimpleTrainer(model, _batches(), optimizer, gather_metric_period=3)
    step.record_every_step = True
    figures = _Figures()
    step.events.subscribe(figures)
    step.train(0, 4)
    one_step = ["data", "forward/backward", "collective", "optimizer", "hooks"]
    assert [phase for _, phase in figures.phases] == one_step * 4
    assert [i for i, _ in figures.phases] == [i for i in range(4) for _ in one_step]
    assert figures.collected == [2, 3]
    assert figures.compared == [([{"iter": 2}], 2), ([{"iter": 3}], 3)]


def _detector(rank=0, periods=3):
    return StragglerDetector(
        StragglerRule(periods=periods), rank=rank, local_rank=rank % 2, host=f"node{rank // 2}"
    )


def _figures(data_s, host="node0", local_rank=1):
    phases_s = {"data": data_s, "forward/backward": 0.04, "optimizer": 0.01, "collective": 0.0}
    return {"host": host, "local_rank": local_rank, "phases_s": phases_s}


def test_detector_skips_the_warm_up_period_and_gives_seconds_per_step(monkeypatch):
    now = iter([0.0, 10.0, 11.0, 12.0, 32.0])
    monkeypatch.setattr("trainkit.engine.stragglers.time.perf_counter", lambda: next(now))
    detector = _detector()
    detector.on_phase("data", 0)
    assert detector.period_figures(4) is None  # the first period: warm-up
    assert detector.period_figures(9) == {
        "host": "node0",
        "local_rank": 0,
        "phases_s": {"data": 0.2},  # 1 s over 5 steps
    }
    detector.on_phase("forward/backward", 10)
    assert detector.period_figures(19)["phases_s"] == {"data": 0.1, "forward/backward": 2.0}


def test_detector_names_the_slow_rank_in_the_log_and_the_metrics(caplog):
    detector = _detector()
    per_rank = [_figures(0.01, "node0", 0), _figures(0.2, "node0", 1), _figures(0.01, "node1", 0)]
    with EventStorage(0) as storage, caplog.at_level(logging.WARNING):
        assert detector.compare_figures([None, None, None], storage) == []  # the warm-up period
        for cur_iter in (19, 39):
            storage.iter = cur_iter
            assert detector.compare_figures(per_rank, storage) == []
            assert storage.latest()["straggler/count"][0] == 0
        assert not caplog.records
        storage.iter = 59
        (named,) = detector.compare_figures(per_rank, storage)
    latest = storage.latest()
    assert named.rank == 1 and named.phase == "data"
    assert latest["straggler/rank"] == (1, 59)
    assert latest["straggler/count"] == (1, 59)
    assert latest["straggler/ratio"][0] == pytest.approx(0.25 / 0.06)
    assert latest["straggler/phase/data"][0] == pytest.approx(0.19)
    (record,) = caplog.records
    assert "rank 1 (host node0, local rank 1)" in record.getMessage()
    assert "slow phase is 'data'" in record.getMessage()
    assert "3 writer periods in a row" in record.getMessage()


def test_only_rank_0_logs(caplog):
    detector = _detector(rank=2, periods=1)
    with EventStorage(0) as storage, caplog.at_level(logging.WARNING):
        assert detector.compare_figures([_figures(0.01), _figures(0.5)], storage)[0].rank == 1
    assert not caplog.records


@pytest.mark.parametrize(
    "key, value", [("MARGIN", 0.6), ("MARGIN", 0.0), ("PERIODS", 4), ("PERIODS", 0)]
)
def test_a_looser_rule_is_refused_in_one_line(key, value):
    cfg = get_cfg()
    cfg.STRAGGLER[key] = value
    with pytest.raises(ConfigError, match=f"STRAGGLER.{key} must be") as info:
        build_straggler_detector(cfg, None)
    assert "\n" not in str(info.value)


def test_no_detector_with_one_process_or_when_disabled():
    cfg = get_cfg()
    cfg.STRAGGLER.MARGIN, cfg.STRAGGLER.PERIODS = 0.3, 2  # stricter is fine
    assert build_straggler_detector(cfg, None) is None  # one process: nobody to compare


# ---- a real 2-process run: rank 1's mapper is slow -------------------------------------------
_SLOW_MAPPER_S = 0.02


def _records(n=64):
    return [{"id": i, "x": [float(i % 7), 1.0]} for i in range(n)]


def _slow_on_rank_1(record):
    # NUM_WORKERS 0: the mapper runs in the training process, whose rank it can read.
    if comm.get_rank() == 1:
        time.sleep(_SLOW_MAPPER_S)
    return torch.tensor(record["x"])


class _SlowDataTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        torch.manual_seed(0)
        return _StackNet()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_slow_on_rank_1, dataset=_records())


class _StackNet(_Net):
    def forward(self, batch):
        return super().forward(torch.stack(batch))


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _train_with_a_slow_rank(output_dir):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = output_dir
    cfg.SEED = 3
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 4  # 2 records a step on each rank: rank 1 waits 40 ms for data
    cfg.SOLVER.BASE_LR = 0.01
    cfg.SOLVER.MAX_ITER = 25
    cfg.SOLVER.STEPS = ()
    cfg.SOLVER.CHECKPOINT_PERIOD = 1000
    cfg.WRITER_PERIOD = 5  # periods end at 4 (warm-up), 9, 14, 19 (named), 24 (named)
    cfg.WRITERS = ("json",)
    handler = _ListHandler()
    logging.getLogger("trainkit").addHandler(handler)
    try:
        _SlowDataTrainer(cfg).train()
    finally:
        logging.getLogger("trainkit").removeHandler(handler)
    return [m for m in handler.messages if m.startswith("Slow rank")]


@pytest.mark.slow
def test_two_processes_name_the_rank_whose_mapper_is_slow(tmp_path):
    logs = run_on_ranks(_train_with_a_slow_rank, 2, args=(str(tmp_path),), timeout_s=120)
    assert logs[1] == []  # only rank 0 logs
    assert len(logs[0]) == 2, logs[0]  # at iterations 19 and 24
    host = socket.gethostname()
    for message in logs[0]:
        assert f"rank 1 (host {host}, local rank 1)" in message
        assert "slow phase is 'data'" in message
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    by_iter = {line["iteration"]: line for line in lines}
    assert "straggler/count" not in by_iter[4]  # the warm-up period is not compared
    for cur_iter in (9, 14):
        assert by_iter[cur_iter]["straggler/count"] == 0
        assert by_iter[cur_iter]["straggler/ratio"] > 1.5
    for cur_iter in (19, 24):
        line = by_iter[cur_iter]
        assert (line["straggler/count"], line["straggler/rank"]) == (1, 1)
        assert line["straggler/phase/data"] > 0.5 * 2 * _SLOW_MAPPER_S
