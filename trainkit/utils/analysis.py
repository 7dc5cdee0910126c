"""Counting a model's FLOPs, activations and parameters on fvcore (detectron2's ``utils.analysis``).

A trainkit model takes one argument, a batch (a list of dicts of tensors, or whatever its
``forward`` accepts), so these functions take that batch where fvcore takes a tuple of
positional inputs. Counting traces the model with ``torch.jit`` on that batch, so the
figures are for that batch: with input-dependent work (sizes, early exits) count a few
typical ones. fvcore counts matrix products, convolutions, normalisations, upsampling and
pooling to a size; the cheap element-wise operators listed in ``_ZERO_COST_OPERATORS`` are
counted as zero without the "unsupported operator" warning fvcore would log for each.

This module imports fvcore's analysis code when it is imported, so nothing in trainkit
imports it: import it where you count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from fvcore.nn import ActivationCountAnalysis, parameter_count, parameter_count_table
from fvcore.nn import FlopCountAnalysis as _FvcoreFlopCountAnalysis
from torch import nn

__all__ = [
    "FlopCountAnalysis",
    "activation_count_operators",
    "find_unused_parameters",
    "flop_count_operators",
    "parameter_count",
    "parameter_count_table",
]

_ZERO_COST_OPERATORS = tuple(
    f"aten::{name}"
    for name in (
        "add add_ sub rsub mul mul_ div div_ neg relu relu_ gelu silu sigmoid tanh softmax "
        "log_softmax exp sqrt rsqrt clamp clamp_min mean sum max_pool2d dropout"
    ).split()
)


def _bare(model: nn.Module) -> nn.Module:
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


class FlopCountAnalysis(_FvcoreFlopCountAnalysis):
    """fvcore's ``FlopCountAnalysis`` of ``model`` run on one batch.

    ``total()``, ``by_operator()``, ``by_module()`` and fvcore's ``flop_count_table(self)``
    work as in fvcore; counts are in FLOPs (one multiply-add counts as one, fvcore's
    convention). The model runs in the mode it is in: call ``model.eval()`` first to count
    inference.

    Args:
        model: the model; a ``DistributedDataParallel`` or ``DataParallel`` wrapper is
            looked through.
        inputs: the batch, as ``model(inputs)`` takes it.
    """

    def __init__(self, model: nn.Module, inputs: Any) -> None:
        super().__init__(_bare(model), (inputs,))
        self.set_op_handle(**dict.fromkeys(_ZERO_COST_OPERATORS))


def flop_count_operators(model: nn.Module, inputs: Any) -> dict[str, float]:
    """Return the GFLOPs of each operator type (``"conv"``, ``"linear"``, ...) for one batch.

    The model is counted in eval mode and without gradients; its mode is restored after.

    Args:
        model: the model (a DDP wrapper is looked through).
        inputs: the batch, as ``model(inputs)`` takes it.
    """
    with _mode(model, training=False), torch.no_grad():
        counts = FlopCountAnalysis(model, inputs).by_operator()
    return {op: flops / 1e9 for op, flops in counts.items()}


def activation_count_operators(model: nn.Module, inputs: Any) -> dict[str, float]:
    """Return the millions of activations (output elements) of each operator type for one batch.

    Counted like :func:`flop_count_operators`: eval mode, no gradients, mode restored.
    """
    with _mode(model, training=False), torch.no_grad():
        analysis = ActivationCountAnalysis(_bare(model), (inputs,))
        counts = analysis.set_op_handle(**dict.fromkeys(_ZERO_COST_OPERATORS)).by_operator()
    return {op: count / 1e6 for op, count in counts.items()}


def find_unused_parameters(model: nn.Module, inputs: Any) -> list[str]:
    """Return the names of trainable parameters that get no gradient from a training step.

    Runs one training forward on ``inputs`` and differentiates the summed losses (a dict of
    losses, or one loss tensor) with respect to every parameter that requires a gradient.
    Parameters that do not take part are what makes ``DistributedDataParallel`` need
    ``find_unused_parameters=True``. Nothing is left behind: no ``.grad`` is written, and
    the buffers (batch-norm running statistics) and the model's mode are restored.

    Args:
        model: the model (a DDP wrapper is looked through).
        inputs: a training batch, as ``model(inputs)`` takes it.
    """
    model = _bare(model)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    saved_buffers = [buffer.detach().clone() for buffer in model.buffers()]
    try:
        with _mode(model, training=True):
            losses = model(inputs)
            total = sum(losses.values()) if isinstance(losses, Mapping) else losses
            grads = torch.autograd.grad(total, [p for _, p in named], allow_unused=True)
    finally:
        # After the backward pass: batch norm's backward checks its buffers are unchanged.
        with torch.no_grad():
            for buffer, saved in zip(model.buffers(), saved_buffers):
                buffer.copy_(saved)
    return [name for (name, _), grad in zip(named, grads) if grad is None]


@contextlib.contextmanager
def _mode(model: nn.Module, training: bool) -> Iterator[None]:
    was_training = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was_training)
