"""Lowest layer: distributed helpers, logging, files, RNG, events and small shared tools."""

from trainkit.utils.errors import UsageError

__all__ = ["UsageError"]
