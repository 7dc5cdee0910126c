"""CompileMetrics: graph counts in the event storage at its period; a loud warning at the limit."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from trainkit.config import get_cfg
from trainkit.engine import SimpleTrainer
from trainkit.engine.hooks import CompileMetrics
from trainkit.modeling import build_model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _trainer(tmp_path, period=2):
    cfg = get_cfg()
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [4]
    cfg.INPUT.MAX_SIZE_TRAIN = cfg.INPUT.MAX_SIZE_TEST = 16
    cfg.INPUT.RANDOM_SCALE = [1.0, 1.0]
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 2
    cfg.MODEL.COMPILE.ENABLED = True
    cfg.MODEL.COMPILE.BACKEND = "eager"
    cfg.OUTPUT_DIR = str(tmp_path)
    model = build_model(cfg)
    batch = [{"image": torch.zeros(3, 16, 16, dtype=torch.uint8), "label": 1}] * 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = SimpleTrainer(model, itertools.repeat(batch), optimizer)
    trainer.register_hooks([CompileMetrics(period)])
    return trainer


def test_graph_counts_are_written_at_the_period(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.train(0, 3)
    history = trainer.storage.history("compile/graphs")
    assert [it for _, it in history.values()] == [1, 2]  # iterations 1 (period) and 2 (last)
    assert history.latest() == 1  # one planned shape: one graph, never recompiled
    assert trainer.storage.history("compile/recompiles").latest() == 0
    assert trainer.storage.history("compile/graph_breaks").latest() == 0


def test_a_method_at_the_recompile_limit_is_warned_about(tmp_path, caplog):
    # torch's own patch, not monkeypatch: undoing a monkeypatch on torch's config module
    # deletes the option (later tests then fail with "recompile_limit does not exist").
    with torch._dynamo.config.patch(recompile_limit=1):
        trainer = _trainer(tmp_path, period=1)
        with caplog.at_level(logging.WARNING, logger="trainkit.engine.hooks.compile_metrics"):
            trainer.train(0, 2)
    warnings = [
        r.message
        for r in caplog.records
        if r.name == "trainkit.engine.hooks.compile_metrics" and "recompile_limit=1" in r.message
    ]
    assert len(warnings) == 1 and "train_network" in warnings[0] and "EAGER" in warnings[0]
