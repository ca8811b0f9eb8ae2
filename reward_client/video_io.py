"""Writing episode frames as MP4 (for `video_path` on a shared filesystem, or inline `video_b64`).

Needs PyAV (`pip install av`); the rest of the client does not.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import numpy as np

from reward_protocol.frames import as_uint8


def _even(n: int) -> int:
    return n + (n % 2)


def encode_mp4(frames: np.ndarray | Sequence[np.ndarray], fps: float = 10.0, crf: int = 18) -> bytes:
    """H.264 MP4 bytes of RGB frames [T, H, W, 3] (odd sizes are padded by one pixel): uint8, or
    float in [0, 1] as round(x * 255) (reward_protocol.frames.as_uint8); other dtypes are refused."""
    import av

    frames = [as_uint8(f) for f in frames]
    if not frames:
        raise ValueError("cannot encode a video with no frames")
    h, w = frames[0].shape[:2]
    H, W = _even(h), _even(w)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=round(fps))
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        for frame in frames:
            if (H, W) != frame.shape[:2]:
                frame = np.pad(frame, ((0, H - h), (0, W - w), (0, 0)), mode="edge")
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def write_mp4(frames: np.ndarray | Sequence[np.ndarray], path: str | os.PathLike, fps: float = 10.0) -> str:
    """Write frames to path atomically (a reader never sees a half-written file); returns the path."""
    data = encode_mp4(frames, fps=fps)
    tmp = f"{os.fspath(path)}.part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return os.fspath(path)
