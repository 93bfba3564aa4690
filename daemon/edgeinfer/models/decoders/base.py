"""The decoder interface, its parameter schema, and the registry derived from its subclasses.

Each decoder declares its parameters as a pydantic model (`Params`, tagged by `type`):
model.yaml's `decoder:` section is validated by it as part of the bundle's own schema,
so a bad parameter is reported with its YAML line like every other key
(bundle.ModelMeta). What a schema cannot know, because it needs the graph (an output
index past the last output, labels against classes, strides against the input), the
decoder checks when it is built against the model's outputs.
"""
from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
from pydantic import Field, ValidationError

from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION, KIND_NONE, KIND_RAW, KIND_TENSORS  # noqa: F401
from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import clip

_REGISTRY: dict[str, type["Decoder"]] = {}


class DecoderError(ValueError):
    """Bad decoder parameters, or outputs that do not fit the decoder."""


class DecoderParams(StrictModel):
    """Parameters every decoder takes. Subclasses add theirs and narrow `type` to their name."""
    type: str
    # The model output decoded: its index among the graph's outputs, or its name.
    output: Union[int, str] = Field(0, description="output index (0-based) or name")


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """One graph output as the decoders see it: dims resolved by the warm-up probe where the graph leaves them
    open (ModelRuntime), else None."""

    name: str
    dtype: np.dtype
    shape: tuple
    data_dependent: bool = False  # dims the graph leaves open even for a fixed input: this shape is one frame's

    @property
    def values(self) -> int | None:
        """Elements of the output for one frame, if every dim is known (a leading batch dim counts as 1)."""
        dims = self.shape[1:] if self.shape and self.shape[0] in (None, 1) else self.shape
        return int(np.prod(dims)) if all(d is not None for d in dims) else None


class Decoder:
    """Turns model outputs into a payload written straight into a preallocated buffer (no allocation
    per frame where numpy allows)."""

    type: str = ""
    kind: int = KIND_NONE
    Params: type[DecoderParams] = DecoderParams

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.type:
            _REGISTRY[cls.type] = cls

    def __init__(self, params: DecoderParams, labels: list[str], input_w: int, input_h: int,
                 outputs: list[OutputInfo], resize: str = "stretch"):
        self.params = params
        self.resize = resize  # model.yaml's preprocess.resize: how input pixels map back to the frame's
        self.labels = labels
        self.input_w, self.input_h = input_w, input_h
        self.outputs = outputs
        self.output = self.output_index(params.output)
        self.output_shape = list(outputs[self.output].shape) if outputs else []
        self._buf = np.zeros(0, np.float32)  # the payload buffer, sized by the subclass

    def output_index(self, ref: int | str) -> int:
        """The index of output `ref` (an index or a name); DecoderError naming the outputs if there is none."""
        names = [o.name for o in self.outputs]
        if isinstance(ref, str):
            if ref not in names:
                raise DecoderError(f"decoder parameter output: no output named {clip(repr(ref))} (outputs: "
                                   f"{clip(repr(names), 400)})")
            return names.index(ref)
        if not 0 <= ref < max(len(names), 1):
            raise DecoderError(f"decoder parameter output: {ref} is not an output index; the model has "
                               f"{len(names)} outputs {names}")
        return ref

    @property
    def payload_capacity(self) -> int:
        """Bytes of the largest payload this decoder writes."""
        return self._buf.nbytes

    def decode(self, outputs: list[np.ndarray], frame_w: int, frame_h: int) -> tuple[np.ndarray, int]:
        """Returns (payload view to publish, item_count). Raises DecoderError when the outputs do not fit
        the payload (never truncates)."""
        raise NotImplementedError


def registered() -> list[str]:
    return sorted(_REGISTRY)


def params_union():
    """The tagged union of every registered decoder's Params: model.yaml's `decoder:` schema."""
    from typing import Annotated
    types = tuple(_REGISTRY[t].Params for t in registered())
    return Annotated[Union[types], Field(discriminator="type")]


def parse_params(params: dict | DecoderParams) -> DecoderParams:
    """A dict (tests, tools) validated by its decoder's schema; a Params object as it is."""
    if isinstance(params, DecoderParams):
        return params
    kind = params.get("type")
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise DecoderError(f"unknown decoder type {clip(repr(kind))}; known: {registered()}")
    try:
        return cls.Params.model_validate(params)
    except ValidationError as e:
        raise DecoderError("; ".join(f"decoder parameter {clip('.'.join(map(str, err['loc'])))}: "
                                     f"{'unknown parameter' if err['type'] == 'extra_forbidden' else err['msg']}"
                                     for err in e.errors())) from None


def make_decoder(params: dict | DecoderParams, labels: list[str], input_w: int, input_h: int,
                 outputs: list, resize: str = "stretch") -> Decoder:
    """`outputs`: OutputInfo per graph output (or, for tests, bare shapes: float32 outputs named out0, out1…)."""
    p = parse_params(params)
    infos = [o if isinstance(o, OutputInfo) else OutputInfo(f"out{i}", np.dtype(np.float32), tuple(o))
             for i, o in enumerate(outputs)]
    return _REGISTRY[p.type](p, labels, input_w, input_h, infos, resize)
