"""YUV straight from the decoder (#14, item 4): nv12, i420 and yuyv frames in the ring, converted to RGB
inside the model graph. The conversion is checked against ffmpeg's own (the real ffmpeg, on the same bytes),
the daemon's results against plain ONNX Runtime on ffmpeg's RGB of the same frames."""
from __future__ import annotations

import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from conftest import read_line, require_tool
from daemon_helpers import camera, results, start_daemon, stop_daemon, write_config
from edgeinfer.abi import ring
from edgeinfer.models.bundle import InputSpec, PreprocessSpec
from edgeinfer.models.fusion import FRAME_INPUT, preprocess_graph
from edgeinfer.cameras.synthetic import make_frames
from edgeinfer.abi.vocabulary import COLORIMETRIES, YUV_BASES, frame_shape
from test_daemon import class_scores, reference

FF_PIX = {"nv12": "nv12", "i420": "yuv420p", "yuyv": "yuyv422"}
FF_COLOUR = {"bt601": ("bt601", "tv"), "bt601-full": ("bt601", "pc"), "bt709": ("bt709", "tv"),
             "bt709-full": ("bt709", "pc")}
# ffmpeg's exact path: chroma repeated over the pixels it covers (as the graph does), rounding done right. Its
# default fast path (table-driven, no accurate_rnd) is itself up to 3 levels off the exact values.
FF_EXACT = "neighbor+accurate_rnd+full_chroma_int"


def fmt_name(base: str, colour: str) -> str:
    return base if colour == "bt601" else f"{base}:{colour}"


def ffmpeg_convert(raw: bytes, src_pix: str, dst_pix: str, w: int, h: int, colour: str = "bt601",
                   out_colour: bool = False) -> bytes:
    """ffmpeg's conversion of one raw frame. out_colour: the colorimetry is the output's (RGB → YUV)."""
    matrix, rng = FF_COLOUR[colour]
    side = "out" if out_colour else "in"
    vf = f"scale={side}_color_matrix={matrix}:{side}_range={rng}:flags={FF_EXACT}"
    return subprocess.run([require_tool("ffmpeg"), "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", src_pix,
                           "-s", f"{w}x{h}", "-i", "-", "-vf", vf, "-f", "rawvideo", "-pix_fmt", dst_pix, "-"],
                          input=raw, capture_output=True, check=True, timeout=60).stdout


