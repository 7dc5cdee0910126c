"""Lowest layer: distributed helpers, logging, files, RNG, events and small shared tools."""
