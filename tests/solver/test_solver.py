import io
import logging

import pytest
import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from trainkit.config import get_cfg
from trainkit.solver import (
    LRMultiplier,
    WarmupParamScheduler,
    build_lr_scheduler,
    build_optimizer,
    get_default_optimizer_params,
)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 2, bias=False)
        self.tied = self.head  # shared module: its weight must appear once


def _group_of(groups, param):
    matches = [g for g in groups if any(p is param for p in g["params"])]
    assert len(matches) == 1
    return matches[0]


def _cfg(**solver):
    cfg = get_cfg()
    for key, value in solver.items():
        setattr(cfg.SOLVER, key, value)
    return cfg


def test_param_groups_separate_norm_and_bias():
    net = _Net()
    groups = get_default_optimizer_params(
        net,
        base_lr=0.1,
        weight_decay=1e-4,
        weight_decay_norm=0.0,
        bias_lr_factor=2.0,
        weight_decay_bias=1e-5,
    )
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len(list(net.parameters())) == len({id(p) for p in params})
    assert _group_of(groups, net.fc.weight) == _group_of(groups, net.head.weight)
    assert _group_of(groups, net.fc.weight)["weight_decay"] == 1e-4
    assert _group_of(groups, net.norm.weight)["weight_decay"] == 0.0
    assert _group_of(groups, net.norm.weight)["lr"] == 0.1
    bias_group = _group_of(groups, net.fc.bias)
    assert bias_group["lr"] == pytest.approx(0.2)
    assert bias_group["weight_decay"] == 1e-5


def test_param_groups_skip_frozen_and_check_bias_lr():
    net = _Net()
    net.fc.weight.requires_grad_(False)
    params = [p for g in get_default_optimizer_params(net) for p in g["params"]]
    assert all(p is not net.fc.weight for p in params)
    with pytest.raises(ValueError, match="base_lr"):
        get_default_optimizer_params(net, bias_lr_factor=2.0)


def test_build_sgd_and_adamw():
    net = _Net()
    sgd = build_optimizer(_cfg(BASE_LR=0.5, MOMENTUM=0.8, NESTEROV=True, WEIGHT_DECAY=0.01), net)
    assert isinstance(sgd, torch.optim.SGD)
    fc_group = _group_of(sgd.param_groups, net.fc.weight)
    assert (fc_group["lr"], fc_group["momentum"], fc_group["nesterov"]) == (0.5, 0.8, True)
    assert fc_group["weight_decay"] == 0.01
    assert _group_of(sgd.param_groups, net.norm.weight)["weight_decay"] == 0.0

    adamw = build_optimizer(_cfg(OPTIMIZER="AdamW", BETAS=(0.8, 0.9), EPS=1e-6), net)
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.param_groups[0]["betas"] == (0.8, 0.9)


def test_unknown_optimizer_lists_choices():
    with pytest.raises(ValueError, match="SGD, AdamW"):
        build_optimizer(_cfg(OPTIMIZER="Adagrad"), _Net())


def _one_step_with_grad(clip_type, grad, clip_value=1.0):
    net = nn.Linear(2, 1, bias=False)
    cfg = _cfg(BASE_LR=1.0, MOMENTUM=0.0, WEIGHT_DECAY=0.0, WEIGHT_DECAY_NORM=0.0)
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = clip_type
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = clip_value
    optimizer = build_optimizer(cfg, net)
    before = net.weight.detach().clone()
    net.weight.grad = torch.tensor([grad])
    optimizer.step()
    return before - net.weight.detach()  # = the clipped gradient (lr 1, plain SGD)


def test_gradient_clipping_by_value():
    step = _one_step_with_grad("value", [3.0, -0.5])
    assert torch.allclose(step, torch.tensor([[1.0, -0.5]]))


@pytest.mark.parametrize("clip_type", ["norm", "full_model"])
def test_gradient_clipping_by_norm(clip_type):
    step = _one_step_with_grad(clip_type, [3.0, 4.0])
    assert torch.allclose(step, torch.tensor([[0.6, 0.8]]), atol=1e-5)


