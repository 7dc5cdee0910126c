"""Solver settings a user gets wrong are ConfigErrors (UsageError + ValueError) naming the key."""

import pytest
import torch
from torch import nn

from trainkit.config import ConfigError, get_cfg
from trainkit.solver import WarmupCosineLR, WarmupMultiStepLR, build_lr_scheduler, build_optimizer
from trainkit.utils import UsageError


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.merge_from_list([x for kv in overrides.items() for x in kv])
    return cfg


def _optimizer():
    return torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)


@pytest.mark.parametrize(
    "key, value",
    [
        ("SOLVER.OPTIMIZER", "Adagrad"),
        ("SOLVER.BASE_LR", "-0.1"),
        ("SOLVER.MOMENTUM", "-0.9"),
        ("SOLVER.WEIGHT_DECAY", "-1.0"),
        ("SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "absolute"),
    ],
)
def test_optimizer_settings_are_config_errors_naming_the_key(key, value):
    cfg = _cfg(**{key: value, "SOLVER.CLIP_GRADIENTS.ENABLED": "True"})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
        build_optimizer(cfg, nn.Linear(2, 1))
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)


def test_nesterov_without_momentum_names_both_keys():
    cfg = _cfg(**{"SOLVER.NESTEROV": "True", "SOLVER.MOMENTUM": "0.0"})
    with pytest.raises(ConfigError, match=r"SOLVER\.NESTEROV=True needs SOLVER\.MOMENTUM > 0"):
        build_optimizer(cfg, nn.Linear(2, 1))


def test_a_model_with_nothing_to_train_is_a_config_error():
    frozen = nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(ConfigError, match="Linear has no parameter with requires_grad=True"):
        build_optimizer(get_cfg(), frozen)


@pytest.mark.parametrize(
    "key, value",
    [
        ("SOLVER.LR_SCHEDULER_NAME", "OneCycle"),
        ("SOLVER.MAX_ITER", "0"),
        ("SOLVER.WARMUP_ITERS", "-5"),
        ("SOLVER.WARMUP_METHOD", "cubic"),
    ],
)
def test_scheduler_settings_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_lr_scheduler(_cfg(**{key: value}), _optimizer())


def test_detectron2s_old_schedulers_report_config_errors_too():
    with pytest.raises(ConfigError, match=r"SOLVER\.STEPS"):
        WarmupMultiStepLR(_optimizer(), [20, 10])
    with pytest.raises(ConfigError, match=r"SOLVER\.WARMUP_METHOD"):
        WarmupMultiStepLR(_optimizer(), [10], warmup_method="cubic")
    with pytest.raises(ConfigError, match=r"SOLVER\.MAX_ITER"):
        WarmupCosineLR(_optimizer(), 0)
