"""``ConfigError``: the config package's error for a file, override or value a user got wrong."""

from __future__ import annotations

from trainkit.utils.errors import UsageError

__all__ = ["ConfigError"]


class ConfigError(UsageError, ValueError):
    """A config file, override or value that cannot be used; the message says what to change."""
