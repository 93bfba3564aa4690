"""The decoder interface and the registry derived from its subclasses."""
from __future__ import annotations

import numpy as np

from edgeinfer.yamlconf import clip
from edgeinfer.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION, KIND_NONE, KIND_RAW  # noqa: F401 (decoders' kinds)

_REGISTRY: dict[str, type["Decoder"]] = {}


class DecoderError(ValueError):
    """Bad decoder parameters, or outputs that do not fit the decoder."""


class Decoder:
    """Turns model outputs into a float32 payload written straight into a
    preallocated buffer (no allocation per frame where numpy allows)."""

    type: str = ""
    kind: int = KIND_NONE

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.type:
            _REGISTRY[cls.type] = cls

    def __init__(self, params: dict, labels: list[str], input_w: int, input_h: int,
                 output_shapes: list[list[int | None]]):
        self.labels = labels
        self.input_w, self.input_h = input_w, input_h
        self.output = take(params, "output", 0, int)  # which model output to decode
        if not 0 <= self.output < max(len(output_shapes), 1):
            raise DecoderError(f"decoder parameter output: the model has {len(output_shapes)} outputs")
        self.output_shape = output_shapes[self.output] if output_shapes else []
        self._buf = np.zeros(0, np.float32)  # the payload buffer, sized by the subclass

    @property
    def payload_capacity(self) -> int:
        """Bytes of the largest payload this decoder writes."""
        return self._buf.nbytes

    def decode(self, outputs: list[np.ndarray], frame_w: int, frame_h: int) -> tuple[np.ndarray, int]:
        """Returns (payload view to publish, item_count)."""
        raise NotImplementedError


def registered() -> list[str]:
    return sorted(_REGISTRY)


def make_decoder(params: dict, labels: list[str], input_w: int, input_h: int,
                 output_shapes: list[list[int | None]]) -> Decoder:
    params = dict(params)
    kind = params.pop("type")
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise DecoderError(f"unknown decoder type {clip(repr(kind))}; known: {registered()}")
    return cls(params, labels, input_w, input_h, output_shapes)


def take(params: dict, key: str, default, cast):
    """Pops one parameter, converted; names it in the error."""
    if key not in params:
        return default
    try:
        return cast(params.pop(key))
    except (TypeError, ValueError) as e:
        raise DecoderError(f"decoder parameter {key}: {e}") from None


def no_leftovers(cls_type: str, params: dict) -> None:
    if params:
        raise DecoderError(f"decoder {cls_type}: unknown parameters {clip(repr(sorted(params)), 200)}")
