"""The train loader's saved position: what the engine may ask of it without reading its format."""

from __future__ import annotations

from typing import Any

__all__ = ["is_global_position"]


def is_global_position(state: dict[str, Any] | None) -> bool:
    """Return whether a saved loader state is a position in the global stream.

    Such a position (batches composed from the global stream by a trainkit training sampler)
    is the same on every rank and can be continued by a job of any world size; a per-rank
    or stream-dataset position cannot.
    """
    return isinstance(state, dict) and state.get("kind") == "global"
