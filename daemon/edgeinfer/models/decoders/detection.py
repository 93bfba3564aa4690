"""Object detection: YOLOX-style grid decode + class-aware NMS, vectorised.

Output [1, A, 5 + C] with rows (cx, cy, w, h, objectness, class scores...) in
grid units over strides 8/16/32 (decode_grid: true) or already in input
pixels (decode_grid: false). Boxes are returned in frame pixels, mapped back
through the same placement (stretch, letterbox, crop) that put the frame in
the input.
Payload: item_count rows of (x1, y1, x2, y2, score, class) float32.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from edgeinfer.models.decoders.base import KIND_DETECTION, Decoder, DecoderError, DecoderParams
from edgeinfer.models.placement import placement


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, limit: int) -> np.ndarray:
    """Greedy non-maximum suppression; indices of the kept boxes, best first."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes.T
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    keep = []
    while order.size and len(keep) < limit:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        iou = inter / np.maximum(area[i] + area[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


class DetectionParams(DecoderParams):
    type: Literal["detection"]
    decode_grid: bool = True  # rows are grid offsets (YOLOX) to decode, not input pixels
    strides: list[int] = Field(default_factory=lambda: [8, 16, 32], min_length=1)  # grid strides, row order
    score_threshold: float = Field(0.5, ge=0.0, le=1.0)  # objectness x class score kept from
    iou_threshold: float = Field(0.45, ge=0.0, le=1.0)   # NMS: a box overlapping a better one more is dropped
    max_detections: int = Field(100, ge=1, le=10000)     # rows per result at most (the payload's size)


class Detection(Decoder):
    type = "detection"
    kind = KIND_DETECTION
    Params = DetectionParams

    def __init__(self, params, labels, input_w, input_h, outputs, resize="stretch"):
        super().__init__(params, labels, input_w, input_h, outputs, resize)
        self.decode_grid = params.decode_grid
        self.strides = list(params.strides)
        self.score_threshold = params.score_threshold
        self.iou_threshold = params.iou_threshold
        self.max_detections = params.max_detections
        if any(s < 1 for s in self.strides):
            raise DecoderError(f"decoder parameter strides: {self.strides}: each must be >= 1")
        row = self.output_shape[-1] if self.output_shape else None
        if row is not None and row < 6:
            raise DecoderError(f"detection output rows have {row} values; (cx, cy, w, h, objectness, classes...) "
                               "needs at least 6")
        if labels and row is not None and len(labels) != row - 5:
            raise DecoderError(f"{len(labels)} labels for an output of {row - 5} classes")
        self._buf = np.zeros((self.max_detections, 6), np.float32)
        if self.decode_grid:
            grids, strides = [], []
            for s in self.strides:
                gh, gw = input_h // s, input_w // s
                yv, xv = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
                grids.append(np.stack((xv, yv), -1).reshape(-1, 2))
                strides.append(np.full((gh * gw, 1), s))
            self._grid = np.concatenate(grids).astype(np.float32)
            self._stride = np.concatenate(strides).astype(np.float32)
            anchors = self.output_shape[1] if len(self.output_shape) > 1 else None
            if anchors is not None and anchors != len(self._grid):
                raise DecoderError(f"detection output has {anchors} rows; strides {self.strides} on "
                                   f"{input_w}x{input_h} give {len(self._grid)}")

    def decode(self, outputs, frame_w, frame_h):
        out = outputs[self.output].reshape(-1, outputs[self.output].shape[-1])
        if self.decode_grid:
            xy = (out[:, :2] + self._grid) * self._stride
            wh = np.exp(out[:, 2:4]) * self._stride
        else:
            xy, wh = out[:, :2], out[:, 2:4]
        cls_scores = out[:, 5:] * out[:, 4:5]
        cls = cls_scores.argmax(1)
        score = cls_scores[np.arange(len(cls)), cls]
        sel = score >= self.score_threshold
        if not sel.any():
            return self._buf[:0], 0
        xy, wh, score, cls = xy[sel], wh[sel], score[sel], cls[sel]
        place = placement(self.resize, frame_w, frame_h, self.input_w, self.input_h)  # as fusion placed the frame
        boxes = np.empty((len(score), 4), np.float32)
        boxes[:, 0] = place.to_frame_x(xy[:, 0] - wh[:, 0] / 2)
        boxes[:, 1] = place.to_frame_y(xy[:, 1] - wh[:, 1] / 2)
        boxes[:, 2] = place.to_frame_x(xy[:, 0] + wh[:, 0] / 2)
        boxes[:, 3] = place.to_frame_y(xy[:, 1] + wh[:, 1] / 2)
        # class-aware NMS: offset boxes per class so classes never suppress each other
        offset = (cls.astype(np.float32) * (max(frame_w, frame_h) + 1))[:, None]
        keep = nms(boxes + offset, score, self.iou_threshold, self.max_detections)
        n = len(keep)
        self._buf[:n, :4] = boxes[keep]
        self._buf[:n, 4] = score[keep]
        self._buf[:n, 5] = cls[keep]
        return self._buf[:n], n
