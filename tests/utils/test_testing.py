"""trainkit.utils.testing.reload_lazy_config: a LazyConfig after the save/load round trip."""

import pytest
from omegaconf import DictConfig

from trainkit.config import ConfigError, LazyCall, instantiate
from trainkit.layers import ShapeSpec
from trainkit.utils.testing import reload_lazy_config


class Holder:
    def __init__(self, value, extra=None):
        self.value, self.extra = value, extra


def test_reload_keeps_values_interpolations_and_targets():
    cfg = LazyCall(Holder)(value=3, extra=LazyCall(ShapeSpec)(channels="${..value}"))
    reloaded = reload_lazy_config(cfg)
    assert reloaded.extra._target_ == "trainkit.layers.ShapeSpec"  # an import path now
    reloaded.value = 5  # the interpolation survived the file
    built = instantiate(reloaded)
    assert isinstance(built, Holder) and built.extra == ShapeSpec(channels=5)


def test_reload_refuses_what_cannot_be_saved():
    cfg = DictConfig({"f": lambda: 1}, flags={"allow_objects": True})
    with pytest.raises(ConfigError, match="cannot save the config"):
        reload_lazy_config(cfg)
