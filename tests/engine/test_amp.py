"""AMPTrainer: bfloat16 on the CPU by default; float16 with a GradScaler when asked, done right."""

import itertools
import logging

import pytest
import torch
from torch import nn

from trainkit.engine import AMPTrainer, SimpleTrainer, hooks


class _InfGradAt(torch.autograd.Function):
    """Identity forward; at the chosen steps the backward pass returns inf gradients."""

    @staticmethod
    def forward(ctx, x, poison):
        ctx.poison = poison
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad * float("inf") if ctx.poison else grad), None


class _Model(nn.Module):
    def __init__(self, inf_grad_steps=()):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 1)
        self.inf_grad_steps = set(inf_grad_steps)
        self.calls = 0

    def forward(self, batch):
        x, y = batch
        poison = self.calls in self.inf_grad_steps
        self.calls += 1
        pred = _InfGradAt.apply(self.linear(x), poison).squeeze(1).float()
        return {"loss": ((pred - y) ** 2).mean()}


def _data():
    g = torch.Generator().manual_seed(0)
    # Small inputs: with the default scale of 2**16 no float16 gradient overflows by itself.
    x = 0.1 * torch.randn(16, 8, generator=g)
    return itertools.repeat((x, x.sum(1)))


class _GradNorm(hooks.HookBase):
    def __init__(self):
        self.norms = []

    def after_backward(self):
        grads = [p.grad for p in self.trainer.model.parameters()]
        self.norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))


def _run(trainer_cls, steps=3, **kwargs):
    model = _Model(kwargs.pop("inf_grad_steps", ()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    trainer = trainer_cls(model, _data(), optimizer, **kwargs)
    probe = _GradNorm()
    trainer.register_hooks([probe, hooks.LRScheduler(scheduler=scheduler)])
    trainer.train(0, steps)
    return trainer, probe, optimizer


def test_cpu_default_is_bfloat16_without_a_scaler():
    trainer, _, _ = _run(AMPTrainer)
    assert trainer.precision == torch.bfloat16
    assert trainer.grad_scaler is None


def test_float16_on_the_cpu_uses_a_scaler_and_hooks_see_true_gradients():
    reference, reference_probe, _ = _run(SimpleTrainer, steps=1)
    trainer, probe, _ = _run(AMPTrainer, steps=1, precision=torch.float16)
    assert isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    assert trainer.grad_scaler.get_scale() == 2.0**16
    # Scaled gradients would be 65536x larger; unscaled they match float32 up to fp16 rounding.
    assert probe.norms[0] == pytest.approx(reference_probe.norms[0], rel=2e-2)


def test_an_explicit_scaler_is_used():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    trainer, _, _ = _run(AMPTrainer, steps=1, precision=torch.float16, grad_scaler=scaler)
    assert trainer.grad_scaler is scaler


def test_a_skipped_step_is_logged_and_counted_and_the_schedule_advances(caplog):
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.simple_trainer"):
        trainer, _, optimizer = _run(
            AMPTrainer,
            steps=4,
            precision=torch.float16,
            inf_grad_steps=(1,),
            gather_metric_period=1,
        )
    assert trainer.num_skipped_steps == 1
    assert "skipped 1 optimizer step(s) in iteration 1 (1 so far)" in caplog.text
    assert trainer.iter == 4
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**4)
    counts = trainer.storage.history("[metric]amp_skipped_steps").values()
    assert [(v, i) for v, i in counts] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert trainer.state_dict()["amp_skipped_steps"] == 1


def test_skipped_step_leaves_the_weights_unchanged():
    model = _Model(inf_grad_steps=(0,))
    before = [p.detach().clone() for p in model.parameters()]
    trainer = AMPTrainer(
        model, _data(), torch.optim.SGD(model.parameters(), lr=0.1), precision=torch.float16
    )
    trainer.train(0, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("fused", [False, True])
def test_skipped_steps_are_counted_on_the_device_and_read_at_the_period_end(fused, caplog):
    model = _Model(inf_grad_steps=(2,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, fused=fused)
    trainer = AMPTrainer(model, _data(), optimizer, gather_metric_period=5, precision=torch.float16)
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.amp_trainer"):
        trainer.train(0, 10)
    # One read per period: iteration 4 (counting steps 0-3) and 9 (steps 0-8).
    counts = trainer.storage.history("[metric]amp_skipped_steps").values()
    assert [(v, i) for v, i in counts] == [(1, 4), (1, 9)]
    assert caplog.text.count("skipped 1 optimizer step(s) in iterations 0-3 (1 so far)") == 1
    assert "skipped" not in caplog.text.split("(1 so far)")[1]  # not warned again
    assert isinstance(trainer._skipped_on_device, torch.Tensor)  # a device count, not an int
    assert trainer.num_skipped_steps == 1


def test_the_skipped_count_is_resumed():
    first, _, _ = _run(AMPTrainer, steps=3, precision=torch.float16, inf_grad_steps=(0,))
    state = first.state_dict()
    second, _, _ = _run(AMPTrainer, steps=0, precision=torch.float16)
    second.load_state_dict(state)
    assert second.num_skipped_steps == 1
