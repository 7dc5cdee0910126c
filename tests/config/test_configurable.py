"""trainkit's own promises about ``configurable``: errors that say what to fix."""

import pytest

from trainkit.config import configurable, get_cfg


def test_from_config_must_return_a_mapping():
    class ReturnsNone:
        @configurable
        def __init__(self, a=1):
            self.a = a

        @classmethod
        def from_config(cls, cfg):
            return None

    with pytest.raises(TypeError, match=r"from_config must return a dict.*NoneType"):
        ReturnsNone(get_cfg())


def test_decorator_misuse_is_reported_when_decorating():
    with pytest.raises(TypeError, match="__init__"):

        @configurable
        def not_an_init(a):
            return a

    with pytest.raises(TypeError, match="needs a function"):
        configurable(from_config=object())


def test_error_for_a_positional_argument_names_from_config_and_the_fix():
    class Takes:
        @configurable
        def __init__(self, a, b=0):
            self.a, self.b = a, b

        @classmethod
        def from_config(cls, cfg):
            return {"a": 1}

    with pytest.raises(TypeError) as info:
        Takes(get_cfg(), 2)
    message = str(info.value)
    assert "Takes.from_config" in message and "by keyword" in message
    assert Takes(get_cfg(), b=2).b == 2
