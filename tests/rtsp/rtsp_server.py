"""A real RTSP server for the ffmpeg producer's tests: GStreamer's rtsp-server (Debian's
gir1.2-gst-rtsp-server-1.0, python3-gi), H.264 from videotestsrc, at rtsp://127.0.0.1:PORT/cam.

Run with the system's python3 (python3-gi is not in the project's .venv):
    /usr/bin/python3 tests/rtsp/rtsp_server.py PORT [WIDTHxHEIGHT]   (default 320x240)
Prints "READY PORT" once it listens; serves until killed.
"""
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

Gst.init(None)
port = sys.argv[1]
width, height = (sys.argv[2] if len(sys.argv) > 2 else "320x240").split("x")
server = GstRtspServer.RTSPServer()
server.set_address("127.0.0.1")
server.set_service(port)
factory = GstRtspServer.RTSPMediaFactory()
# A live 25 fps source, encoded for low latency, a key frame every second (a reconnecting client decodes soon).
factory.set_launch(f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
                   "framerate=25/1 "
                   "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=25 "
                   "! rtph264pay name=pay0 pt=96 config-interval=1 )")
factory.set_shared(True)
server.get_mount_points().add_factory("/cam", factory)
if server.attach(None) == 0:
    sys.exit(f"cannot listen on 127.0.0.1:{port}")
print("READY", port, flush=True)
GLib.MainLoop().run()
