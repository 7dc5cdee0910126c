"""Conv2d with norm and activation, cat, get_norm, FrozenBatchNorm2d (values)."""

from collections import OrderedDict

import pytest
import torch
from torch import nn

from trainkit.layers import (
    Conv2d,
    FrozenBatchNorm2d,
    LayerNorm,
    ShapeSpec,
    cat,
    get_norm,
    move_device_like,
    nonzero_tuple,
)
from trainkit.utils.errors import UsageError


def test_shape_spec_defaults_to_unknown():
    spec = ShapeSpec(channels=3)
    assert (spec.channels, spec.height, spec.width, spec.stride) == (3, None, None, None)
    assert ShapeSpec(channels=3) == spec


def test_conv2d_applies_norm_then_activation():
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(4).eval()
    norm.running_mean.fill_(0.5)
    conv = Conv2d(2, 4, 3, padding=1, bias=False, norm=norm, activation=torch.relu)
    x = torch.randn(1, 2, 5, 5)
    plain = nn.functional.conv2d(x, conv.weight, padding=1)
    assert torch.allclose(conv(x), torch.relu(norm(plain)))
    assert Conv2d(2, 4, 1)(x).shape == (1, 4, 5, 5)


def test_cat_returns_a_single_tensor_as_is():
    t = torch.ones(2)
    assert cat([t]) is t
    assert torch.equal(cat([t, torch.zeros(1)]), torch.tensor([1.0, 1.0, 0.0]))


def test_nonzero_tuple_and_move_device_like():
    rows, cols = nonzero_tuple(torch.tensor([[0, 1], [1, 0]]))
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]
    assert move_device_like(torch.ones(1), torch.zeros(1)).device.type == "cpu"


def _bn_with_stats(channels=3):
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(channels)
    bn.weight.data.uniform_(0.5, 2)
    bn.bias.data.uniform_(-1, 1)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    return bn.eval()


def test_frozen_bn_equals_eval_mode_bn_and_trains_nothing():
    bn = _bn_with_stats()
    frozen = FrozenBatchNorm2d.convert_frozen_batchnorm(bn)
    assert isinstance(frozen, FrozenBatchNorm2d)
    x = torch.randn(2, 3, 4, 4)
    frozen.train()
    assert torch.allclose(frozen(x), bn(x), atol=1e-6)
    assert list(frozen.parameters()) == []
    assert torch.allclose(FrozenBatchNorm2d(3)(x), x)  # a new one is the identity


def test_convert_replaces_nested_batch_norms_in_place():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), _bn_with_stats(), nn.Sequential(_bn_with_stats()))
    x = torch.randn(1, 3, 2, 2)
    expected = model.eval()(x)
    converted = FrozenBatchNorm2d.convert_frozen_batchnorm(model)
    assert converted is model
    assert isinstance(model[1], FrozenBatchNorm2d) and isinstance(model[2][0], FrozenBatchNorm2d)
    assert torch.allclose(model.train()(x), expected, atol=1e-6)


def test_frozen_bn_loads_an_old_checkpoint_without_running_stats():
    frozen = FrozenBatchNorm2d(2)
    state = OrderedDict(weight=torch.tensor([2.0, 3.0]), bias=torch.tensor([1.0, 0.0]))
    state._metadata = OrderedDict({"": {"version": 1}})  # written before running stats existed
    frozen.load_state_dict(state)
    assert torch.equal(frozen.running_var, torch.ones(2))
    x = torch.ones(1, 2, 1, 1)
    assert torch.allclose(frozen(x).flatten(), torch.tensor([3.0, 3.0]), atol=1e-4)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("BN", nn.BatchNorm2d),
        ("SyncBN", nn.SyncBatchNorm),
        ("FrozenBN", FrozenBatchNorm2d),
        ("GN", nn.GroupNorm),
        ("LN", LayerNorm),
    ],
)
def test_get_norm_by_name(name, cls):
    layer = get_norm(name, 64)
    assert isinstance(layer, cls)
    if name == "GN":
        assert (layer.num_groups, layer.num_channels) == (32, 64)


def test_get_norm_none_callable_and_unknown():
    assert get_norm("", 8) is None and get_norm(None, 8) is None
    assert isinstance(get_norm(lambda c: nn.InstanceNorm2d(c), 8), nn.InstanceNorm2d)
    with pytest.raises(UsageError, match=r"Unknown norm 'BatchNorm'; choose one of BN"):
        get_norm("BatchNorm", 8)


def test_layer_norm_normalises_each_pixel_over_channels():
    x = torch.randn(2, 5, 3, 3)
    y = LayerNorm(5)(x)
    assert torch.allclose(y.mean(dim=1), torch.zeros(2, 3, 3), atol=1e-5)
    assert torch.allclose(y.var(dim=1, unbiased=False), torch.ones(2, 3, 3), atol=1e-3)
