"""Camera frames for offline tools (`model quantize`): images from a
directory, or frames from a camera that hands its ring to the tool.

Frames are returned as the camera would write them, uint8 [H, W, C] with
their pixel format: the daemon's fused graph does the rest.

Why a camera must hand its ring to the tool (and cannot be read beside the
daemon): under ABI 2 a frame ring is a sealed memfd its producer hands to one
consumer over a socket; nobody else, root included, can open it by name, and
the daemon gives out result rings only (docs/abi.md, threat model). So
`--from-stream NAME` listens on a socket of its own, the camera connects to
that socket as it would to the daemon's (e.g. `edgeinferctl feed ... --socket
PATH`, or the camera's ingress socket setting), and the tool reads the frames
it needs and lets the camera go.
"""
from __future__ import annotations

import os
import selectors
import time

import numpy as np

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


def image_frames(directory: str, count: int) -> list[tuple[np.ndarray, str]]:
    """The first `count` images of `directory` (by file name) as rgb24 frames."""
    from PIL import Image, UnidentifiedImageError
    try:
        names = sorted(n for n in os.listdir(directory) if n.lower().endswith(IMAGE_EXTENSIONS))
    except OSError as e:
        raise OSError(f"{directory}: cannot list calibration images: {e.strerror}") from None
    if len(names) < count:
        raise ValueError(f"{directory}: {len(names)} images ({', '.join(IMAGE_EXTENSIONS)}), {count} needed "
                         "(calibration frames + held-out frames)")
    frames = []
    for name in names[:count]:
        path = os.path.join(directory, name)
        try:
            with Image.open(path) as img:
                frames.append((np.asarray(img.convert("RGB")).copy(), "rgb24"))
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f"{path}: not a readable image: {e}") from None
    return frames


def stream_frames(stream: str, count: int, socket_path: str, timeout: float) -> list[tuple[np.ndarray, str]]:
    """`count` successive frames of the camera that connects to `socket_path` as `stream` (a copy of each:
    the slot goes back to the camera at once). Waits `timeout` seconds for the camera and for each frame."""
    from edgeinfer.abi import ring
    from edgeinfer.support.sockets import bind_listener
    listener = bind_listener(socket_path, None)
    conn = reader = None
    try:
        conn = _accept_producer(listener, stream, timeout)
        fd = _handshake(conn, stream, timeout)
        try:
            reader = ring.FrameReader(fd, f"stream {stream}")
        finally:
            os.close(fd)  # the reader holds its own duplicate
        lay = reader.layout
        fmt = ring.format_name(lay)
        frames = []
        while len(frames) < count:
            f = reader.next_frame(timeout)
            if f is None:
                if reader.closed:
                    raise ValueError(f"stream {stream}: the camera closed its ring after {len(frames)} of {count} "
                                     "frames")
                raise ValueError(f"stream {stream}: no frame for {timeout:g} s after {len(frames)} of {count}")
            with f:
                frames.append((np.array(f.array), fmt))
        return frames
    finally:
        if reader is not None:
            reader.close()
        if conn is not None:
            conn.close()
        listener.close()
        try:
            os.unlink(socket_path)
        except OSError:
            pass


def _accept_producer(listener, stream: str, timeout: float):
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise ValueError(f"no camera connected to {listener.getsockname()} as stream {stream} within "
                             f"{timeout:g} s")
        conn, _ = listener.accept()
    finally:
        sel.close()
    return conn


def _handshake(conn, stream: str, timeout: float) -> int:
    """The producer's hello (its ring fd) answered as the daemon answers an accepted camera; returns the fd."""
    from edgeinfer.abi import ring
    conn.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while True:  # recv_hello: None until the whole hello (with its fd) is there
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise ValueError(f"the camera connected but sent no hello within {timeout:g} s")
            hello = ring.recv_hello(conn.fileno())
            if hello is not None:
                break
    finally:
        sel.close()
    role, name, fd = hello
    if role != ring.ROLE_PRODUCER or fd < 0 or name != stream:
        if fd >= 0:
            os.close(fd)
        why = f"expected the producer of stream {stream}"
        ring.send_reply(conn.fileno(), ring.STATUS["refused"], why)
        raise ValueError(f"a client connected as {'producer' if role == ring.ROLE_PRODUCER else 'reader'} of "
                         f"{name!r}: {why}")
    ring.send_reply(conn.fileno(), 0, "", -1)
    return fd
