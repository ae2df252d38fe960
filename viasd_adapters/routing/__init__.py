"""Intra-model routing: the routing mask z and the slim verifier u it carves out of the target q."""

from .mask import RoutingMask, format_layers
from .shared_prefix import SharedPrefixRunner, UpperLayers
from .slim import FAMILIES, HiddenState, SlimModel, decoding_view

__all__ = [
    "FAMILIES",
    "HiddenState",
    "RoutingMask",
    "SharedPrefixRunner",
    "SlimModel",
    "UpperLayers",
    "decoding_view",
    "format_layers",
]
