"""fvcore's ``Registry`` with a lookup error that lists the known names and near misses."""

from __future__ import annotations

import difflib
from typing import Any

from fvcore.common.registry import Registry as _FvcoreRegistry

__all__ = ["Registry"]


class Registry(_FvcoreRegistry):
    """A name -> object map filled by ``@REGISTRY.register()``.

    Unlike fvcore's, an unknown name raises ``KeyError`` whose message lists every
    registered name and the closest matches, so a typo in a config is fixed in one step.
    """

    def get(self, name: str) -> Any:
        if name in self._obj_map:
            return self._obj_map[name]
        known = sorted(self._obj_map)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(
            f"No object named {name!r} in the {self._name} registry.{hint} Registered: "
            f"{', '.join(known) or '(none)'}. Register yours with @{self._name}.register()."
        )

    def __str__(self) -> str:  # KeyError's repr would quote the message
        return f"Registry({self._name}: {', '.join(sorted(self._obj_map))})"
