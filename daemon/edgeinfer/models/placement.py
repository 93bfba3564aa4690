"""Where a camera frame lands in the model's input (model.yaml `preprocess.resize`).

- stretch: the whole frame resized to the input, aspect ratio ignored (16:9 into 4:3 squashes).
- letterbox: the whole frame resized to fit, aspect kept, centred; the rest padded with `pad_value`.
- crop: the centre of the frame with the input's aspect ratio, resized to the input; the edges
  are not seen.

One Placement per (frame size, input size, mode), computed in integers once: fusion.py builds
the graph from it (Slice → Resize → Pad on the uint8 frame) and the detection decoder maps
boxes back to frame pixels with the same numbers, so the two cannot disagree.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal, get_args

ResizeMode = Literal["stretch", "letterbox", "crop"]  # model.yaml preprocess.resize
RESIZE_MODES: tuple[str, ...] = get_args(ResizeMode)


@dataclasses.dataclass(frozen=True)
class Placement:
    crop_x: int    # the frame region used: its left column
    crop_y: int    # … its top row
    crop_w: int    # … its width (the frame's, unless cropped)
    crop_h: int    # … its height
    resize_w: int  # the region's size after Resize
    resize_h: int
    pad_x: int     # where the resized region's left column sits in the input (letterbox)
    pad_y: int
    in_w: int      # the model input's size
    in_h: int

    @property
    def pads(self) -> tuple[int, int, int, int]:
        """Padding (top, left, bottom, right) around the resized region."""
        return (self.pad_y, self.pad_x, self.in_h - self.resize_h - self.pad_y, self.in_w - self.resize_w - self.pad_x)

    def to_frame_x(self, x):
        """Input x (pixels, corner convention) → frame x. Works on numpy arrays."""
        return self.crop_x + (x - self.pad_x) * (self.crop_w / self.resize_w)

    def to_frame_y(self, y):
        return self.crop_y + (y - self.pad_y) * (self.crop_h / self.resize_h)


@functools.lru_cache(maxsize=64)
def placement(mode: str, frame_w: int, frame_h: int, in_w: int, in_h: int) -> Placement:
    if mode == "stretch":
        return Placement(0, 0, frame_w, frame_h, in_w, in_h, 0, 0, in_w, in_h)
    if mode == "letterbox":
        # Fit: the side that limits decides the scale; the other is rounded, at least 1 pixel.
        if frame_w * in_h >= frame_h * in_w:
            rw, rh = in_w, max(1, min(in_h, round(frame_h * in_w / frame_w)))
        else:
            rw, rh = max(1, min(in_w, round(frame_w * in_h / frame_h))), in_h
        return Placement(0, 0, frame_w, frame_h, rw, rh, (in_w - rw) // 2, (in_h - rh) // 2, in_w, in_h)
    if mode == "crop":
        # Cover: the largest centred region of the frame with the input's aspect ratio.
        if frame_w * in_h >= frame_h * in_w:
            cw, ch = max(1, min(frame_w, round(frame_h * in_w / in_h))), frame_h
        else:
            cw, ch = frame_w, max(1, min(frame_h, round(frame_w * in_h / in_w)))
        return Placement((frame_w - cw) // 2, (frame_h - ch) // 2, cw, ch, in_w, in_h, 0, 0, in_w, in_h)
    raise ValueError(f"resize mode {mode!r}: one of {RESIZE_MODES}")
