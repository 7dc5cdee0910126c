"""detectron2's solver behaviours (tests/test_solver.py and solver/build.py) through trainkit."""

import math

import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.solver import build_optimizer, get_default_optimizer_params
from trainkit.solver.build import (
    _expand_param_groups,
    maybe_add_gradient_clipping,
    reduce_param_groups,
)


# ---- merging param groups (strings stand in for parameters, as any hashable works) --------
def test_expand_gives_each_parameter_its_merged_hyperparameters():
    groups = [
        {"params": ["a", "b", "c", "d"], "lr": 1.0, "weight_decay": 3.0},
        {"params": ["b", "c", "e"], "lr": 2.0, "momentum": 2.0},
        {"params": ["a"], "weight_decay": 4.0},
    ]
    assert _expand_param_groups(groups) == [
        {"params": ["a"], "lr": 1.0, "weight_decay": 4.0},  # the later group wins
        {"params": ["b"], "lr": 2.0, "weight_decay": 3.0, "momentum": 2.0},
        {"params": ["c"], "lr": 2.0, "weight_decay": 3.0, "momentum": 2.0},
        {"params": ["d"], "lr": 1.0, "weight_decay": 3.0},
        {"params": ["e"], "lr": 2.0, "momentum": 2.0},
    ]


def test_reduce_merges_groups_with_equal_hyperparameters_in_first_seen_order():
    groups = [
        {"params": ["a"], "lr": 1.0, "weight_decay": 4.0},
        {"params": ["b", "f"], "lr": 2.0, "weight_decay": 3.0, "momentum": 2.0},
        {"params": ["c"], "momentum": 2.0, "weight_decay": 3.0, "lr": 2.0},  # keys reordered
        {"params": ["d"], "lr": 1.0, "weight_decay": 3.0},
        {"params": ["e"], "lr": 2.0, "momentum": 2.0},
    ]
    reduced = reduce_param_groups(groups)
    assert reduced == [
        {"lr": 1.0, "weight_decay": 4.0, "params": ["a"]},
        {"lr": 2.0, "weight_decay": 3.0, "momentum": 2.0, "params": ["b", "f", "c"]},
        {"lr": 1.0, "weight_decay": 3.0, "params": ["d"]},
        {"lr": 2.0, "momentum": 2.0, "params": ["e"]},
    ]
    assert list(reduced[0]) == ["lr", "weight_decay", "params"]


def test_reduce_keeps_distinct_tensors_apart_even_when_equal():
    first, second = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    reduced = reduce_param_groups([{"params": [first, second], "lr": 1.0}, {"params": [first]}])
    assert len(reduced) == 1
    assert [id(p) for p in reduced[0]["params"]] == [id(first), id(second)]


# ---- get_default_optimizer_params with detectron2's signature -----------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 2)


def _group_of(groups, param):
    (group,) = [g for g in groups if any(p is param for p in g["params"])]
    return group


def test_positional_order_is_detectron2s():
    net = _Net()

    def half_for_backbone(name):
        return 0.5 if name.startswith("backbone.") else 1.0

    overrides = {"weight": {"weight_decay": 0.25}}
    # model, base_lr, weight_decay, weight_decay_norm, bias_lr_factor, weight_decay_bias,
    # lr_factor_func, overrides
    groups = get_default_optimizer_params(
        net, 1.0, 1e-4, 0.0, 1.0, None, half_for_backbone, overrides
    )
    assert _group_of(groups, net.backbone[0].weight) == {
        "params": [net.backbone[0].weight, net.backbone[1].weight],
        "lr": 0.5,
        "weight_decay": 0.25,  # overrides apply last, to the norm's weight too
    }
    assert _group_of(groups, net.backbone[1].bias)["weight_decay"] == 0.0
    assert _group_of(groups, net.head.bias) == {
        "params": [net.head.bias],
        "lr": 1.0,
        "weight_decay": 1e-4,
    }
    assert sum(len(g["params"]) for g in groups) == len(list(net.parameters()))


def test_lr_factor_func_sees_qualified_names_and_needs_base_lr():
    net = _Net()
    seen = []

    def record(name):
        seen.append(name)
        return 1.0

    get_default_optimizer_params(net, base_lr=0.1, lr_factor_func=record)
    assert seen == [name for name, _ in net.named_parameters()]
    with pytest.raises(ValueError, match="base_lr"):
        get_default_optimizer_params(net, lr_factor_func=record)


def test_bias_overrides_conflict_with_an_explicit_bias_override():
    with pytest.raises(ValueError, match="bias"):
        get_default_optimizer_params(
            _Net(), base_lr=1.0, bias_lr_factor=2.0, overrides={"bias": {"lr": 3.0}}
        )


