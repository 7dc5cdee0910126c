"""ImageClassifier: outputs, padding invariance, per-image normalisation, config checks."""

from __future__ import annotations

import pytest
import torch

from trainkit.config import get_cfg
from trainkit.modeling import build_model


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ImageClassifier"
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [4, 8, 8]
    for key, value in overrides.items():
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def _image(height: int, width: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), generator=generator, dtype=torch.uint8)


def _randomise_bn_statistics(model: torch.nn.Module) -> None:
    # Fresh running statistics (mean 0, var 1) would hide a wrong eval-mode normalisation.
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)


def test_training_returns_loss_and_eval_returns_logits():
    torch.manual_seed(0)
    model = build_model(_cfg())
    batch = [{"image": _image(20, 30, 0), "label": 1}, {"image": _image(33, 17, 1), "label": 3}]
    losses = model(batch)
    assert set(losses) == {"loss_cls"} and losses["loss_cls"].ndim == 0
    losses["loss_cls"].backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        logits = model(batch)
    assert logits.shape == (2, 4)


@pytest.mark.parametrize("pool", ["avg", "max", "avgmax"])
@pytest.mark.parametrize("input_norm", ["image", "pixel"])
def test_eval_logits_do_not_depend_on_batch_mates(pool, input_norm):
    torch.manual_seed(0)
    model = build_model(
        _cfg(**{"MODEL.CLASSIFIER.POOL": pool, "MODEL.CLASSIFIER.INPUT_NORM": input_norm})
    )
    _randomise_bn_statistics(model)
    model.eval()
    small = {"image": _image(21, 37, 0)}
    # A larger batch-mate pads the small image on both sides by far more than the
    # size divisibility, so every stage sees padding next to its valid pixels.
    big = {"image": _image(90, 70, 1)}
    with torch.no_grad():
        alone = model([small])
        together = model([big, small])
    torch.testing.assert_close(together[1:], alone, rtol=1e-4, atol=1e-5)


def test_training_loss_does_not_depend_on_padding():
    # In training mode BN uses batch statistics over valid pixels only, so padding a lone
    # image more (a larger size divisibility) must not change its loss.
    losses = []
    for divisibility in (1, 64):
        torch.manual_seed(0)
        model = build_model(_cfg(**{"MODEL.CLASSIFIER.SIZE_DIVISIBILITY": divisibility}))
        losses.append(model([{"image": _image(23, 41, 0), "label": 2}])["loss_cls"])
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)


def test_image_norm_ignores_brightness_and_contrast():
    torch.manual_seed(0)
    model = build_model(_cfg(**{"MODEL.CLASSIFIER.INPUT_NORM": "image"}))
    _randomise_bn_statistics(model)
    model.eval()
    image = _image(24, 24, 0).float() * 0.5  # values in [0, 128)
    with torch.no_grad():
        base = model([{"image": image}])
        shifted = model([{"image": image * 1.5 + 40.0}])
    torch.testing.assert_close(shifted, base, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MODEL.CLASSIFIER.CHANNELS", [], "CHANNELS"),
        ("MODEL.CLASSIFIER.CONVS_PER_STAGE", 0, "CONVS_PER_STAGE"),
        ("MODEL.CLASSIFIER.INPUT_NORM", "batch", "INPUT_NORM"),
        ("MODEL.CLASSIFIER.POOL", "sum", "POOL"),
        ("MODEL.CLASSIFIER.LABEL_SMOOTHING", 1.0, "LABEL_SMOOTHING"),
        ("MODEL.PIXEL_STD", [1.0, 0.0, 1.0], "PIXEL_STD"),
    ],
)
def test_invalid_config_is_named(key, value, message):
    with pytest.raises(ValueError, match=message):
        build_model(_cfg(**{key: value}))


def test_training_without_label_is_explained():
    model = build_model(_cfg())
    with pytest.raises(KeyError, match="label"):
        model([{"image": _image(16, 16, 0)}])


def test_inputs_already_on_the_model_device_are_used_as_they_are():
    # What a device prefetcher delivers: images (and labels) already on the model's device.
    from trainkit.modeling.image_batch import to_device

    image = _image(16, 16, seed=0)
    assert to_device(image, torch.device("cpu")) is image
    model = build_model(_cfg())
    model.train()
    losses = model([{"image": _image(16, 20, seed=1), "label": 2}])
    assert set(losses) == {"loss_cls"} and losses["loss_cls"].dtype == torch.float32
