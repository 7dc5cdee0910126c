"""trainkit: a config-driven PyTorch training framework in detectron2's style."""

__version__ = "0.1.0"
