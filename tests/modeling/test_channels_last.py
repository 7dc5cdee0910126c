"""MODEL.CHANNELS_LAST: the model's weights and input batch in NHWC, same results as NCHW."""

from __future__ import annotations

import logging

import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.modeling import build_model
from trainkit.modeling.build import to_channels_last

_CL = torch.channels_last


def _cfg(channels_last: bool):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ImageClassifier"
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [4, 8, 8]
    cfg.MODEL.CHANNELS_LAST = channels_last
    return cfg


def _batch():
    generator = torch.Generator().manual_seed(0)
    sizes = [(40, 56), (64, 48), (33, 70)]  # different sizes: the batch carries padding
    return [
        {
            "image": torch.randint(0, 256, (3, h, w), generator=generator, dtype=torch.uint8),
            "label": i % 4,
        }
        for i, (h, w) in enumerate(sizes)
    ]


def _pair():
    torch.manual_seed(0)
    plain = build_model(_cfg(False))
    nhwc = build_model(_cfg(True))
    nhwc.load_state_dict(plain.state_dict())  # keeps nhwc's layout, takes plain's values
    return plain, nhwc


def test_weights_and_input_batch_are_channels_last():
    plain, nhwc = _pair()
    convs = [m for m in nhwc.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=_CL) for c in convs)
    assert not plain.stages[0].convs[0].weight.is_contiguous(memory_format=_CL)
    batch, mask = nhwc.preprocess_image(_batch())
    assert batch.is_contiguous(memory_format=_CL) and not batch.is_contiguous()
    plain_batch, _ = plain.preprocess_image(_batch())
    assert plain_batch.is_contiguous()
    assert torch.equal(batch, plain_batch)
    # The features keep the layout through the masked stages (no silent conversion back).
    x = batch
    for stage in nhwc.stages:
        x, mask = stage(x, mask)
        assert x.is_contiguous(memory_format=_CL)


def test_same_losses_gradients_and_logits_as_contiguous():
    plain, nhwc = _pair()
    losses = {}
    for name, model in (("plain", plain), ("nhwc", nhwc)):
        model.train()
        loss = model(_batch())["loss_cls"]
        loss.backward()
        losses[name] = loss.detach()
    torch.testing.assert_close(losses["nhwc"], losses["plain"], rtol=1e-5, atol=1e-6)
    grads = dict(plain.named_parameters())
    for name, param in nhwc.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-5)
        if param.dim() == 4:
            assert param.grad.is_contiguous(memory_format=_CL), name
    plain.eval(), nhwc.eval()
    with torch.no_grad():
        torch.testing.assert_close(nhwc(_batch()), plain(_batch()), rtol=1e-5, atol=1e-5)


def test_checkpoints_load_both_ways():
    plain, nhwc = _pair()
    state = nhwc.state_dict()
    reloaded = build_model(_cfg(False))
    reloaded.load_state_dict(state)
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name


def test_a_model_without_convolutions_is_warned_about_and_left_as_is(caplog):
    model = nn.Sequential(nn.Linear(4, 4))
    with caplog.at_level(logging.WARNING, logger="trainkit.modeling.build"):
        assert to_channels_last(model) is model
    assert "MODEL.CHANNELS_LAST is on but Sequential has no 4-D" in caplog.text
    assert model[0].weight.is_contiguous()
