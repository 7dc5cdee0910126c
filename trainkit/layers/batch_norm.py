"""Normalisation layers by name (``get_norm``) and ``FrozenBatchNorm2d``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

import torch
from torch import nn
from torch.nn import functional as F

from trainkit.utils.errors import UsageError

__all__ = ["FrozenBatchNorm2d", "LayerNorm", "get_norm"]


class FrozenBatchNorm2d(nn.Module):
    """A 2-D batch norm whose statistics and affine parameters are fixed buffers.

    It computes what ``nn.BatchNorm2d`` computes in eval mode, in training mode too, and has
    nothing to train: the usual way to keep a pre-trained backbone's normalisation when
    batches are small. A new one is the identity. Checkpoints that carry only ``weight`` and
    ``bias`` (version < 2, as Caffe2-era backbones) load with identity statistics.
    """

    _version = 3

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        """Create the layer for ``num_features`` channels with epsilon ``eps``."""
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        # 1 - eps so that the fresh layer divides by sqrt(var + eps) = 1 exactly.
        self.register_buffer("running_var", torch.ones(num_features) - eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (``(N, C, ...)``) with the stored statistics and affine parameters."""
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
        )

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        version = local_metadata.get("version")
        if version is None or version < 2:
            # Versions before 2 had no running statistics: load them as the identity.
            state_dict.setdefault(prefix + "running_mean", torch.zeros_like(self.running_mean))
            state_dict.setdefault(prefix + "running_var", torch.ones_like(self.running_var))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, eps={self.eps}"

    @classmethod
    def convert_frozen_batchnorm(cls, module: nn.Module) -> nn.Module:
        """Replace every ``BatchNorm2d``/``SyncBatchNorm`` in ``module`` by a frozen copy.

        Args:
            module: a batch norm, or a module that contains some.

        Returns:
            A new ``FrozenBatchNorm2d`` if ``module`` itself is a batch norm; otherwise
            ``module``, with its batch norms replaced in place.
        """
        if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
            frozen = cls(module.num_features, module.eps)
            if module.affine:
                frozen.weight.copy_(module.weight.detach())
                frozen.bias.copy_(module.bias.detach())
            if module.running_mean is not None:
                frozen.running_mean.copy_(module.running_mean)
                frozen.running_var.copy_(module.running_var)
            return frozen
        for name, child in module.named_children():
            converted = cls.convert_frozen_batchnorm(child)
            if converted is not child:
                module.add_module(name, converted)
        return module


class LayerNorm(nn.Module):
    """Layer norm over the channels of each pixel of an ``(N, C, H, W)`` tensor (ConvNeXt's)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6) -> None:
        """Create the layer for ``normalized_shape`` channels with epsilon ``eps``."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.normalized_shape = (normalized_shape,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each pixel's channel vector of ``x``, then scale and shift it."""
        # Channels last for F.layer_norm, which normalises the trailing dimensions.
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, eps=self.eps)
        y = y.permute(0, 3, 1, 2)
        return y * self.weight[:, None, None] + self.bias[:, None, None]


NormSpec = Union[str, Callable[[int], nn.Module], None]

_NORMS: dict[str, Callable[[int], nn.Module]] = {
    "BN": nn.BatchNorm2d,
    "SyncBN": nn.SyncBatchNorm,
    "nnSyncBN": nn.SyncBatchNorm,
    "FrozenBN": FrozenBatchNorm2d,
    "GN": lambda channels: nn.GroupNorm(32, channels),
    "LN": LayerNorm,
}


def get_norm(norm: NormSpec, out_channels: int) -> nn.Module | None:
    """Build the normalisation layer ``norm`` names for ``out_channels`` channels.

    Args:
        norm: ``"BN"``, ``"SyncBN"`` (``nn.SyncBatchNorm``), ``"FrozenBN"``, ``"GN"`` (32
            groups), ``"LN"`` (per-pixel layer norm over channels); ``""`` or ``None`` for
            none; or a callable that takes the channel count and returns the layer.
        out_channels: the number of channels it normalises.

    Returns:
        The layer, or ``None`` for no normalisation.

    Raises:
        UsageError: If ``norm`` is a name not listed above (e.g. MODEL.*.NORM in a config).
    """
    if norm is None or norm == "":
        return None
    if isinstance(norm, str):
        if norm not in _NORMS:
            raise UsageError(
                f"Unknown norm {norm!r}; choose one of {', '.join(_NORMS)}, '' for none, or pass "
                "a callable that builds the layer from the channel count."
            )
        norm = _NORMS[norm]
    return norm(out_channels)
