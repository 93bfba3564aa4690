"""Model bundles: a directory with model.onnx, model.yaml and model.sig.
Reading takes every file once into memory; signing.load_verified_bundle checks
the signature on those bytes before anything is parsed, and ONNX Runtime and
the YAML parser get exactly the bytes that were checked."""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgeinfer.vocabulary import ModelFormat, channels
from edgeinfer.yamlconf import ConfigError, load_yaml_model

MODEL_FILE = "model.onnx"
META_FILE = "model.yaml"
MAX_BUNDLE_BYTES = 2 << 30  # refuse absurd bundles before reading them
MAX_META_BYTES = 1 << 20    # model.yaml is a page of settings: more is refused before the YAML parser sees it


class BundleError(Exception):
    """A bundle that cannot be used; the message names the file and the reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    name: str                                   # the graph input the frames feed
    width: int = Field(ge=1, le=16384)
    height: int = Field(ge=1, le=16384)
    pixel_format: ModelFormat = "rgb24"  # channel order the model expects
    layout: Literal["nchw", "nhwc"] = "nchw"


class PreprocessSpec(_Strict):
    scale: float = 1.0                                     # applied first: x * scale
    mean: list[float] = Field(default_factory=lambda: [0.0])  # then (x - mean) / std, per channel
    std: list[float] = Field(default_factory=lambda: [1.0])
    resize: Literal["stretch"] = "stretch"

    @model_validator(mode="after")
    def _std(self):
        if any(s == 0 for s in self.std):
            raise ValueError("std must not contain 0")
        return self


class DecoderSpec(_Strict):
    model_config = ConfigDict(extra="allow", frozen=True)  # parameters belong to the decoder type
    type: str


class ModelMeta(_Strict):
    name: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(min_length=1, max_length=16, pattern=r"^[0-9]+(\.[0-9]+)*([.-][A-Za-z0-9]+)?$")
    input: InputSpec
    preprocess: PreprocessSpec = PreprocessSpec()
    decoder: DecoderSpec
    labels: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _channels(self):
        ch = channels(self.input.pixel_format)
        for key in ("mean", "std"):
            n = len(getattr(self.preprocess, key))
            if n not in (1, ch):
                raise ValueError(f"preprocess.{key} has {n} values; the input has {ch} channels")
        return self


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A loaded bundle: parsed metadata plus the exact bytes of every file."""

    path: str
    meta: ModelMeta
    model_bytes: bytes
    files: dict[str, bytes]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model_bytes).hexdigest()


def read_bundle_files(path: str) -> dict[str, bytes]:
    """Every regular file of the bundle directory, read once. Refuses symlinks
    and subdirectories (nothing outside the directory gets in)."""
    try:
        entries = sorted(os.listdir(path))
    except FileNotFoundError:
        raise BundleError(f"{path}: model bundle not found") from None
    except NotADirectoryError:
        raise BundleError(f"{path}: a model bundle is a directory") from None
    except OSError as e:
        raise BundleError(f"{path}: cannot read the bundle: {e.strerror}") from None
    files: dict[str, bytes] = {}
    total = 0
    for name in entries:
        full = os.path.join(path, name)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            reason = "is a symbolic link" if e.errno == 40 else e.strerror
            raise BundleError(f"{full}: {reason}; a bundle holds only regular files") from None
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000):  # checked on the fd: a directory opens too
            os.close(fd)
            raise BundleError(f"{full}: not a regular file; a bundle holds only regular files")
        with os.fdopen(fd, "rb") as f:
            total += st.st_size
            if total > MAX_BUNDLE_BYTES:
                raise BundleError(f"{path}: larger than {MAX_BUNDLE_BYTES} bytes")
            files[name] = f.read()
    for required in (MODEL_FILE, META_FILE):
        if required not in files:
            raise BundleError(f"{os.path.join(path, required)}: missing from the bundle")
    return files


def parse_bundle(path: str, files: dict[str, bytes]) -> Bundle:
    """Parses bundle files already read (and, for anything that will run, verified:
    see signing.load_verified_bundle, the only loader the daemon uses)."""
    if len(files[META_FILE]) > MAX_META_BYTES:
        raise BundleError(f"{os.path.join(path, META_FILE)}: {len(files[META_FILE])} bytes, larger than the "
                          f"{MAX_META_BYTES}-byte limit for model.yaml")
    try:
        meta = load_yaml_model(ModelMeta, files[META_FILE].decode("utf-8"), os.path.join(path, META_FILE))
    except UnicodeDecodeError:
        raise BundleError(f"{os.path.join(path, META_FILE)}: not UTF-8 text") from None
    except ConfigError as e:
        raise BundleError(str(e)) from None
    return Bundle(path=path, meta=meta, model_bytes=files[MODEL_FILE], files=files)


def load_unverified_bundle(path: str) -> Bundle:
    """Reads and parses a bundle WITHOUT checking its signature: for tools that
    write or inspect bundles (edgeinferctl model bundle), never for serving."""
    return parse_bundle(path, read_bundle_files(path))
