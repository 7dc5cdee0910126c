"""reduce_param_groups beyond detectron2's cases: names, list-valued settings, bad groups."""

import pytest
import torch
from torch import nn

from trainkit.solver.build import reduce_param_groups


def test_param_names_stay_aligned_with_params():
    groups = [
        {"params": ["a", "b"], "param_names": ["na", "nb"], "lr": 1.0},
        {"params": ["c"], "param_names": ["nc"], "lr": 2.0},
        {"params": ["b"], "param_names": ["nb"], "lr": 2.0},
    ]
    assert reduce_param_groups(groups) == [
        {"lr": 1.0, "params": ["a"], "param_names": ["na"]},
        {"lr": 2.0, "params": ["b", "c"], "param_names": ["nb", "nc"]},
    ]


def test_named_groups_work_with_torch():
    weight, bias = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(1))
    groups = reduce_param_groups(
        [
            {"params": [weight], "param_names": ["w"], "lr": 0.1},
            {"params": [bias], "param_names": ["b"], "lr": 0.1},
        ]
    )
    optimizer = torch.optim.SGD(groups, lr=0.1)
    assert optimizer.param_groups[0]["param_names"] == ["w", "b"]


def test_names_of_a_wrong_length_are_refused():
    with pytest.raises(ValueError, match="2 params but 1 param_names"):
        reduce_param_groups([{"params": ["a", "b"], "param_names": ["na"]}])


def test_named_and_unnamed_parameters_cannot_share_a_group():
    with pytest.raises(ValueError, match="name all or none"):
        reduce_param_groups([{"params": ["a"], "param_names": ["na"]}, {"params": ["b"]}])


def test_group_without_params_is_refused():
    with pytest.raises(ValueError, match="param group 1 has no 'params'"):
        reduce_param_groups([{"params": ["a"]}, {"lr": 1.0}])


def test_list_and_tuple_settings_compare_equal():
    groups = [
        {"params": ["a"], "betas": [0.9, 0.999]},
        {"params": ["b"], "betas": (0.9, 0.999)},
        {"params": ["c"], "betas": (0.8, 0.999)},
    ]
    reduced = reduce_param_groups(groups)
    assert [g["params"] for g in reduced] == [["a", "b"], ["c"]]
    assert reduced[0]["betas"] == [0.9, 0.999]  # the first group's value is kept as given
