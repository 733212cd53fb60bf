"""Image checks and keyframe extraction with Pillow, bounded against decompression bombs.

The declared content type of a download is not trusted: the bytes are opened to learn what
they really are. Decoding is CPU work, so callers run these functions in a thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 16 * 1024 * 1024
MAX_TOTAL_PIXELS = 256 * 1024 * 1024  # all frames a seek may have to decode
DEFAULT_MAX_SIDE = 512

STILL_MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
ANIMATED_FORMATS = frozenset({"GIF", "WEBP", "PNG"})


class MediaError(ValueError):
    """Bytes that are not a usable image; the message is safe to show the model."""


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
    except (OSError, ValueError) as exc:
        raise MediaError("the image is damaged") from exc
    return mime


def _evenly(total: int, count: int) -> list[int]:
    if total <= count:
        return list(range(total))
    return (
        sorted({round(i * (total - 1) / (count - 1)) for i in range(count)}) if count > 1 else [0]
    )


def keyframes(data: bytes, *, count: int = 4, max_side: int = DEFAULT_MAX_SIDE) -> Keyframes:
    """Up to `count` frames spread over an animation, as PNGs no larger than `max_side`."""
    image = _open(data)
    animated = image.format in ANIMATED_FORMATS and bool(getattr(image, "is_animated", False))
    if image.format != "GIF" and not animated:
        raise MediaError(f"not a GIF or animation (got {image.format or 'unknown'})")
    total = int(getattr(image, "n_frames", 1))
    if total * image.width * image.height > MAX_TOTAL_PIXELS:
        raise MediaError("the animation is too large")
    frames: list[bytes] = []
    try:
        for index in _evenly(total, max(1, count)):
            image.seek(index)
            frame = image.convert("RGBA")
            frame.thumbnail((max_side, max_side))
            out = io.BytesIO()
            frame.save(out, format="PNG")
            frames.append(out.getvalue())
    except (OSError, ValueError, EOFError) as exc:
        raise MediaError("the animation is damaged") from exc
    return Keyframes(frames=frames, total_frames=total, source_format=image.format or "")