def test_unknown_clip_type_lists_choices():
    with pytest.raises(ValueError, match="value, norm, full_model"):
        _one_step_with_grad("elementwise", [1.0, 1.0])


def _lrs(scheduler, optimizer, num_iters):
    lrs = []
    for _ in range(num_iters):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_multistep_schedule_values():
    cfg = _cfg(
        BASE_LR=1.0,
        MAX_ITER=100,
        STEPS=(30, 60),
        GAMMA=0.1,
        WARMUP_ITERS=10,
        WARMUP_FACTOR=0.1,
        WARMUP_METHOD="linear",
    )
    optimizer = build_optimizer(cfg, nn.Linear(2, 2))
    scheduler = build_lr_scheduler(cfg, optimizer)
    assert isinstance(scheduler, LRMultiplier)
    lrs = _lrs(scheduler, optimizer, 100)
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[5] == pytest.approx(0.1 + 0.9 * 0.5)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[29] == pytest.approx(1.0)
    assert lrs[30] == pytest.approx(0.1)
    assert lrs[59] == pytest.approx(0.1)
    assert lrs[60] == pytest.approx(0.01)
    scheduler.step()  # stepping past the end is clamped, not an error
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_cosine_schedule_and_bias_lr_factor():
    cfg = _cfg(
        BASE_LR=2.0,
        MAX_ITER=50,
        LR_SCHEDULER_NAME="WarmupCosineLR",
        WARMUP_ITERS=0,
        BASE_LR_END_FACTOR=0.1,
        BIAS_LR_FACTOR=2.0,
    )
    net = nn.Linear(2, 2)
    optimizer = build_optimizer(cfg, net)
    scheduler = build_lr_scheduler(cfg, optimizer)
    lrs = _lrs(scheduler, optimizer, 50)
    assert lrs[0] == pytest.approx(2.0)
    assert lrs[25] == pytest.approx(2.0 * (0.1 + 0.45))  # half-way: mean of start and end
    assert _group_of(optimizer.param_groups, net.weight)["lr"] == pytest.approx(0.2, rel=1e-2)
    assert _group_of(optimizer.param_groups, net.bias)["lr"] == pytest.approx(0.4, rel=1e-2)


def test_constant_warmup():
    sched = WarmupParamScheduler(_Const(2.0), 0.5, 0.2, "constant")
    assert sched(0.0) == sched(0.19) == 1.0
    assert sched(0.2) == 2.0
    with pytest.raises(ValueError, match="linear, constant"):
        WarmupParamScheduler(_Const(1.0), 0.5, 0.2, "exp")


def test_unknown_scheduler_lists_choices():
    cfg = _cfg(LR_SCHEDULER_NAME="Poly")
    with pytest.raises(ValueError, match="WarmupMultiStepLR, WarmupCosineLR"):
        build_lr_scheduler(cfg, build_optimizer(cfg, nn.Linear(2, 2)))


def test_steps_beyond_max_iter_warn(caplog):
    cfg = _cfg(MAX_ITER=100, STEPS=(50, 200), WARMUP_ITERS=0)
    target = logging.getLogger("trainkit")
    attach = not target.propagate  # setup_logger() may have cut it off from caplog
    if attach:
        target.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="trainkit.solver.build"):
            scheduler = build_lr_scheduler(cfg, build_optimizer(cfg, nn.Linear(2, 2)))
    finally:
        if attach:
            target.removeHandler(caplog.handler)
    assert any("SOLVER.STEPS" in r.getMessage() and "200" in r.getMessage() for r in caplog.records)
    assert scheduler is not None


