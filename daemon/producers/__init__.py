"""Reference camera producers: synthetic frames with known content, and ffmpeg."""
