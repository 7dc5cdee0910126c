"""The meta-architecture registry and ``build_model``."""

from __future__ import annotations

import logging

import torch
from torch import nn

from trainkit.config import CfgNode, ConfigError
from trainkit.modeling.compile import compile_from_config
from trainkit.utils.errors import UnknownNameError
from trainkit.utils.registry import Registry

__all__ = [
    "META_ARCH_REGISTRY",
    "build_model",
    "build_registered_model",
    "model_device",
    "to_channels_last",
]

logger = logging.getLogger(__name__)

META_ARCH_REGISTRY = Registry("META_ARCH")
META_ARCH_REGISTRY.__doc__ = """Registry of whole-model architectures ("meta-architectures").

``build_model`` calls a class registered with ``@META_ARCH_REGISTRY.register()`` with the
config: its ``__init__(self, cfg)`` takes it, or a ``@configurable`` ``__init__`` takes
explicit arguments that ``from_config(cls, cfg)`` derives (detectron2's pattern: the model
can then be built without a config too). In training mode the model takes a batch (list of
mapped records) and returns a dict of scalar losses; in eval mode, predictions.
"""


def model_device(cfg: CfgNode) -> torch.device:
    """Return the device ``cfg.MODEL.DEVICE`` names, checking that this machine has it.

    Raises:
        ConfigError: A ``ValueError``: if the name is not a device, or names CUDA and CUDA
            is not available.
    """
    try:
        device = torch.device(cfg.MODEL.DEVICE)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(
            f"MODEL.DEVICE={cfg.MODEL.DEVICE!r} is not a device name ({e}); use cpu or cuda."
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"MODEL.DEVICE={cfg.MODEL.DEVICE!r} but CUDA is not available on this machine; "
            "set MODEL.DEVICE cpu."
        )
    return device


def build_model(cfg: CfgNode) -> nn.Module:
    """Build ``cfg.MODEL.META_ARCHITECTURE`` from the config and move it to ``cfg.MODEL.DEVICE``.

    Weights are not loaded here; use ``trainkit.checkpoint.Checkpointer`` for that.

    Args:
        cfg: the config.

    Returns:
        The model, in training mode, on ``cfg.MODEL.DEVICE`` (with ``MODEL.FSDP.ENABLED`` on
        the CPU and not compiled, for :func:`~trainkit.modeling.shard_from_config`); with
        ``MODEL.CHANNELS_LAST``
        its 4-D weights in channels-last memory (:func:`to_channels_last`);
        with ``MODEL.COMPILE.ENABLED``
        its ``compiled_methods`` compiled (:func:`trainkit.modeling.compile.compile_model`).

    Raises:
        UnknownNameError: A ``KeyError``: if MODEL.META_ARCHITECTURE is not registered (the
            message lists those that are).
        ConfigError: As :func:`model_device`.
        TypeError: If the registered object does not build an ``nn.Module``.
    """
    _check_registered(cfg)  # an unknown name is reported before a missing device
    device = model_device(cfg)  # before building: a device this machine lacks fails at once
    model = build_registered_model(cfg)
    if not cfg.MODEL.FSDP.ENABLED:
        # Sharded, it stays on the CPU: shard_from_config moves only each process's shards
        # to the device, so a model larger than one device can be built.
        model.to(device)
    if cfg.MODEL.CHANNELS_LAST:
        to_channels_last(model)
    logger.info("Model:\n%s", model)
    if cfg.MODEL.COMPILE.ENABLED and not cfg.MODEL.FSDP.ENABLED:
        # Sharded, each block is compiled before it is wrapped (shard_from_config).
        # The network part only (the compile seam); DDP, if any, wraps the model afterwards.
        compile_from_config(model, cfg)
    return model


def _check_registered(cfg: CfgNode) -> None:
    """Check that ``cfg.MODEL.META_ARCHITECTURE`` is registered.

    Raises:
        UnknownNameError: A ``KeyError``: if it is not (the message lists those that are).
    """
    meta_arch = cfg.MODEL.META_ARCHITECTURE
    if meta_arch not in META_ARCH_REGISTRY:
        raise UnknownNameError(
            META_ARCH_REGISTRY.unknown_name_message(meta_arch, key="MODEL.META_ARCHITECTURE")
        )


def build_registered_model(cfg: CfgNode) -> nn.Module:
    """Build ``cfg.MODEL.META_ARCHITECTURE`` from the registry, as its class makes it.

    Nothing else: the model stays on the default device its ``__init__`` creates tensors on
    (under ``with torch.device("meta"):`` nothing is allocated, as the dry run builds it),
    and it is neither moved, converted nor compiled (:func:`build_model` does that).

    Args:
        cfg: the config.

    Returns:
        The model the registered class builds from ``cfg``.

    Raises:
        UnknownNameError: A ``KeyError``: if MODEL.META_ARCHITECTURE is not registered (the
            message lists those that are).
        TypeError: If the registered object does not build an ``nn.Module``.
    """
    _check_registered(cfg)
    meta_arch = cfg.MODEL.META_ARCHITECTURE
    model = META_ARCH_REGISTRY.get(meta_arch)(cfg)
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"META_ARCH_REGISTRY entry {meta_arch!r} built a {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    return model


def to_channels_last(model: nn.Module) -> nn.Module:
    """Convert ``model``'s 4-D parameters and buffers to channels-last memory, in place.

    Convolutions whose weight is channels-last run channels-last (NHWC), the layout GPU
    tensor cores prefer, converting a contiguous input on the way; a model that makes its
    4-D input channels-last itself (the built-in ``ImageClassifier`` with ``channels_last``)
    saves that conversion. Results are the same up to rounding. Call it before wrapping the
    model in DDP, so gradient buckets take the parameters' layout.

    Returns:
        ``model``. A model with no 4-D parameter is returned unchanged, with a warning: there
        is nothing channels-last could speed up.
    """
    if not any(p.dim() == 4 for p in model.parameters()):
        logger.warning(
            "MODEL.CHANNELS_LAST is on but %s has no 4-D (convolution) weights, so it changes "
            "nothing; set MODEL.CHANNELS_LAST False.",
            type(model).__name__,
        )
        return model
    return model.to(memory_format=torch.channels_last)
