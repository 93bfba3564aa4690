"""Output decoders: ONNX outputs (numpy arrays) → a result payload (docs/abi.md).

Each decoder lives in its own module and registers itself by subclassing
Decoder with a `type` name; `make_decoder` looks the name up. Decoders see
arrays, never ONNX Runtime. Its modules, one job each: docs/architecture.md,
"Module map".
"""
from edgeinfer.models.decoders.base import (Decoder, DecoderError, DecoderParams, OutputInfo, make_decoder,  # noqa: F401
                                     params_union, parse_params, registered)
from edgeinfer.models.decoders import classification, detection, raw  # noqa: F401  (registration)
