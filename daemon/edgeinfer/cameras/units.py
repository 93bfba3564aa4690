"""Cameras as services: /etc/edgeinfer/cameras/NAME.yaml, run by `edgeinfer-camera@NAME.service`.

A camera file says where the frames come from and how they are handed to edgeinferd;
`edgeinferctl camera run NAME` (the unit's ExecStart) runs the ffmpeg producer (or the
synthetic one) under systemd:
- READY=1 once the first frame is published (Type=notify): "started" means frames flow.
- WATCHDOG=1 only while frames flow. A source that stalls is reconnected in-process with
  bounded exponential backoff (0.5 s doubling to 10 s, at most 1 s for a source whose last frame is under a
  minute old: short outages keep the ring and the daemon's attachment); an outage longer than WatchdogSec
  stops the pings and systemd restarts the unit (Restart=always): a long outage is visible as restarts, and nothing
  waits forever. docs/operations/cameras.md, "Cameras as services".
- STATUS= says how many frames were published and the last reconnection's reason.
The unit runs as the camera's own user, `edgeinfer-cam-NAME` (`camera add` creates it), which
is the stream's `producer:` in edgeinferd.yaml: ABI 2 identifies a producer by its uid, so a
camera can produce only its own stream.
"""
from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import tempfile
import time
from typing import Literal, Optional

import yaml
from pydantic import Field, model_validator

from edgeinfer.abi.constants import INGRESS_SOCKET
from edgeinfer.abi.vocabulary import FrameFormat, RtspClock, takes_source_colour
from edgeinfer.support.strictmodel import StrictModel
from edgeinfer.support.yamlconf import load_yaml_file, load_yaml_model

CAMERA_DIR = "/etc/edgeinfer/cameras"
USER_PREFIX = "edgeinfer-cam-"
# What a camera file needs for its unit to start (`camera add` writes it so): its user reads it, nobody else writes.
CAMERA_FILE_NEED = "readable by the camera's user {user}: 0644 root:root, as `camera add` writes it"
# A camera's name is a systemd instance, a stream name and its user's suffix: useradd (Debian's shadow) takes a user
# name of at most 32 characters, so at most 32 - len(USER_PREFIX) = 18 here.
NAME_MAX = 32 - len(USER_PREFIX)
NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{NAME_MAX - 1}}}$"
SYNTHETIC = "synthetic"  # the source that needs no camera: rotated text pages (tests, demos)
STATUS_INTERVAL_S = 5.0


def user_of(name: str) -> str:
    """The camera's user: its unit's User= and its stream's producer."""
    return f"{USER_PREFIX}{name}"


def check_name(name: str) -> str:
    """The one check of a camera's name (and its message): what a unit instance, a stream and useradd accept."""
    if not re.match(NAME_PATTERN, name):
        raise ValueError(f"camera name {name!r}: letters, digits, '-' and '_', at most {NAME_MAX}, starting with a "
                         f"letter or digit (its user {USER_PREFIX}NAME may have at most 32 characters)")
    return name


class CameraConfig(StrictModel):
    source: str = Field(min_length=1, description="file, rtsp:// or http(s):// URL, /dev/videoN, or synthetic")
    stream: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$",
                                  description="edgeinferd's stream name (default: the camera's name)")
    # The frames handed over (the model's graph resizes them further). None: the source's size, not scaled
    # (synthetic: 640x480).
    width: Optional[int] = Field(None, ge=1, le=16384)
    height: Optional[int] = Field(None, ge=1, le=16384)
    # i420 (the decoder's own yuv420p), nv12, yuyv: with the source's colorimetry unless given (i420:bt709 …);
    # bgr24/rgb24: converted in the producer by swscale (the CPU pays twice).
    pixel_format: FrameFormat = "i420"
    fps: Optional[float] = Field(None, ge=0, le=1000, description="at most this many a second (default: the source's)")
    transport: Optional[Literal["tcp", "udp"]] = None  # rtsp
    # rtsp: stamp frames by the sender's clock (RTCP sender reports; decoded by PyAV) or by the stream's own
    # timestamps (decoded by the ffmpeg program, e.g. for a hardware decoder only it has)
    rtsp_clock: RtspClock = "sender"
    connect_timeout_s: float = Field(10.0, gt=0, le=300)
    read_timeout_s: float = Field(5.0, gt=0, le=300)
    reconnect: bool = True
    loop: bool = False  # a file: play it again at its end (else the unit ends at the file's end, and Restart=)
    hwaccel: Optional[str] = Field(None, pattern=r"^[a-z0-9_]{1,32}$")
    socket: str = INGRESS_SOCKET

    @model_validator(mode="after")
    def _size(self):
        if (self.width is None) != (self.height is None):
            raise ValueError("width and height: give both (a scaled size) or neither (the source's size)")
        if self.loop and (self.source == SYNTHETIC or self.live):
            raise ValueError(f"loop: only a file source is played again at its end (source: {self.source})")
        return self

    @property
    def frame_format(self) -> str:
        """The ring's pixel format as configured (a synthetic source always publishes its own)."""
        from edgeinfer.cameras import synthetic
        return synthetic.PIXEL_FORMAT if self.source == SYNTHETIC else self.pixel_format

    def feed_options(self, **overrides):
        """The ffmpeg producer's options for this camera (FfmpegOptions), with `overrides` (camera test's)."""
        from edgeinfer.cameras.ffmpeg import FfmpegOptions
        return FfmpegOptions(**{**dict(source=self.source, width=self.width, height=self.height,
                                       pixel_format=self.pixel_format, fps=self.fps,
                                       connect_timeout=self.connect_timeout_s, read_timeout=self.read_timeout_s,
                                       transport=self.transport, rtsp_clock=self.rtsp_clock, hwaccel=self.hwaccel,
                                       reconnect=self.reconnect, loop=self.loop), **overrides})

    @property
    def live(self) -> bool:
        """A source that delivers at its own rate (a URL, a device), not a file read as fast as it decodes."""
        from edgeinfer.cameras.ffmpeg import source_kind
        return self.source != SYNTHETIC and source_kind(self.source) != "file"


