"""`edgeinferctl camera add|list|test|run`: cameras as services (cameras/units.py)."""
from __future__ import annotations

import sys

from edgeinfer.cli.commands import stop_flag

_CAMERA_KEYS = ("source", "stream", "width", "height", "pixel_format", "fps", "transport", "rtsp_clock",
                "connect_timeout_s", "read_timeout_s", "reconnect", "loop", "hwaccel", "socket")


def cmd_camera_add(args) -> int:
    from edgeinfer.cameras import units as cameras
    path, entry = cameras.add(args.name, {k: getattr(args, k) for k in _CAMERA_KEYS}, args.dir,
                              create_user=not args.no_user)
    print(f"wrote {path}; the camera runs as user {cameras.user_of(args.name)}")
    print(f"add its stream to /etc/edgeinfer/edgeinferd.yaml:\n{entry}"
          "then restart the daemon (a reload does not add streams; cameras already running keep their rings and "
          "connections across the restart):\n"
          "  systemctl restart edgeinferd\n"
          f"and start the camera:\n  systemctl enable --now edgeinfer-camera@{args.name}")
    return 0


def cmd_camera_list(args) -> int:
    from edgeinfer.cameras import units as cameras
    from edgeinfer.support.yamlconf import ConfigError
    for name in cameras.names(args.dir):
        try:
            cam = cameras.load(name, args.dir)
            size = f"{cam.width}x{cam.height}" if cam.width else "source size"
            what = f"stream {cam.stream or name}  {size} {cam.frame_format}  {cam.source}"
        except ConfigError as e:
            what = f"invalid: {e.problems[0] if e.problems else e}"
        print(f"{name}  {cameras.unit_state(name)}  {what}")
    return 0


def cmd_camera_test(args) -> int:
    from edgeinfer.cameras import units as cameras
    from edgeinfer.cameras.ffmpeg import FeedError
    try:
        cameras.test(args.name, args.dir, args.frames)
    except FeedError as e:
        print(f"edgeinferctl: camera {args.name}: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_camera_run(args) -> int:
    """A camera unit's ExecStart=. Exit 2 (RestartPreventExitStatus=2: no restart loop) for what a restart cannot
    mend: a camera file the camera's user cannot read, one that does not load, or a decoder that is not installed."""
    from edgeinfer.cameras import units as cameras
    from edgeinfer.cameras.ffmpeg import FeedError
    from edgeinfer.support.startfiles import StartFile, StartFileError, check_start_files
    from edgeinfer.support.yamlconf import ConfigError
    try:  # only what the start reads: an error while the camera runs is no reason to stop it for good
        path = cameras.path_of(args.name, args.dir)
        need = cameras.CAMERA_FILE_NEED.format(user=cameras.user_of(args.name))
        check_start_files([StartFile(path, "the camera file", need)])
        cam = cameras.load(args.name, args.dir)
        cameras.check_decoder(cam)
    except StartFileError as e:
        for line in e.problems:
            print(f"edgeinferctl: camera {args.name}: cannot start: {line}", file=sys.stderr)
        return 2
    except (ConfigError, ValueError) as e:  # a file that does not load, or a name no unit may have
        print(f"edgeinferctl: camera {args.name}: {e}", file=sys.stderr)
        return 2
    except FeedError as e:  # its decoder is not installed
        print(f"edgeinferctl: camera {args.name}: cannot start: {e}", file=sys.stderr)
        return 2
    try:
        n = cameras.run(args.name, args.dir, stop=stop_flag(), cam=cam)
    except FeedError as e:
        print(f"edgeinferctl: camera {args.name}: {e}", file=sys.stderr)
        return 1
    print(f"camera {args.name}: published {n} frames", file=sys.stderr)
    return 0