def test_scheduler_state_dict_round_trip():
    cfg = _cfg(BASE_LR=1.0, MAX_ITER=40, STEPS=(20,), WARMUP_ITERS=5)
    opt_a = build_optimizer(cfg, nn.Linear(2, 2))
    sched_a = build_lr_scheduler(cfg, opt_a)
    _lrs(sched_a, opt_a, 22)
    state = sched_a.state_dict()
    assert set(state) == {"base_lrs", "last_epoch", "_last_lr", "_step_count"}

    opt_b = build_optimizer(cfg, nn.Linear(2, 2))
    sched_b = build_lr_scheduler(cfg, opt_b)
    opt_b.load_state_dict(opt_a.state_dict())
    sched_b.load_state_dict(torch_round_trip(state))
    assert sched_b.last_epoch == 22
    assert sched_b.get_last_lr() == sched_a.get_last_lr()
    assert _lrs(sched_b, opt_b, 10) == _lrs(sched_a, opt_a, 10)


def torch_round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


class _Const(ParamScheduler):
    def __init__(self, value):
        self.value = value

    def __call__(self, where):
        return self.value


def test_get_warmup_factor_at_iter_for_projects_own_schedulers():
    from trainkit.config import ConfigError
    from trainkit.solver.lr_scheduler import _get_warmup_factor_at_iter

    assert _get_warmup_factor_at_iter("linear", 0, 10, 0.1) == pytest.approx(0.1)
    assert _get_warmup_factor_at_iter("linear", 5, 10, 0.1) == pytest.approx(0.55)
    assert _get_warmup_factor_at_iter("linear", 10, 10, 0.1) == 1.0
    assert _get_warmup_factor_at_iter("constant", 9, 10, 0.1) == pytest.approx(0.1)
    assert _get_warmup_factor_at_iter("constant", 0, 0, 0.1) == 1.0
    with pytest.raises(ConfigError, match="warm-up method"):
        _get_warmup_factor_at_iter("cosine", 0, 10, 0.1)


@pytest.mark.parametrize(
    ("impl", "expected"),
    [("", (False, None)), ("fused", (True, None)), ("foreach", (None, True))],
)
def test_optimizer_impl_picks_torch_implementation(impl, expected):
    # On the CPU "" keeps torch's default; fused would be chosen only with every parameter
    # on CUDA (tests/gpu/test_step.py).
    optimizer = build_optimizer(_cfg(OPTIMIZER_IMPL=impl), _Net())
    group = optimizer.param_groups[0]
    assert (group["fused"] or False, group["foreach"]) == (expected[0] or False, expected[1])


def test_for_loop_impl_and_unknown_impl():
    assert build_optimizer(_cfg(OPTIMIZER_IMPL="for_loop"), _Net()).defaults["foreach"] is False
    with pytest.raises(ValueError, match="SOLVER.OPTIMIZER_IMPL 'cuda'"):
        build_optimizer(_cfg(OPTIMIZER_IMPL="cuda"), _Net())


def _momentum_after_a_skipped_first_step(impl):
    cfg = get_cfg()
    cfg.SOLVER.OPTIMIZER = "SGD"
    cfg.SOLVER.MOMENTUM = 0.9
    cfg.SOLVER.OPTIMIZER_IMPL = impl
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = build_optimizer(cfg, model)
    scaler = torch.amp.GradScaler("cpu")
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4, generator=generator)).square().mean()
        if step == 0:
            loss = loss * float("inf")  # the scaler skips this step, as at a float16 start
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    return model.weight.detach(), optimizer.state[model.weight]["momentum_buffer"]


def test_fused_sgd_after_a_skipped_first_step_matches_the_loop():
    # torch's fused SGD leaves its momentum buffers uninitialised when the first step is
    # skipped (found on an H100: NaN weights two steps into a float16 run).
    fused_weight, fused_momentum = _momentum_after_a_skipped_first_step("fused")
    loop_weight, loop_momentum = _momentum_after_a_skipped_first_step("for_loop")
    assert torch.isfinite(fused_momentum).all()
    torch.testing.assert_close(fused_momentum, loop_momentum)
    torch.testing.assert_close(fused_weight, loop_weight)
