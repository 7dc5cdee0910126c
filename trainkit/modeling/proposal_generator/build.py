"""detectron2's registry of proposal generators: detection-only placeholders."""

from trainkit.modeling import PROPOSAL_GENERATOR_REGISTRY, build_proposal_generator

__all__ = ["PROPOSAL_GENERATOR_REGISTRY", "build_proposal_generator"]

_PLACEHOLDER_MODULE = True
