"""Compatibility: `python -m edgeinfer.producers.avdecode` is the documented command of the RTSP decoder child
(docs/operations.md): the ffmpeg producer runs it under this name (what `ps`/`pgrep` show), and a camera
service started before an upgrade re-runs it by this name on its next reconnection. The code lives in
edgeinfer.cameras.avdecode."""
import os
import sys

from edgeinfer.cameras.avdecode import main

if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # as edgeinfer.cameras.avdecode's own __main__: no teardown while FFmpeg's threads hold stdout
