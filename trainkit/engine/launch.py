"""detectron2's ``engine.launch`` module path; the launcher itself is :mod:`trainkit.launcher`."""

from trainkit.launcher import DEFAULT_TIMEOUT, LaunchError, launch

__all__ = ["DEFAULT_TIMEOUT", "LaunchError", "launch"]
