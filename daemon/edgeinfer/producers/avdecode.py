"""Deprecated name, removed in 0.4.0: `python -m edgeinfer.producers.avdecode` runs the RTSP decoder child,
whose code and name are now edgeinfer.cameras.avdecode (what the ffmpeg producer launches since 0.3). It stays
for one release because a camera service started before an upgrade still has the old producer in memory and
re-runs the child by this name on its next reconnection; a restart of the camera's unit ends that. Nothing is
said on stderr: the child's stderr is its protocol with the producer (one line per event)."""
import os
import sys

from edgeinfer.cameras.avdecode import main

REMOVED_IN = "0.4.0"

if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # as edgeinfer.cameras.avdecode's own __main__: no teardown while FFmpeg's threads hold stdout
