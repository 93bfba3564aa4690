"""An ffmpeg producer: any source ffmpeg reads (file, URL, /dev/videoN) decoded
to raw BGR frames on a pipe, read straight into the ring's free slot
(readinto: the only copy is the kernel's, pipe → slot)."""
from __future__ import annotations

import shutil
import subprocess

from edgeinfer import ring
from edgeinfer.producers.connection import ConnectionReporter


def run(source: str, stream: str, width: int, height: int, *, fps: float | None = None, loop: bool = False,
        socket: str = ring.INGRESS_SOCKET, wait: float = 10.0, stop=lambda: False) -> int:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise FileNotFoundError("ffmpeg is not installed (Debian: apt install ffmpeg)")
    args = [ffmpeg, "-nostdin", "-loglevel", "error"]
    if not source.startswith("/dev/video"):
        args += ["-re"]  # a file plays at its own rate, like a camera
    if loop:
        args += ["-stream_loop", "-1"]
    args += ["-i", source, "-vf", f"scale={width}:{height}"]
    if fps:
        args += ["-r", str(fps)]
    args += ["-f", "rawvideo", "-pix_fmt", "bgr24", "-"]
    writer = ring.FrameWriter.connect(stream, width, height, "bgr24", socket=socket, wait=wait)
    report = ConnectionReporter(writer)
    frame_bytes = width * height * 3
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, bufsize=0)
    n = 0
    try:
        while not stop():
            view = memoryview(writer.begin_flat())[:frame_bytes]
            got = 0
            while got < frame_bytes:
                k = proc.stdout.readinto(view[got:])
                if not k:
                    return n  # end of stream
                got += k
            writer.publish()
            report()
            n += 1
    finally:
        proc.kill()
        proc.wait()
        writer.close()
    return n
