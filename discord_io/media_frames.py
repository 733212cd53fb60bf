"""Image checks and keyframe extraction with Pillow, bounded against decompression bombs.

The declared content type of a download is not trusted: the bytes are opened to learn what
they really are. Decoding is CPU work, so callers run these functions in a thread.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 16 * 1024 * 1024
MAX_TOTAL_PIXELS = 256 * 1024 * 1024  # all frames a seek may have to decode
MAX_FRAMES = 5000
"""A GIF declares no frame count: frames are found by walking them, and reaching a keyframe
decodes every frame before it, so the work grows with the count even when the frames are
tiny (a 9 MB file holds 600,000 one-pixel frames: 8 s of CPU in a thread nothing can stop)."""
DEFAULT_MAX_SIDE = 512

STILL_MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
ANIMATED_FORMATS = frozenset({"GIF", "WEBP", "PNG"})


class MediaError(ValueError):
    """Bytes that are not a usable image; the message is safe to show the model."""


_DAMAGED = (OSError, ValueError, EOFError, IndexError, SyntaxError, struct.error)
"""What Pillow raises on broken files: besides OSError, a GIF cut short fails its frame walk
with IndexError or struct.error, a PNG with a broken chunk with SyntaxError, a bad header
with ValueError."""


@dataclass(frozen=True, slots=True)
class Keyframes:
    frames: list[bytes]  # PNG
    total_frames: int
    source_format: str


def _open(data: bytes) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError) as exc:
        raise MediaError("the file is not an image") from exc
    except Image.DecompressionBombError as exc:
        raise MediaError("the image is too large") from exc
    except _DAMAGED as exc:
        raise MediaError("the image is damaged") from exc
    if image.width * image.height > MAX_PIXELS:
        raise MediaError("the image is too large")
    return image


def image_mime(data: bytes) -> str:
    """The MIME type of a still image Pillow can fully decode, else `MediaError`."""
    image = _open(data)
    mime = STILL_MIMES.get(image.format or "")
    if mime is None:
        raise MediaError(f"unsupported image format {image.format or 'unknown'}")
    try:
        image.load()
    except _DAMAGED as exc:
        raise MediaError("the image is damaged") from exc
    return mime


def _evenly(total: int, count: int) -> list[int]:
    if total <= count:
        return list(range(total))
    return (
        sorted({round(i * (total - 1) / (count - 1)) for i in range(count)}) if count > 1 else [0]
    )


def _frame_count(image: Image.Image) -> int:
    """The number of frames, counted up to `MAX_FRAMES + 1` at most (Pillow's `n_frames`
    walks every frame of a GIF, however many there are)."""
    if image.format != "GIF":
        return int(getattr(image, "n_frames", 1))
    count = 1
    try:
        while count <= MAX_FRAMES:
            image.seek(count)
            count += 1
    except EOFError:
        pass
    image.seek(0)
    return count


def keyframes(data: bytes, *, count: int = 4, max_side: int = DEFAULT_MAX_SIDE) -> Keyframes:
    """Up to `count` frames spread over an animation, as PNGs no larger than `max_side`."""
    image = _open(data)
    frames: list[bytes] = []
    try:
        animated = image.format in ANIMATED_FORMATS and bool(getattr(image, "is_animated", False))
        if image.format != "GIF" and not animated:
            raise MediaError(f"not a GIF or animation (got {image.format or 'unknown'})")
        total = _frame_count(image)
        if total > MAX_FRAMES:
            raise MediaError(f"the animation has more than {MAX_FRAMES} frames")
        if total * image.width * image.height > MAX_TOTAL_PIXELS:
            raise MediaError("the animation is too large")
        for index in _evenly(total, max(1, count)):
            image.seek(index)
            frame = image.convert("RGBA")
            frame.thumbnail((max_side, max_side))
            out = io.BytesIO()
            frame.save(out, format="PNG")
            frames.append(out.getvalue())
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaError("the animation is too large") from exc
    except _DAMAGED as exc:
        raise MediaError("the animation is damaged") from exc
    return Keyframes(frames=frames, total_frames=total, source_format=image.format or "")
