"""ASPP, DepthwiseSeparableConv2d and CNNBlockBase (detectron2's layers.aspp / layers.blocks)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainkit.layers import ASPP, CNNBlockBase, DepthwiseSeparableConv2d, FrozenBatchNorm2d
from trainkit.layers.aspp import ASPP as ASPPAtPath
from trainkit.layers.blocks import DepthwiseSeparableConv2d as DSCAtPath
from trainkit.utils.errors import UsageError


def test_aspp_shapes_branches_and_detectron2_import_paths():
    assert ASPPAtPath is ASPP and DSCAtPath is DepthwiseSeparableConv2d
    aspp = ASPP(4, 6, [1, 2, 3], norm="BN", activation=F.relu, dropout=0.1).eval()
    out = aspp(torch.randn(2, 4, 8, 12))
    assert out.shape == (2, 6, 8, 12)
    assert (out >= 0).all()  # the projection ends in the activation
    assert len(aspp.convs) == 5
    assert [aspp.convs[i].dilation for i in (1, 2, 3)] == [(1, 1), (2, 2), (3, 3)]
    # norm "" means no norm layers and biases instead
    plain = ASPP(4, 6, [1, 2, 3], norm="", activation=F.relu)
    assert plain.convs[0].norm is None and plain.convs[0].bias is not None


def test_aspp_pool_kernel_must_divide_the_input():
    aspp = ASPP(3, 4, [1, 2, 3], norm="", activation=F.relu, pool_kernel_size=(4, 4)).eval()
    assert aspp(torch.randn(1, 3, 8, 12)).shape == (1, 4, 8, 12)
    with pytest.raises(UsageError, match=r"does not divide the input size \(8, 10\)"):
        aspp(torch.randn(1, 3, 8, 10))
    with pytest.raises(UsageError, match="exactly 3 dilations"):
        ASPP(3, 4, [1, 2], norm="", activation=F.relu)


def test_aspp_depthwise_separable_branches():
    aspp = ASPP(4, 6, [1, 2, 3], norm="BN", activation=F.relu, use_depthwise_separable_conv=True)
    assert all(isinstance(aspp.convs[i], DepthwiseSeparableConv2d) for i in (1, 2, 3))
    assert aspp.convs[2].depthwise.dilation == (2, 2)
    assert aspp(torch.randn(2, 4, 6, 6)).shape == (2, 6, 6, 6)


def test_depthwise_separable_conv_is_grouped_then_pointwise():
    conv = DepthwiseSeparableConv2d(4, 8, kernel_size=5, padding=2, norm1="BN", norm2="")
    assert conv.depthwise.groups == 4 and conv.depthwise.weight.shape == (4, 1, 5, 5)
    assert conv.depthwise.bias is None  # a conv followed by a norm has no bias
    assert conv.pointwise.weight.shape == (8, 4, 1, 1) and conv.pointwise.bias is not None
    assert conv(torch.randn(1, 4, 7, 9)).shape == (1, 8, 7, 9)


def test_cnn_block_base_freeze():
    class Block(CNNBlockBase):
        def __init__(self):
            super().__init__(3, 5, 2)
            self.conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)
            self.norm = nn.BatchNorm2d(5)

        def forward(self, x):
            return self.norm(self.conv(x))

    block = Block()
    assert (block.in_channels, block.out_channels, block.stride) == (3, 5, 2)
    assert block.freeze() is block
    assert not any(p.requires_grad for p in block.parameters())
    assert isinstance(block.norm, FrozenBatchNorm2d)
