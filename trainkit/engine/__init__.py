"""Training loops, hooks, launching and default setup."""

from trainkit.engine.defaults import default_argument_parser, default_setup
from trainkit.engine.launch import DEFAULT_TIMEOUT, LaunchError, launch

__all__ = [
    "DEFAULT_TIMEOUT",
    "LaunchError",
    "default_argument_parser",
    "default_setup",
    "launch",
]
