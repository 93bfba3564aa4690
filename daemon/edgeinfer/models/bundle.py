"""Model bundles: a directory with model.onnx, model.yaml and model.sig.
Every file is opened and its size checked against the limits before any byte
is read; reading then takes every file once into memory from the same open
file; verify.load_verified_bundle checks the signature on those bytes before
anything is parsed, and ONNX Runtime and the YAML parser get exactly the bytes
that were checked."""
from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import os
import stat
from typing import Literal

from pydantic import Field, model_validator

from edgeinfer.models.decoders import params_union
from edgeinfer.models.placement import ResizeMode
from edgeinfer.abi.vocabulary import ModelFormat, channels
from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import ConfigError, load_yaml_model

MODEL_FILE = "model.onnx"
META_FILE = "model.yaml"
SIG_FILE = "model.sig"
MAX_ENTRIES = 256  # a bundle is three files and a few more: each is held open until read


class BundleError(Exception):
    """A bundle that cannot be used; the message names the file and the reason."""


@dataclasses.dataclass(frozen=True)
class SizeLimits:
    """The largest each file of a bundle may be, and all of them together, in bytes
    (edgeinferd.yaml: model.max_model_mib, max_meta_kib, max_file_mib, max_bundle_mib).
    Checked on the opened files before any byte is read: a bundle over them costs no memory."""
    model: int = 1024 << 20   # model.onnx
    meta: int = 1024 << 10    # model.yaml and model.sig, each: parsed whole, a page of text
    other: int = 16 << 20     # each other file (labels, ...)
    bundle: int = 1088 << 20  # all files together: model.onnx's limit and 64 MiB

    def of(self, name: str) -> tuple[int, str]:
        """The limit for file `name`, and how a refusal names it (with its configuration key)."""
        if name == MODEL_FILE:
            return self.model, "model.onnx (model.max_model_mib)"
        if name in (META_FILE, SIG_FILE):
            return self.meta, f"{name} (model.max_meta_kib)"
        return self.other, "each other file of a bundle (model.max_file_mib)"


class InputSpec(StrictModel):
    name: str                                   # the graph input the frames feed
    width: int = Field(ge=1, le=16384)
    height: int = Field(ge=1, le=16384)
    pixel_format: ModelFormat = "rgb24"  # channel order the model expects
    layout: Literal["nchw", "nhwc"] = "nchw"


class PreprocessSpec(StrictModel):
    scale: float = 1.0                                     # applied first: x * scale
    mean: list[float] = Field(default_factory=lambda: [0.0])  # then (x - mean) / std, per channel
    std: list[float] = Field(default_factory=lambda: [1.0])
    # Where the frame lands in the input (placement.py; docs/decoders.md, "Before the model"): stretch (aspect
    # ignored), letterbox (fit, padded with pad_value; 114 is the YOLO family's grey) or crop (the centre, covering).
    resize: ResizeMode = "stretch"
    pad_value: int = Field(114, ge=0, le=255)
    # Resize's sampling on the uint8 frame: linear (bilinear, no antialias: a large downscale aliases), nearest,
    # or area (linear with antialias, the average of the pixels covered: needs the model's opset >= 18).
    interpolation: Literal["linear", "nearest", "area"] = "linear"

    @model_validator(mode="after")
    def _std(self):
        if any(s == 0 for s in self.std):
            raise ValueError("std must not contain 0")
        return self


class QuantizationInfo(StrictModel):
    """What `edgeinferctl model quantize` measured when it wrote this INT8 bundle (signed with the rest of
    model.yaml; informational: the daemon serves the model like any other)."""
    method: Literal["static-int8-qdq"]
    activations: Literal["uint8", "int8"]
    weights: Literal["int8"]
    per_channel: bool
    reduce_range: bool
    calibration: Literal["minmax"]
    calibration_frames: int = Field(ge=1)
    held_out_frames: int = Field(ge=1)
    source_version: str = Field(max_length=16)
    source_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # the FP32 model.onnx it was made from
    onnxruntime: str = Field(max_length=32)
    metric: Literal["top1", "boxes_iou50"]  # classification: top-1; detection: boxes matched at IoU >= 0.5
    agreement: float = Field(ge=0, le=1)
    max_score_delta: float = Field(ge=0)
    min_agreement: float | None = None            # the gate's thresholds it passed
    max_score_delta_allowed: float | None = None


