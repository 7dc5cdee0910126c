"""The step on CUDA: fp16 and bf16 train, no host-device wait between writer periods, and a
NaN found by the deferred check names the first bad step (no checkpoint written after it)."""

import itertools

import pytest
import torch
from torch import nn

from trainkit.checkpoint import Checkpointer
from trainkit.config import get_cfg
from trainkit.engine import AMPTrainer, HookBase, HookPriority, SimpleTrainer, hooks
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.modeling import build_model
from trainkit.solver import build_optimizer
from trainkit.utils.periodic import is_last_iter, is_period_end

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class _TinyConvNet(nn.Module):
    """Classify which colour channel of an image is the brightest; ``nan_steps`` poison."""

    def __init__(self, nan_steps=()):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(16, 3)
        self.nan_steps = set(nan_steps)
        self.calls = 0

    def forward(self, batch):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.head(self.features(images)), labels)
        if self.calls in self.nan_steps:
            loss = loss * float("nan")
        self.calls += 1
        return {"loss_cls": loss}


def _batches(n=8, batch_size=64):
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n):
        images = torch.rand(batch_size, 3, 16, 16, generator=generator)
        labels = torch.randint(0, 3, (batch_size,), generator=generator)
        images[torch.arange(batch_size), labels] += 0.5  # the label's channel is brighter
        batches.append((images.cuda(), labels.cuda()))
    return itertools.cycle(batches)


def _mean_loss(trainer, iterations):
    history = dict((i, v) for v, i in trainer.storage.history("total_loss").values())
    return sum(history[i] for i in iterations) / len(iterations)


@pytest.mark.parametrize("precision", [torch.float16, torch.bfloat16])
def test_mixed_precision_steps_train_a_convnet(precision):
    model = _TinyConvNet().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    trainer = AMPTrainer(model, _batches(), optimizer, precision=precision)
    trainer.train(0, 80)
    assert (trainer.grad_scaler is not None) is (precision == torch.float16)
    first, last = _mean_loss(trainer, range(5)), _mean_loss(trainer, range(75, 80))
    assert last < 0.5 * first, (first, last)
    if precision == torch.float16:
        assert trainer.num_skipped_steps < 10  # a few at the start, while the scale settles


def test_build_optimizer_is_fused_on_cuda():
    model = _TinyConvNet().cuda()
    cfg = get_cfg()
    optimizer = build_optimizer(cfg, model)
    assert optimizer.defaults["fused"] is True
    assert getattr(optimizer, "_step_supports_amp_scaling", False)


class _SyncDebugBetweenPeriods(HookBase):
    """Make any host-device wait an error during the steps that do not end a period."""

    priority = HookPriority.HIGHEST

    def __init__(self, period, warmup):
        self._period, self._warmup = period, warmup
        self.checked = []

    def before_step(self):
        cur_iter, trainer = self.trainer.iter, self.trainer
        is_period_step = is_period_end(cur_iter, self._period) or is_last_iter(
            cur_iter, trainer.max_iter
        )
        if cur_iter >= self._warmup and not is_period_step:
            self.checked.append(cur_iter)
            torch.cuda.set_sync_debug_mode("error")


class _SyncDebugOff(HookBase):
    priority = HookPriority.LOWEST

    def after_step(self):
        torch.cuda.set_sync_debug_mode(0)

    def after_train(self):
        torch.cuda.set_sync_debug_mode(0)


def _classifier_batches(batch_size=8):
    # CPU uint8 images in dicts, as the mapper gives them: the model copies them over.
    generator = torch.Generator().manual_seed(0)
    records = [
        {
            "image": torch.randint(0, 256, (3, 32, 32 + 8 * (i % 2)), dtype=torch.uint8),
            "label": int(torch.randint(0, 4, (), generator=generator)),
        }
        for i in range(batch_size)
    ]
    return itertools.repeat(records)


@pytest.mark.parametrize("precision", [None, torch.float16, torch.bfloat16])
def test_no_host_device_wait_between_writer_periods(tmp_path, precision):
    torch.backends.cudnn.benchmark = False  # autotuning waits; it is a first-steps cost anyway
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ImageClassifier"
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [8, 16]
    cfg.MODEL.DEVICE = "cuda"
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)  # fused on CUDA: takes the scaler's state there
    period = 10
    kwargs = {"gather_metric_period": period, "record_every_step": True}
    if precision is None:
        trainer = SimpleTrainer(model, _classifier_batches(), optimizer, **kwargs)
    else:
        trainer = AMPTrainer(model, _classifier_batches(), optimizer, precision=precision, **kwargs)
    sync_debug = _SyncDebugBetweenPeriods(period, warmup=2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    trainer.register_hooks(
        [
            sync_debug,
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=scheduler),
            hooks.ModelEMA(decay=0.9),
            hooks.PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), period),
            _SyncDebugOff(),
        ]
    )
    try:
        trainer.train(0, 25)  # raises "called a synchronizing CUDA operation" on a wait
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert sync_debug.checked == [*range(2, 9), *range(10, 19), *range(20, 24)]
    assert len(trainer.storage.history("total_loss").values()) == 25
    assert (tmp_path / "model_0000019.pth").exists()


def test_a_nan_on_cuda_names_the_first_bad_step_and_no_later_checkpoint(tmp_path):
    model = _TinyConvNet(nan_steps=(3,)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, fused=True)
    trainer = SimpleTrainer(model, _batches(), optimizer, gather_metric_period=10)
    assert trainer.deferred_checks is None  # auto: deferred, the loss is on CUDA
    trainer.register_hooks([hooks.PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), 5)])
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train(0, 20)
    assert info.value.iteration == 3
    assert "noticed at iteration 4" in str(info.value)
    assert set(info.value.losses) == {"loss_cls", "total_loss"}
    assert not list(tmp_path.glob("*.pth"))  # model_0000004 would hold the NaN step's update


class _ModelThatWaits(_TinyConvNet):
    def forward(self, batch):
        losses = super().forward(batch)
        if losses["loss_cls"].item() > 1e9:  # a wait inside the model's forward
            raise AssertionError("unreachable")
        return losses


def test_a_wait_inside_the_model_is_reported_as_the_models():
    model = _ModelThatWaits().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    trainer = AMPTrainer(
        model, _batches(), optimizer, gather_metric_period=10, record_every_step=True
    )
    counter = hooks.DeviceWaitCounter(period=10)
    trainer.register_hooks([counter, hooks.IterationTimer()])
    trainer.train(0, 12)
    # All but 0-1 (warm-up), 9 (a period end) and 11 (the last); one .item() each.
    assert counter.num_steps_counted == 8
    assert counter.waits["model"] >= 8 and counter.waits["trainer"] == 0
