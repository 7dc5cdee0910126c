"""trainkit: a config-driven PyTorch training framework in detectron2's style."""

import os as _os

__version__ = "0.1.0"

# OpenMP reads this when torch loads it: idle OpenMP threads then sleep instead of spinning
# after every parallel region, which would steal the cores loader workers need (measured: 8x
# slower training with 2 workers on 2 cores). It takes effect when trainkit is imported
# before torch, and launch() sets it for every process it starts. Set it yourself to override.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
