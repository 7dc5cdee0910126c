"""Packaging for trainkit; tool configuration lives in pyproject.toml."""

import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_VERSION = re.search(
    r'__version__ = "([^"]+)"',
    Path(__file__).with_name("trainkit").joinpath("__init__.py").read_text(),
).group(1)

# Optional features: pip install -e ".[wandb]" (or mlflow, plot; several: ".[wandb,mlflow]").
_EXTRAS = {
    # WRITERS "wandb": Weights & Biases (reinit="create_new" needs 0.19.10).
    "wandb": ["wandb>=0.19.10"],
    # WRITERS "mlflow": the full package, with what `mlflow server` needs for a local tracking
    # server (SQLAlchemy, alembic, the web server), not only mlflow-skinny's client.
    "mlflow": ["mlflow>=2.9"],
    # tools/plot_metrics.py
    "plot": ["matplotlib>=3.5"],
}
# The test suite runs the trackers for real (an offline W&B run, a local MLflow server) and
# the plot tool, so it needs every extra; import-linter checks the layering contract in
# pyproject.toml (tests/test_layering.py runs it), which a hand-written AST walk did before
# without seeing cycles or imports hidden in functions. tests/test_api_reference.py builds
# the docs with warnings as errors (docs/conf.py): Sphinx's autodoc and napoleon generate the
# API reference from the Google-style docstrings (7.2 for the `no-index` option conf.py
# uses), and myst-parser reads the Markdown pages (2.0 is the first for Sphinx 7).
_EXTRAS["test"] = [
    "pytest>=7.0",
    "import-linter>=2.0",
    "sphinx>=7.2",
    "myst-parser>=2.0",
    *_EXTRAS["wandb"],
    *_EXTRAS["mlflow"],
    *_EXTRAS["plot"],
]

_CONFIG_SUFFIXES = (".yaml", ".py")


class _BuildPyWithConfigs(build_py):
    """Also copy the repository's configs/ into trainkit/model_zoo/configs of the build.

    ``trainkit.model_zoo.get_config("shapes/cnn_small.yaml")`` then works from a wheel; a
    source checkout reads configs/ in place, so the tree holds one copy of each file.
    """

    def run(self):
        super().run()
        source = Path(__file__).resolve().with_name("configs")
        target = Path(self.build_lib, "trainkit", "model_zoo", "configs")
        for path in source.rglob("*"):
            if path.is_file() and path.suffix in _CONFIG_SUFFIXES:
                destination = target / path.relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, destination)


setup(
    name="trainkit",
    version=_VERSION,
    description="A config-driven PyTorch training framework in detectron2's style",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["trainkit", "trainkit.*"]),
    # torch is a minimum, never a pin: users bring the build that matches their CUDA.
    install_requires=[
        "torch>=2.1",
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "yacs>=0.1.8",
        "tensorboard>=2.10",
        "numpy>=1.21",
        "pyyaml>=5.1",
        "pillow>=9.0",
        "tqdm>=4.29",
        # Pickles lambdas and closures given as mappers for spawned loader workers
        # (trainkit.utils.serialize.PicklableWrapper), as detectron2 does.
        "cloudpickle>=1.3",
        # LazyConfig (trainkit.config.LazyConfig, LazyCall, instantiate) is detectron2's
        # new-style Python config, built on omegaconf as detectron2's is; small and pure
        # Python, and imported only when a LazyConfig is used.
        "omegaconf>=2.1",
    ],
    extras_require=_EXTRAS,
    include_package_data=True,
    # The common LazyConfigs (configs/common/*.py) are data, not modules of the package.
    package_data={"trainkit.model_zoo": ["configs/**/*.py", "configs/**/*.yaml"]},
    cmdclass={"build_py": _BuildPyWithConfigs},
)