class ModelMeta(StrictModel):
    name: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    # The anti-rollback floor is kept per family (rollback.py): a model renamed in a later
    # version keeps its family, so the rename does not reset the floor. Default: the name.
    family: str | None = Field(None, min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(min_length=1, max_length=16, pattern=r"^[0-9]+(\.[0-9]+)*([.-][A-Za-z0-9]+)?$")
    input: InputSpec
    preprocess: PreprocessSpec = PreprocessSpec()
    decoder: params_union()  # each decoder's own schema (decoders/), chosen by its `type`
    labels: list[str] = Field(default_factory=list)
    quantization: QuantizationInfo | None = None  # an INT8 bundle written by `model quantize`

    @model_validator(mode="after")
    def _channels(self):
        ch = channels(self.input.pixel_format)
        for key in ("mean", "std"):
            n = len(getattr(self.preprocess, key))
            if n not in (1, ch):
                raise ValueError(f"preprocess.{key} has {n} values; the input has {ch} channels")
        return self

    @property
    def floor_family(self) -> str:
        """The key of this model's anti-rollback floor: `family`, by default the name."""
        return self.family or self.name


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

    @functools.cached_property
    def digest(self) -> str:
        """sha256 over every file but the signature (name and content): what the bundle says, so that two bundles
        with one model.onnx but another version or label list differ, and a re-signed one does not."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            if name != SIG_FILE:
                h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()


class OpenBundle:
    """A bundle directory with every entry opened (O_NOFOLLOW) and its size checked,
    nothing read yet. Reading uses the same open files and stops one byte past the
    size that was checked, so a file that grows or is swapped meanwhile cannot get
    more than its checked size in. A context manager: closes what it opened."""

    def __init__(self, path: str, limits: SizeLimits = SizeLimits()):
        self.path, self.limits = path, limits
        self.fds: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self._data: dict[str, bytes] = {}
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # follows a `current` symlink
        except FileNotFoundError:
            raise BundleError(f"{path}: model bundle not found") from None
        except NotADirectoryError:
            raise BundleError(f"{path}: a model bundle is a directory") from None
        except OSError as e:
            raise BundleError(f"{path}: cannot read the bundle: {e.strerror}") from None
        try:
            self._open_entries(dfd)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(dfd)

    def _open_entries(self, dfd: int) -> None:
        # Entries are opened relative to the directory opened once: a flipped symlink cannot mix two bundles.
        names = sorted(os.listdir(dfd))
        if len(names) > MAX_ENTRIES:
            raise BundleError(f"{self.path}: {len(names)} entries; a bundle holds at most {MAX_ENTRIES} files")
        total = 0
        for name in names:
            full = os.path.join(self.path, name)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                reason = "is a symbolic link" if e.errno == errno.ELOOP else e.strerror
                raise BundleError(f"{full}: {reason}; a bundle holds only regular files") from None
            self.fds[name] = fd
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # checked on the fd: a directory or a FIFO opens too
                raise BundleError(f"{full}: not a regular file; a bundle holds only regular files")
            limit, what = self.limits.of(name)
            if st.st_size > limit:
                raise BundleError(f"{full}: {st.st_size} bytes, larger than the {limit}-byte limit for {what}")
            total += st.st_size
            if total > self.limits.bundle:
                raise BundleError(f"{self.path}: more than {self.limits.bundle} bytes in all, the limit for a "
                                  "whole bundle (model.max_bundle_mib)")
            self.sizes[name] = st.st_size
        for required in (MODEL_FILE, META_FILE):
            if required not in self.fds:
                raise BundleError(f"{os.path.join(self.path, required)}: missing from the bundle")

    def read(self, name: str) -> bytes:
        """File `name`, read once, exactly the size checked at open."""
        if name not in self._data:
            size = self.sizes[name]
            with os.fdopen(self.fds[name], "rb", closefd=False) as f:
                data = f.read(size + 1)  # one byte more: a file that grew is seen, never read on
            if len(data) != size:
                raise BundleError(f"{os.path.join(self.path, name)}: changed while being read ({size} bytes when "
                                  f"opened, {len(data)}{'+' if len(data) > size else ''} read)")
            self._data[name] = data
        return self._data[name]

    def read_all(self) -> dict[str, bytes]:
        return {name: self.read(name) for name in self.sizes}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> "OpenBundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_bundle_files(path: str, limits: SizeLimits = SizeLimits()) -> dict[str, bytes]:
    """Every regular file of the bundle directory, read once, after every size was
    checked. Refuses symlinks and subdirectories (nothing outside the directory gets in)."""
    with OpenBundle(path, limits) as opened:
        return opened.read_all()


def parse_bundle(path: str, files: dict[str, bytes]) -> Bundle:
    """Parses bundle files already read (and, for anything that will run, verified:
    see verify.load_verified_bundle, the only loader the daemon uses); their sizes
    were checked before they were read (OpenBundle)."""
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
