"""Sphinx configuration: the Markdown pages (myst-parser) and the API reference (autodoc).

The source directory is the repository root, so that README.md, docs/*.md and
datasets/README.md link each other with the same relative paths as on GitHub; this directory
holds the configuration (``-c docs``), the index and the API reference pages (``docs/api/``).
Build, with warnings as errors as ``tests/test_api_reference.py`` does::

    python -m sphinx -W --keep-going -b html -c docs . /tmp/trainkit-docs
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document this checkout's trainkit, not an installed one

import trainkit  # noqa: E402

project = "trainkit"
release = version = trainkit.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "docs/index"
include_patterns = ["README.md", "datasets/README.md", "docs/**"]
# Sphinx walks the source directory for files; these are left out without being walked.
exclude_patterns = [".*", "build", "dist", "output", "datasets/shapes", "tests", "trainkit"]

# Google-style docstrings (STYLE.md, principle 14); no NumPy style in the tree.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# An "Attributes:" section becomes a field list, not one object per attribute: a dataclass's
# fields are objects already (undoc-members below), and would be described twice.
napoleon_use_ivar = True
# STYLE.md's own sections: prose, rendered under their heading.
napoleon_custom_sections = ["Collective", "Rank"]

# Each package page documents exactly the names in its __all__ (automodule's :members: follows
# __all__ when a module has one), members in the order of the source, with or without a
# docstring (the values among them: _data_entries below).
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
# A class's constructor arguments are documented in its __init__ (STYLE.md ignores D107 but
# the tree writes them): show both docstrings.
autoclass_content = "both"
# Types live in the annotations, not in the docstrings (STYLE.md, principle 14): show them
# in the signature.
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# The Markdown pages link each other as GitHub does: `page.md#heading-slug`.
myst_heading_anchors = 6

# A name several packages export (UsageError, the hooks) is described once per package, so a
# cross-reference to it without its package ("UsageError" in a Raises section) finds several
# targets, all right. The warning for that is the only one of category ref.python.
suppress_warnings = ["ref.python"]

html_theme = "alabaster"
html_title = f"trainkit {version}"


# trainkit re-exports a few names of these packages at detectron2's paths (trainkit.layers'
# ConvTranspose2d and interpolate, trainkit.data.transforms' fvcore transforms,
# trainkit.solver's LRScheduler).
FOREIGN = ("torch", "fvcore", "iopath")


def _foreign(obj: object) -> str | None:
    """Return the defining module of a name trainkit re-exports from a FOREIGN package."""
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module.split(".")[0] in FOREIGN:
        return module
    return None


def _point_to_the_source(app, what, name, obj, options, lines):
    """Replace a re-exported torch or fvcore name's docstring by where it comes from.

    Their docstrings are written for their own documentation (labels such as torch's
    ``tf32_on_ampere``) and are not trainkit's to fix.
    """
    module = _foreign(obj)
    if module is not None and what in {"class", "exception", "function"}:
        lines[:] = [f"``{module}.{obj.__qualname__}``, re-exported as detectron2 does."]


def _skip_foreign_members(app, what, name, obj, skip, options):
    """Leave out the members of a re-exported foreign class (documented at their source)."""
    if what in {"class", "exception"} and _foreign(obj) is not None:
        return True
    return None


def _data_entries(module_name: str, module: object) -> list[str]:
    """Return directives for the data names of ``module.__all__`` that autodoc leaves out.

    autodoc documents a module-level value only when the module's source gives it a docstring
    (``PathManager`` has one), so the catalogs, the registries and ``DEFAULT_TIMEOUT``, and
    every re-export of them, would be missing. Each gets a ``py:data`` entry: a plain value
    with its value, an object with its type, and an object of a private class (the catalogs)
    with that class's methods, which are its API.
    """
    from sphinx.errors import PycodeError
    from sphinx.pycode import ModuleAnalyzer

    try:
        attr_docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
    except PycodeError:
        attr_docs = {}
    lines = []
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        if any(test(value) for test in (inspect.isclass, inspect.isroutine, inspect.ismodule)):
            continue
        if ("", name) in attr_docs:
            continue
        kind = type(value)
        lines += ["", f".. py:data:: {name}"]
        if kind.__module__ in {"builtins", "datetime"}:
            lines.append(f"   :value: {value!r}")
            continue
        lines.append(f"   :type: {kind.__module__}.{kind.__qualname__}")
        if kind.__qualname__.startswith("_") and kind.__module__.split(".")[0] == "trainkit":
            lines += ["", f"   An instance of ``{kind.__qualname__}``:", ""]
            lines += [f"   .. autoclass:: {kind.__module__}.{kind.__qualname__}"]
            lines += ["      :members:", "      :inherited-members:", "      :no-index:"]
    return lines


def _add_data_entries(app, what, name, obj, options, lines):
    if what == "module":
        lines.extend(_data_entries(name, obj))


def setup(app):
    from sphinx.domains.python import PyClasslike

    # A class re-exported by several packages (the hooks by trainkit.engine and
    # trainkit.engine.hooks, as in detectron2) is described under each package's name, and
    # autodoc marks each copy with the name in its defining module (`:canonical:`): two copies
    # of that one name are a "duplicate object description" warning. The package names are
    # the public ones; the defining module's is dropped.
    class ClassWithoutCanonical(PyClasslike):
        def run(self):
            self.options.pop("canonical", None)
            return super().run()

    for kind in ("class", "exception"):
        app.add_directive_to_domain("py", kind, ClassWithoutCanonical, override=True)
    app.connect("autodoc-process-docstring", _point_to_the_source)
    app.connect("autodoc-skip-member", _skip_foreign_members)
    app.connect("autodoc-process-docstring", _add_data_entries)
