"""A sharded model on CUDA (one process): bf16 with activation checkpointing trains, waits for
the device only at writer periods, and its step time is reported beside the unsharded model's."""

import time

import pytest
import torch

from tests.gpu.test_step import _classifier_batches, _SyncDebugBetweenPeriods, _SyncDebugOff
from trainkit.config import get_cfg
from trainkit.engine import AMPTrainer, hooks
from trainkit.engine.step_config import prepare_model
from trainkit.modeling import build_model
from trainkit.solver import build_optimizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _cfg(fsdp):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ImageClassifier"
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [32, 64, 128]
    cfg.MODEL.DEVICE = "cuda"
    cfg.MODEL.FSDP.ENABLED = fsdp
    cfg.MODEL.ACTIVATION_CHECKPOINTING = True
    cfg.SOLVER.AMP.ENABLED, cfg.SOLVER.AMP.PRECISION = True, "bfloat16"
    return cfg


def _trainer(fsdp, period=10):
    cfg = _cfg(fsdp)
    model = prepare_model(cfg, build_model(cfg))
    optimizer = build_optimizer(cfg, model)
    kwargs = {"gather_metric_period": period, "record_every_step": True}
    precision = None if fsdp else torch.bfloat16  # sharded: FSDP casts (param_dtype)
    return AMPTrainer(model, _classifier_batches(), optimizer, precision=precision, **kwargs)


def test_fsdp_bf16_with_checkpointing_waits_only_at_writer_periods():
    torch.backends.cudnn.benchmark = False
    trainer = _trainer(fsdp=True)
    sync_debug = _SyncDebugBetweenPeriods(10, warmup=2)
    trainer.register_hooks([sync_debug, hooks.IterationTimer(), _SyncDebugOff()])
    try:
        trainer.train(0, 25)  # raises "called a synchronizing CUDA operation" on a wait
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert sync_debug.checked == [*range(2, 9), *range(10, 19), *range(20, 24)]
    losses = trainer.storage.history("total_loss").values()
    assert len(losses) == 25 and all(loss == loss for loss, _ in losses)


def _step_time_s(trainer, steps=30, warmup=5):
    trainer.train(0, warmup)
    torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.train(warmup, warmup + steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def test_step_time_of_the_sharded_model_beside_the_unsharded_one(capsys):
    sharded, whole = _step_time_s(_trainer(fsdp=True)), _step_time_s(_trainer(fsdp=False))
    with capsys.disabled():
        print(
            f"\nFSDP (1 process, bf16, checkpointed) {sharded * 1e3:.2f} ms/step, unsharded "
            f"{whole * 1e3:.2f} ms/step: {sharded / whole:.2f}x"
        )
    assert sharded < 3 * whole  # one process: FSDP's gathers are copies, not communication
