"""Compiling a model's tensor-in, tensor-out part with ``torch.compile`` (the compile seam).

**The seam.** A model names the methods to compile in a class attribute
``compiled_methods`` (e.g. ``("train_network", "eval_network")``). Each such method takes
and returns tensors (or tuples/dicts of tensors) of fixed shapes, and does not read Python
data out of tensors; turning a list of dicts into tensors stays in the eager ``forward``,
which calls the method through :func:`call_compiled`::

    class MyModel(nn.Module):
        compiled_methods = ("network",)

        def forward(self, batched_inputs):
            images = self.preprocess(batched_inputs)           # eager: lists, dicts, padding
            return call_compiled(self, "network", images)     # compiled when compile_model ran

        def network(self, images: Tensor) -> Tensor: ...

:func:`compile_model` compiles each method as a plain function of ``(module, *tensors)`` and
keeps it in the instance's ``__dict__``: the module itself is not wrapped, so its
``state_dict`` names carry no ``_orig_mod.`` (checkpoints load both ways between compiled and
eager runs), ``DistributedDataParallel`` wraps it as before, and a ``copy.deepcopy`` of it
(the EMA model) runs the same compiled function on its own weights. A separate method per
mode (training, evaluation) gives each mode its own graph budget: Dynamo counts
``recompile_limit`` per function.

Graph counts come from :func:`compile_stats`; ``trainkit.engine.hooks.CompileMetrics``
writes them to the metrics.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from trainkit.config import CfgNode, ConfigError
from trainkit.utils.torch_private import (
    dynamo_cache_entries,
    dynamo_graph_breaks,
    dynamo_recompile_limit,
)

__all__ = [
    "CompileStats",
    "call_compiled",
    "compile_from_config",
    "compile_model",
    "compile_stats",
    "recompile_limit",
    "set_compile_cache_dir",
]

logger = logging.getLogger(__name__)

# Instance attribute holding {method name: compiled function} (see the module docstring).
_COMPILED = "_trainkit_compiled"
# Compile modes torch.compile accepts ("" is its default).
_MODES = ("", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def call_compiled(module: nn.Module, name: str, *args: Any) -> Any:
    """Call ``module.<name>(*args)``: compiled if :func:`compile_model` compiled it, else eager.

    Args:
        module: the model (not a DDP wrapper: the model's own ``forward`` calls this).
        name: one of ``module.compiled_methods``.
        args: the method's tensor arguments.

    Returns:
        What the method returns.
    """
    compiled = module.__dict__.get(_COMPILED, {}).get(name)
    return getattr(module, name)(*args) if compiled is None else compiled(module, *args)


def recompile_limit() -> int:
    """Return Dynamo's limit of graphs per compiled function.

    A private setting of torch, read through :mod:`trainkit.utils.torch_private` with every
    other name torch does not promise to keep.
    """
    return dynamo_recompile_limit()


def set_compile_cache_dir(cache_dir: str) -> str:
    """Point the inductor's on-disk cache at ``cache_dir``, unless the user already set one.

    The inductor reads its cache location only from the environment variable
    ``TORCHINDUCTOR_CACHE_DIR`` (it holds the compiled kernels and the FX and AOTAutograd
    graph caches), so that is where a run in ``OUTPUT_DIR`` sets it: a restarted or resumed
    run then finds its compiled graphs again. Call it before the first compiled step.

    Returns:
        The cache directory in use.
    """
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and os.path.abspath(current) != os.path.abspath(cache_dir):
        logger.info("compile: TORCHINDUCTOR_CACHE_DIR=%s is set; not using %s", current, cache_dir)
        return current
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    return cache_dir


def compile_model(
    model: nn.Module,
    *,
    mode: str = "",
    backend: str = "inductor",
    cache_dir: str | None = None,
) -> list[str]:
    """Compile the methods ``model.compiled_methods`` names, in place (see the module doc).

    Args:
        model: the model, on its device, not yet wrapped in DDP.
        mode: ``torch.compile``'s mode; ``""`` for its default. Only with ``"inductor"``.
        backend: ``torch.compile``'s backend (``"inductor"``; ``"aot_eager"`` and ``"eager"``
            check the tracing without generating code).
        cache_dir: where the inductor keeps its cache (:func:`set_compile_cache_dir`).

    Returns:
        The names of the compiled methods.

    Raises:
        ConfigError: If the model names no method to compile, or ``mode`` is not one of
            torch.compile's modes.
    """
    import torch

    names = list(getattr(model, "compiled_methods", ()) or ())
    if not names:
        raise ConfigError(
            f"MODEL.COMPILE.ENABLED but {type(model).__name__} names no method to compile; "
            "give it a compiled_methods attribute (trainkit.modeling.compile) or turn it off."
        )
    if mode not in _MODES:
        raise ConfigError(
            f"MODEL.COMPILE.MODE must be one of {', '.join(map(repr, _MODES))}, got {mode!r}"
        )
    if mode and backend != "inductor":
        raise ConfigError(
            f"MODEL.COMPILE.MODE {mode!r} needs MODEL.COMPILE.BACKEND 'inductor', got {backend!r}"
        )
    if cache_dir:
        set_compile_cache_dir(cache_dir)
    compiled = {}
    for name in names:
        function = getattr(type(model), name, None)
        if not callable(function):
            raise ConfigError(
                f"{type(model).__name__}.compiled_methods names {name!r}, which is not a method"
            )
        # dynamic=False: one graph per planned shape (ShapePlan), no symbolic sizes.
        compiled[name] = torch.compile(function, mode=mode or None, backend=backend, dynamic=False)
    model.__dict__[_COMPILED] = compiled
    return names


@dataclass(frozen=True)
class CompileStats:
    """Counts of one process's compiled graphs.

    Attributes:
        graphs: graphs held for the compiled methods (one per shape and mode seen).
        recompiles: compiles of a method that already had a graph (``graphs - methods seen``).
        graph_breaks: graph breaks Dynamo reported in this process.
        at_limit: methods holding ``recompile_limit`` graphs: a new shape runs them eager.
    """

    graphs: int
    recompiles: int
    graph_breaks: int
    at_limit: tuple[str, ...]


def compile_stats(model: nn.Module) -> CompileStats | None:
    """Return the graph counts of ``model``'s compiled methods; None if it is not compiled.

    Reads Dynamo's per-function cache and its graph-break counter
    (:mod:`trainkit.utils.torch_private`); if a torch version lacks them this raises rather
    than report zeros.
    """
    model = getattr(model, "module", model)  # a DDP wrapper: its model
    compiled = model.__dict__.get(_COMPILED)
    if not compiled:
        return None
    limit = recompile_limit()
    graphs = recompiles = 0
    at_limit = []
    for name in compiled:
        entries = dynamo_cache_entries(getattr(type(model), name))
        graphs += entries
        recompiles += max(entries - 1, 0)
        if entries >= limit:
            at_limit.append(name)
    return CompileStats(graphs, recompiles, dynamo_graph_breaks(), tuple(at_limit))


def compile_from_config(model: nn.Module, cfg: CfgNode) -> Sequence[str]:
    """Compile ``model`` as ``cfg.MODEL.COMPILE`` says (the cache in ``OUTPUT_DIR``)."""
    opts = cfg.MODEL.COMPILE
    cache_dir = opts.CACHE_DIR or os.path.join(cfg.OUTPUT_DIR, "compile_cache")
    names = compile_model(model, mode=opts.MODE, backend=opts.BACKEND, cache_dir=cache_dir)
    plans = getattr(model, "shape_plans", None)
    if plans is not None:
        train, test = (p.num_shapes if p is not None else "unbounded" for p in plans)
        planned = f"at most {train} graphs for training, {test} for evaluation"
    else:
        planned = "graph count not planned by the model"
    logger.info(
        "compile: %s of %s; %s (torch._dynamo.config.recompile_limit=%d per method)",
        ", ".join(names),
        type(model).__name__,
        planned,
        recompile_limit(),
    )
    return names
