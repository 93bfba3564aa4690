"""A synthetic "document camera": pages of random words, each rotated by a known
0/90/180/270 degrees, so an orientation classifier's answers can be checked live.

Ground truth travels in the frame id: frame_id = n * 4 + truth, where truth is
the index of the label (0: "0", 1: "90", 2: "180", 3: "270" degrees clockwise).
"""
from __future__ import annotations

import random
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edgeinfer.abi import ring
from edgeinfer.cameras.connection import ConnectionReporter

WORDS = ("edge inference camera frame shared memory latency model signed stream result orientation "
         "document page text rotate newest wins zero copy kernel futex deadline sample").split()


def render_page(side: int, rng: random.Random) -> np.ndarray:
    """A white square page with lines of random words, as a BGR uint8 array."""
    img = Image.new("RGB", (side, side), "white")
    draw = ImageDraw.Draw(img)
    y = side // 16
    while y < side - side // 12:
        size = rng.randint(max(10, side // 27), max(12, side // 16))
        font = ImageFont.load_default(size=size)
        line = " ".join(rng.choice(WORDS) for _ in range(12))
        draw.text((side // 20, y), line, fill="black", font=font)
        y += int(size * 1.5)
    return np.asarray(img)[:, :, ::-1].copy()  # RGB → BGR


def make_frames(width: int, height: int, pages: int = 6, seed: int = 1) -> list[tuple[np.ndarray, int]]:
    """(frame, truth) pairs: each page in all four rotations, centred on a white frame."""
    rng = random.Random(seed)
    side = min(width, height)
    out = []
    for _ in range(pages):
        page = render_page(side, rng)
        for k in range(4):
            frame = np.full((height, width, 3), 255, np.uint8)
            y0, x0 = (height - side) // 2, (width - side) // 2
            frame[y0:y0 + side, x0:x0 + side] = np.rot90(page, k)  # k quarter turns counter-clockwise
            out.append((frame, (4 - k) % 4))                       # = (4 - k) % 4 quarter turns clockwise
    return out


WIDTH, HEIGHT, FPS = 640, 480, 30.0  # what `feed --synthetic` and a synthetic camera publish unless told
PIXEL_FORMAT = "bgr24"


def run(stream: str, width: int | None, height: int | None, fps: float | None, frames: int | None = None, *,
        socket: str = ring.INGRESS_SOCKET, wait: float = 10.0, seed: int = 1, stop=lambda: False,
        on_publish=lambda n: None) -> int:
    """Hands a ring to the daemon as `stream` and publishes frames at `fps` (0: as fast as possible)
    until `frames` or stop(); returns the count. The daemon's refusal is raised. on_publish(count) after
    each frame (a camera unit's READY and watchdog). None: WIDTH, HEIGHT, FPS."""
    width, height, fps = width or WIDTH, height or HEIGHT, FPS if fps is None else fps
    pool = make_frames(width, height, seed=seed)
    rng = random.Random(seed)
    writer = ring.FrameWriter.connect(stream, width, height, PIXEL_FORMAT, socket=socket, wait=wait)
    report = ConnectionReporter(writer)
    period = 1.0 / fps if fps > 0 else 0.0
    next_t = time.monotonic()
    n = 0
    try:
        while (frames is None or n < frames) and not stop():
            frame, truth = pool[rng.randrange(len(pool))]
            np.copyto(writer.begin(), frame)
            writer.publish(frame_id=n * 4 + truth)
            report()
            n += 1
            on_publish(n)
            if period:
                next_t += period
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_t = time.monotonic()  # late: never burst to catch up
    finally:
        writer.close()
    return n