def test_groups_feed_a_torch_optimizer_directly():
    net = _Net()
    optimizer = torch.optim.SGD(
        get_default_optimizer_params(net, weight_decay_norm=0.0), lr=0.01, weight_decay=1e-4
    )
    assert _group_of(optimizer.param_groups, net.backbone[1].weight)["weight_decay"] == 0.0
    assert _group_of(optimizer.param_groups, net.head.weight)["weight_decay"] == 1e-4


# ---- build_optimizer and gradient clipping from detectron2 config keys --------------------
def _clip_cfg(clip_type, clip_value=1.0, norm_type=2.0):
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR, cfg.SOLVER.MOMENTUM, cfg.SOLVER.WEIGHT_DECAY = 1.0, 0.0, 0.0
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = clip_type
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = clip_value
    cfg.SOLVER.CLIP_GRADIENTS.NORM_TYPE = norm_type
    return cfg


def _applied_step(cfg, grads):
    """Return the update SGD (lr 1) applies to two parameters with gradients ``grads``."""
    first, second = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    model = nn.Module()
    model.first, model.second = first, second
    optimizer = build_optimizer(cfg, model)
    first.grad, second.grad = torch.tensor(grads[0]), torch.tensor(grads[1])
    optimizer.step()
    return -first.detach(), -second.detach()


def test_clip_by_value():
    first, second = _applied_step(_clip_cfg("value", 0.5), [[2.0, -0.1], [-3.0, 0.2]])
    assert first.tolist() == pytest.approx([0.5, -0.1])
    assert second.tolist() == pytest.approx([-0.5, 0.2])


def test_clip_by_norm_is_per_parameter():
    first, second = _applied_step(_clip_cfg("norm", 1.0), [[3.0, 4.0], [0.3, 0.4]])
    assert first.tolist() == pytest.approx([0.6, 0.8], abs=1e-5)
    assert second.tolist() == pytest.approx([0.3, 0.4], abs=1e-5)  # under the limit


def test_clip_by_infinity_norm_from_a_yaml_file(tmp_path):
    cfg = _clip_cfg("norm", 1.0)
    path = tmp_path / "clip.yaml"
    path.write_text("SOLVER:\n  CLIP_GRADIENTS:\n    NORM_TYPE: .inf\n")
    cfg.merge_from_file(str(path))
    assert math.isinf(cfg.SOLVER.CLIP_GRADIENTS.NORM_TYPE)
    first, _ = _applied_step(cfg, [[4.0, 2.0], [0.0, 0.0]])
    assert first.tolist() == pytest.approx([1.0, 0.5], abs=1e-5)


def test_unknown_clip_type_is_a_value_error():
    with pytest.raises(ValueError, match="CLIP_TYPE"):
        _applied_step(_clip_cfg("Value"), [[1.0, 1.0], [1.0, 1.0]])


def test_maybe_add_gradient_clipping_on_a_class_and_an_instance():
    cfg = _clip_cfg("value", 0.5)
    clipped_cls = maybe_add_gradient_clipping(cfg, torch.optim.SGD)
    assert issubclass(clipped_cls, torch.optim.SGD) and clipped_cls is not torch.optim.SGD
    assert clipped_cls.__name__ == "SGDWithGradientClip"
    param = nn.Parameter(torch.zeros(1))
    instance = torch.optim.SGD([param], lr=1.0)
    assert maybe_add_gradient_clipping(cfg, instance) is instance
    param.grad = torch.tensor([5.0])
    instance.step()
    assert param.item() == pytest.approx(-0.5)
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = False
    assert maybe_add_gradient_clipping(cfg, torch.optim.SGD) is torch.optim.SGD


def test_build_optimizer_default_is_sgd_with_config_hyperparameters():
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR, cfg.SOLVER.BIAS_LR_FACTOR, cfg.SOLVER.WEIGHT_DECAY_BIAS = 0.1, 2.0, 0.0
    net = _Net()
    optimizer = build_optimizer(cfg, net)
    assert type(optimizer) is torch.optim.SGD
    bias_group = _group_of(optimizer.param_groups, net.head.bias)
    assert bias_group["lr"] == pytest.approx(0.2) and bias_group["weight_decay"] == 0.0
    weight_group = _group_of(optimizer.param_groups, net.head.weight)
    assert weight_group["momentum"] == cfg.SOLVER.MOMENTUM
    assert weight_group["weight_decay"] == cfg.SOLVER.WEIGHT_DECAY
