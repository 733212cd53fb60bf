"""Pillow-made media for the enrichment tests."""

from __future__ import annotations

import io

from PIL import Image


def make_png(size: tuple[int, int] = (96, 96), colour: str = "teal") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def make_gif(frames: int = 10, size: tuple[int, int] = (64, 48)) -> bytes:
    images = [
        Image.new("RGB", size, (n * 25 % 256, 255 - n * 25 % 256, 128)) for n in range(frames)
    ]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=80, loop=0)
    return out.getvalue()
