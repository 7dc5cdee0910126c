"""Model settings a user gets wrong are UsageErrors naming the config key."""

import pytest
import torch

from trainkit.config import ConfigError, get_cfg
from trainkit.modeling import META_ARCH_REGISTRY, build_model, model_device
from trainkit.utils import UsageError
from trainkit.utils.errors import UnknownNameError


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.merge_from_list([x for kv in overrides.items() for x in kv])
    return cfg


def test_unknown_architecture_names_the_key_and_lists_the_registered_ones():
    with pytest.raises(UnknownNameError) as info:
        build_model(_cfg(**{"MODEL.META_ARCHITECTURE": "ImageClasifier"}))
    error = info.value
    assert isinstance(error, UsageError) and isinstance(error, KeyError)
    message = str(error)
    assert message.startswith("MODEL.META_ARCHITECTURE 'ImageClasifier' is not registered")
    # ViTClassifier is a near miss too, so it may follow in the list
    assert "Did you mean ImageClassifier" in message and "Registered: " in message


def test_an_architecture_registered_for_a_test_can_be_removed():
    @META_ARCH_REGISTRY.register()
    class _ArchForOneTest(torch.nn.Module):
        def __init__(self, cfg):
            super().__init__()

    try:
        assert isinstance(
            build_model(_cfg(**{"MODEL.META_ARCHITECTURE": "_ArchForOneTest"})), _ArchForOneTest
        )
    finally:
        META_ARCH_REGISTRY.remove("_ArchForOneTest")
    assert "_ArchForOneTest" not in META_ARCH_REGISTRY


@pytest.mark.parametrize("device", ["gpu", "cuda:abc"])
def test_device_that_is_not_one_is_a_config_error(device):
    with pytest.raises(ConfigError, match=rf"MODEL\.DEVICE='{device}' is not a device name"):
        model_device(_cfg(**{"MODEL.DEVICE": device}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda_is_a_config_error():
    with pytest.raises(ConfigError, match=r"MODEL\.DEVICE='cuda' but CUDA is not available"):
        model_device(_cfg(**{"MODEL.DEVICE": "cuda"}))


@pytest.mark.parametrize(
    "key, value",
    [
        ("MODEL.NUM_CLASSES", "0"),
        ("MODEL.CLASSIFIER.CHANNELS", "(8, 0)"),
        ("MODEL.CLASSIFIER.POOL", "median"),
        ("MODEL.CLASSIFIER.INPUT_NORM", "batch"),
        ("MODEL.CLASSIFIER.LABEL_SMOOTHING", "1.0"),
        ("MODEL.PIXEL_STD", "(1.0, 0.0, 1.0)"),
    ],
)
def test_image_classifier_settings_are_config_errors_naming_the_key(key, value):
    cfg = _cfg(**{key: value, "MODEL.META_ARCHITECTURE": "ImageClassifier"})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_model(cfg)