def path_of(name: str, directory: str = CAMERA_DIR) -> str:
    return os.path.join(directory, f"{check_name(name)}.yaml")


def load(name: str, directory: str = CAMERA_DIR) -> CameraConfig:
    return load_yaml_file(CameraConfig, path_of(name, directory))


def check_decoder(cam: CameraConfig) -> None:
    """Raises FeedError when what decodes the camera's source is not installed: the ffmpeg program, or PyAV (package
    edgeinfer-rtsp) for RTSP with the sender's clock. A restart cannot mend it (a camera unit exits 2)."""
    if cam.source == SYNTHETIC:
        return
    from edgeinfer.cameras import ffmpeg
    if cam.feed_options().pyav:
        ffmpeg.find_pyav()
    else:
        ffmpeg.find_ffmpeg()


class UnitNotifier:
    """READY at the first frame, WATCHDOG while frames flow (at most every half interval), STATUS now and then."""

    def __init__(self, notifier, name: str, stream: str):
        self.notifier, self.name, self.stream = notifier, name, stream
        self.ready = False
        self.last_ping = self.last_status = 0.0
        self.last_problem = ""

    def published(self, n: int) -> None:
        now = time.monotonic()
        if not self.ready:
            self.ready = True
            self.notifier.send("READY=1", f"STATUS=camera {self.name}: frames flow to stream {self.stream}")
            self.last_status = now
        if self.notifier.watchdog_s and now - self.last_ping >= self.notifier.watchdog_s / 2:
            self.notifier.send("WATCHDOG=1")
            self.last_ping = now
        if now - self.last_status >= STATUS_INTERVAL_S:
            self.notifier.send(f"STATUS=camera {self.name}: {n} frames published to stream {self.stream}"
                               + (f"; last problem: {self.last_problem}" if self.last_problem else ""))
            self.last_status = now

    def problem(self, line: str) -> None:
        print(f"edgeinferctl: {line}", file=sys.stderr, flush=True)
        self.last_problem = line
        self.notifier.send(f"STATUS=camera {self.name}: {line}")


def run(name: str, directory: str = CAMERA_DIR, stop=lambda: False, env=os.environ,
        cam: CameraConfig | None = None) -> int:
    """A camera unit's main: the camera's producer with systemd's notify protocol; returns frames published.
    cam: its file, already loaded (else it is loaded here)."""
    from edgeinfer.cameras import ffmpeg, synthetic
    from edgeinfer.support.systemd import Notifier
    cam = cam or load(name, directory)
    stream = cam.stream or name
    unit = UnitNotifier(Notifier(env), name, stream)
    if cam.source == SYNTHETIC:
        return synthetic.run(stream, cam.width, cam.height, cam.fps, socket=cam.socket, wait=0, stop=stop,
                             on_publish=unit.published)
    opts = cam.feed_options()
    return ffmpeg.run(opts, stream, socket=cam.socket, wait=0, stop=stop, say=unit.problem,
                      on_publish=unit.published)


DECODED_MAX_AGE_MS = 400  # camera add's max_age_ms for a file or network source (the default 200 is a device's)


