"""The ``CompileMetrics`` hook: compiled graphs, recompiles and graph breaks in the metrics."""

from __future__ import annotations

import logging

from typing_extensions import override

from trainkit.engine.hook_base import HookBase, is_time
from trainkit.modeling.compile import compile_stats, recompile_limit

__all__ = ["CompileMetrics"]

logger = logging.getLogger(__name__)


class CompileMetrics(HookBase):
    """Write ``compile/graphs``, ``compile/recompiles`` and ``compile/graph_breaks``.

    Every ``period`` iterations and at the last one (the writer period: reading Dynamo's
    counts is host-side work, not a device wait). A compiled method holding
    ``torch._dynamo.config.recompile_limit`` graphs is warned about once, loudly: Dynamo
    runs a new shape of it eager from then on. Does nothing for a model not compiled.
    """

    def __init__(self, period: int) -> None:
        """Record every ``period`` iterations and at the last one."""
        self._period = period
        self._warned: set[str] = set()

    @override
    def after_step(self) -> None:
        trainer = self.trainer
        if not is_time(trainer, self._period):
            return
        stats = compile_stats(trainer.model)  # type: ignore[attr-defined]
        if stats is None:
            return
        storage = trainer.storage
        storage.put_scalar("compile/graphs", stats.graphs, smoothing_hint=False)
        storage.put_scalar("compile/recompiles", stats.recompiles, smoothing_hint=False)
        storage.put_scalar("compile/graph_breaks", stats.graph_breaks, smoothing_hint=False)
        for name in stats.at_limit:
            if name not in self._warned:
                self._warned.add(name)
                logger.warning(
                    "compile: %s holds torch._dynamo.config.recompile_limit=%d graphs, so new "
                    "batch shapes run it EAGER (slow) from now on. Bound the shapes "
                    "(INPUT.MAX_SIZE_*, DATALOADER.ASPECT_RATIO_BINS; see docs/device.md) or "
                    "raise torch._dynamo.config.recompile_limit before training.",
                    name,
                    recompile_limit(),
                )