def graph_rgb(raw: bytes, fmt: str, h: int, w: int) -> np.ndarray:
    """The fused preprocessing alone, for a model that takes the frame's own size in RGB, unnormalised: the
    colour conversion as the model would see it."""
    spec = InputSpec(name="x", width=w, height=h, pixel_format="rgb24", layout="nhwc")
    model = preprocess_graph(fmt, h, w, spec, PreprocessSpec(), opset=17, ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    frame = np.frombuffer(raw, np.uint8).reshape(1, *frame_shape(fmt, h, w))
    return sess.run(None, {FRAME_INPUT: frame})[0][0]


@pytest.mark.parametrize("colour", COLORIMETRIES)
@pytest.mark.parametrize("base", YUV_BASES)
def test_conversion_is_within_one_level_of_ffmpeg(base, colour):
    """Random samples over the whole legal range (limited: 16-235 / 16-240; full: 0-255), so combinations far
    out of the RGB gamut too, with the chroma changing at every sample: the graph's RGB is within ±1 of ffmpeg's,
    and it is not the conversion of another colorimetry. (Beyond the limited range ffmpeg's exact path wraps
    around: Y 255 with U 255 comes out blue 0; the graph clips.)"""
    h, w = 48, 64
    rows, _, bpp = frame_shape(base, h, w)
    raw = np.random.default_rng(7).integers(0, 256, rows * w * bpp, np.uint8)
    if not colour.endswith("-full"):
        raw = np.clip(raw, 16, 235)  # (chroma's 236-240 aside: one range for both keeps the test short)
    raw = raw.tobytes()
    ours = graph_rgb(raw, fmt_name(base, colour), h, w)
    assert np.array_equal(ours, np.clip(np.rint(ours), 0, 255)), "whole levels in 0..255, as an 8-bit frame"
    theirs = np.frombuffer(ffmpeg_convert(raw, FF_PIX[base], "rgb24", w, h, colour), np.uint8).reshape(h, w, 3)
    diff = np.abs(ours - theirs.astype(np.float32))
    assert diff.max() <= 1, f"{base} {colour}: {int(diff.max())} levels off ffmpeg at {np.argwhere(diff > 1)[:3]}"
    assert diff.mean() < 0.05
    other = "bt709" if colour.startswith("bt601") else "bt601"
    wrong = np.frombuffer(ffmpeg_convert(raw, FF_PIX[base], "rgb24", w, h, other), np.uint8).reshape(h, w, 3)
    assert np.abs(ours - wrong.astype(np.float32)).max() > 8, "the colorimetry must change the conversion"


def test_yuv_rings_carry_their_layout_and_colorimetry():
    for fmt, rows, bpp, code in [("nv12:bt709", 72, 1, 2), ("i420", 72, 1, 0), ("yuyv:bt601-full", 48, 2, 1)]:
        with ring.FrameWriter.create(64, 48, fmt) as w:
            lay = w.layout
            assert (lay["rows"], lay["channels"], lay["colorimetry"]) == (rows, bpp, code)
            assert lay["frame_bytes"] == 64 * bpp * rows
            assert w.begin().shape == (rows, 64, bpp)
            assert ring.format_name(lay) == fmt


@pytest.mark.parametrize("make, error, text", [
    (lambda: ring.FrameWriter.create(63, 48, "nv12"), ring.BadArgument, "even width and height"),
    (lambda: ring.FrameWriter.create(64, 47, "i420"), ring.BadArgument, "even width and height"),
    (lambda: ring.FrameWriter.create(64, 48, "nv12", row_stride=128), ring.BadArgument, "packed"),
    (lambda: ring.FrameWriter.create(64, 48, "bgr24:bt709"), ValueError, "take a colorimetry"),
    (lambda: ring.FrameWriter.create(64, 48, "nv12:bt2020"), ValueError, "take a colorimetry"),
], ids=["odd width", "odd height", "padded rows", "colorimetry of rgb", "unknown colorimetry"])
def test_yuv_geometry_the_abi_cannot_express_is_refused(make, error, text):
    with pytest.raises(error, match=text):
        make()


def yuv_frames(base: str, colour: str, w: int, h: int, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Camera-like pictures as a decoder would hand them over (ffmpeg's RGB → YUV), and ffmpeg's RGB of those
    same YUV bytes (what a bgr24 producer would have published): (YUV slot arrays, BGR frames)."""
    pics = [f for f, _ in make_frames(w, h, pages=count)][:count]
    shape = frame_shape(base, h, w)
    yuvs, bgrs = [], []
    for p in pics:
        yuv = ffmpeg_convert(np.ascontiguousarray(p).tobytes(), "bgr24", FF_PIX[base], w, h, colour, out_colour=True)
        back = ffmpeg_convert(yuv, FF_PIX[base], "bgr24", w, h, colour)
        yuvs.append(np.frombuffer(yuv, np.uint8).reshape(shape))
        bgrs.append(np.frombuffer(back, np.uint8).reshape(h, w, 3))
    return yuvs, bgrs


CASES = [("nv12", "bt709"), ("i420", "bt601"), ("yuyv", "bt601-full")]


def test_daemon_results_on_yuv_equal_plain_onnxruntime_on_ffmpegs_rgb(bundles, children, tmp_path, stream):
    """One daemon, a camera per YUV format: every result equals plain ORT (the unfused model, numpy
    preprocessing) on ffmpeg's RGB of the same frames, within the ±1 level the conversions may differ by."""
    path = bundles("orientation")
    names = {base: f"{stream}-{base}" for base, _ in CASES}
    cfg = write_config(tmp_path, path, [{"name": names[b], "width": 224, "height": 224, "max_age_ms": 60000,
                                         "pixel_format": fmt_name(b, c)} for b, c in CASES])
    proc = start_daemon(children, cfg)
    _, run = reference(path)
    worst = 0.0
    for base, colour in CASES:
        yuvs, bgrs = yuv_frames(base, colour, 224, 224, 6)
        reader = results(proc, names[base])
        try:
            with camera(proc, names[base], 224, 224, fmt_name(base, colour)) as writer:
                for i, (yuv, bgr) in enumerate(zip(yuvs, bgrs)):
                    np.copyto(writer.begin(), yuv)
                    writer.publish(frame_id=i)
                    rec = reader.read(10.0)
                    assert rec is not None and rec.status == 0 and rec.frame_id == i, f"{base}: frame {i}"
                    want = run(bgr)[0].reshape(-1)
                    got = class_scores(rec)
                    assert np.argmax(got) == np.argmax(want), f"{base} frame {i}: {got} vs {want}"
                    worst = max(worst, float(np.abs(got - want).max()))
        finally:
            reader.close()
    print(f"largest score difference from plain ORT on ffmpeg's RGB: {worst:.2e}")
    assert worst <= 1e-3  # a level of difference in a few pixels moves a score by ~1e-5
    assert stop_daemon(proc) == 0


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "crop"])
@pytest.mark.parametrize("base, colour", CASES)
def test_resized_yuv_frames_give_the_model_what_resized_rgb_frames_give(base, colour, resize):
    """The graph crops and resizes each plane of a YUV frame from its own resolution (the chroma from half size),
    then converts at the model's size. What the model sees stays within ±1 level of the bgr24 path on ffmpeg's
    RGB of the same frame; and micro-batched frames ([k, ...]) get exactly what single frames get."""
    w, h = 640, 480
    spec = InputSpec(name="x", width=224, height=224, pixel_format="rgb24", layout="nhwc")
    pre = PreprocessSpec(resize=resize)

    def session(fmt: str, batched: bool = False) -> ort.InferenceSession:
        m = preprocess_graph(fmt, h, w, spec, pre, opset=17, ir_version=8, batched=batched)
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    fmt = fmt_name(base, colour)
    yuv_sess, bgr_sess = session(fmt), session("bgr24")
    yuvs, bgrs = yuv_frames(base, colour, w, h, 2)
    for yuv, bgr in zip(yuvs, bgrs):
        ours = yuv_sess.run(None, {FRAME_INPUT: yuv[None]})[0][0]
        diff = np.abs(ours - bgr_sess.run(None, {FRAME_INPUT: bgr[None]})[0][0])
        assert diff.max() <= 1 and diff.mean() < 0.1, f"{base}: {diff.max()} levels, mean {diff.mean():.3f}"
    batch = session(fmt, batched=True).run(None, {FRAME_INPUT: np.stack(yuvs)})[0]
    singles = np.concatenate([yuv_sess.run(None, {FRAME_INPUT: y[None]})[0] for y in yuvs])
    assert np.array_equal(batch, singles)


def test_a_c_camera_hands_over_an_nv12_ring_and_is_served(bundles, children, tmp_path, stream, c_producer):
    """The C example (examples/producer.c, ring.h alone) with --format nv12 --colorimetry bt709: the daemon
    accepts the ring as nv12:bt709 and serves it; a camera that says another colorimetry than the stream's
    declared one is served too (a geometry of its own, never a wrong conversion)."""
    path = bundles("orientation")
    cfg = write_config(tmp_path, path, [{"name": stream, "width": 320, "height": 240, "pixel_format": "nv12:bt709"}])
    log = tmp_path / "daemon.log"
    proc = start_daemon(children, cfg, log_file=str(log))
    reader = results(proc, stream)
    try:
        for colour, fmt in [("bt709", "nv12:bt709"), ("bt601-full", "nv12:bt601-full")]:
            cam = children.spawn([c_producer, stream, "320", "240", "--fps", "30", "--format", "nv12",
                                  "--colorimetry", colour, "--frames", "20", "--socket", proc.ingress])
            assert read_line(cam) == "CONNECTED accepted=1"
            served = []
            while len(served) < 5:
                rec = reader.read(10.0)
                assert rec is not None, f"{colour}: no result"
                served.append(rec.status)
            assert served == [0] * 5, served
            assert cam.wait(30) == 0
            assert f"attached (320x240 {fmt})" in log.read_text()  # the daemon's own reading of the ring
    finally:
        reader.close()
    assert stop_daemon(proc) == 0