def add(name: str, fields: dict, directory: str = CAMERA_DIR, create_user: bool = True) -> tuple[str, str]:
    """Writes NAME.yaml (validated first, replaced atomically) and, as root, creates the camera's user in group
    edgeinfer. Returns (path, the stream entry for edgeinferd.yaml)."""
    path = path_of(name, directory)
    text = yaml.safe_dump({k: v for k, v in fields.items() if v is not None}, sort_keys=False)
    cam = load_yaml_model(CameraConfig, text, path)  # refuse before anything is written
    if create_user:  # before the file: a camera whose user could not be made is not left half added
        ensure_user(name)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"# edgeinfer camera {name}: run by edgeinfer-camera@{name}.service as user {user_of(name)}\n")
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    # Declared, the daemon builds the geometry's session before READY; `camera test` says what is not known yet
    # (the source's size, the colorimetry it reports).
    size = f"    width: {cam.width}\n    height: {cam.height}\n" if cam.width else \
        "    # width: …, height: …  the source's (edgeinferctl camera test NAME says them)\n"
    size += f"    pixel_format: {cam.frame_format}\n" if not takes_source_colour(cam.frame_format) else \
        f"    pixel_format: {cam.pixel_format}  # with the source's colorimetry, e.g. {cam.pixel_format}:bt709 " \
        "(camera test says it)\n"
    # A decoded file or network stream: a frame with B-frames after it is handed over ~150 ms after its capture
    # stamp, which leaves the default max_age_ms (200) no slack on a busy host: its frames would be dropped stale.
    from edgeinfer.cameras.ffmpeg import source_kind
    if cam.source != SYNTHETIC and source_kind(cam.source) != "device":
        size += (f"    max_age_ms: {DECODED_MAX_AGE_MS}  # decoded frames (B-frames) are ~150 ms old when handed over: "
                 "the default 200 drops them stale on a busy host\n")
    entry = (f"streams:\n  - name: {cam.stream or name}\n    producer: {{user: {user_of(name)}}}\n{size}"
             f"    # readers: {{users: [...], groups: [...]}}  who may read its results\n")
    return path, entry


def ensure_user(name: str) -> None:
    """The camera's system user (no home, no shell), in group edgeinfer: it may reach the ingress socket."""
    user = user_of(name)
    try:
        pwd.getpwnam(user)
        return
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise PermissionError(f"user {user} does not exist and only root can create it (run as root, or pass "
                              "--no-user and create it yourself)")
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", "--groups", "edgeinfer", user],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise OSError(f"useradd {user}: {r.stderr.strip() or f'exit {r.returncode}'}")


def names(directory: str = CAMERA_DIR) -> list[str]:
    try:
        return sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".yaml") and not f.startswith("."))
    except FileNotFoundError:
        return []


def unit_state(name: str) -> str:
    """systemctl's ActiveState of the camera's unit, or "-" where systemctl cannot say."""
    try:
        r = subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", f"edgeinfer-camera@{name}.service"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "-"
    return r.stdout.strip() or "-" if r.returncode == 0 else "-"


def test(name: str, directory: str = CAMERA_DIR, frames: int = 50, say=print) -> float:
    """Runs the camera's source into a private ring (no daemon) for `frames` frames: says the source's geometry, the
    frames' and the rate; returns frames a second. A file is decoded as fast as it goes (its decode rate); a live
    source delivers at its own rate."""
    from edgeinfer.cameras import ffmpeg, synthetic
    cam = load(name, directory)
    times: list[float] = []

    def seen(n: int) -> None:
        times.append(time.monotonic())
    with tempfile.TemporaryDirectory(prefix="edgeinfer-camera-test-") as d:
        sock = os.path.join(d, "nobody.sock")  # no daemon: the frames go into the ring and no further
        if cam.source == SYNTHETIC:
            geometry = f"{cam.width or synthetic.WIDTH}x{cam.height or synthetic.HEIGHT} {cam.frame_format}"
            say(f"camera {name}: source synthetic, {geometry}")
            synthetic.run(f"{name}-test", cam.width, cam.height, 0, frames, socket=sock, wait=0, on_publish=seen)
        else:
            opts = cam.feed_options(fps=cam.fps if cam.live else 0, frames=frames, reconnect=False)
            try:
                src = ffmpeg.probe(ffmpeg.find_ffmpeg(), opts)
                out = ffmpeg.output_of(opts, src)
            except ffmpeg.FeedError as e:
                raise OSError(str(e)) from None
            say(f"camera {name}: source {cam.source}: {src.get('codec_name')} {src.get('width')}x{src.get('height')}"
                f" at {src.get('avg_frame_rate')} fps ({src.get('pix_fmt')}, colour space "
                f"{src.get('color_space', 'unknown')}, range {src.get('color_range', 'unknown')})")
            rings = [out]  # ffprobe's view; then the ring the feed makes, from what its decoder delivers
            ffmpeg.run(opts, f"{name}-test", socket=sock, wait=0, on_publish=seen, on_ring=rings.append,
                       note=lambda line: say(f"camera {name}: {line}"))
            geometry = f"{rings[-1].width}x{rings[-1].height} {rings[-1].pixel_format}"
    if not times:
        raise OSError(f"camera {name}: no frame")
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    say(f"camera {name}: frames {geometry}; {len(times)} in "
        f"{times[-1] - times[0]:.2f} s: {rate:.1f} frames/s ({'the source' if cam.live else 'decode'} rate)")
    return rate
