"""Cameras: camera services (`edgeinferctl camera`), frame sources, and the reference producers: synthetic
frames with known content, ffmpeg, and the PyAV decoder."""
