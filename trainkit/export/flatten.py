"""detectron2's flattening of structured inputs and outputs for tracing: placeholders."""

from trainkit.export import TracingAdapter, _not_shipped

__all__ = ["TracingAdapter", "flatten_to_tuple"]

_PLACEHOLDER_MODULE = True

flatten_to_tuple = _not_shipped("flatten_to_tuple", __name__)
