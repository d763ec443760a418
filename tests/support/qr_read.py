"""Reading the QR codes the daemon draws back, as a phone's camera would: the terminal's
half-block lines turned back into modules, and any grey image decoded by zxing-cpp, a
reader independent of segno (the encoder the daemon uses)."""

from __future__ import annotations

import re

import zxingcpp

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BITS = {"█": (True, True), "▀": (True, False), "▄": (False, True), " ": (False, False)}


def modules_from_half_blocks(lines: list[str]) -> list[list[bool]]:
    """Two rows of modules per printed line (colour escapes dropped); fails on any other
    character, or on lines of different widths."""
    rows: list[list[bool]] = []
    plain = [_ANSI.sub("", line) for line in lines]
    assert len({len(p) for p in plain}) == 1, [len(p) for p in plain]
    for line in plain:
        pairs = [_BITS[c] for c in line]
        rows.append([p[0] for p in pairs])
        rows.append([p[1] for p in pairs])
    return rows


def decode_gray(pixels: bytes, width: int, height: int) -> list[str]:
    """Every QR code zxing-cpp finds in a grey image (one byte a pixel, dark = low), read
    only the right way round (dark modules on light: what the daemon promises)."""
    image = memoryview(pixels).cast("B", (height, width))
    found = zxingcpp.read_barcodes(image, formats=zxingcpp.BarcodeFormat.QRCode, try_invert=False)
    return [b.text for b in found]


def decode_modules(rows: list[list[bool]], scale: int = 4) -> list[str]:
    """Modules drawn ``scale`` pixels each (black on white), then decoded."""
    pixels = bytearray()
    for row in rows:
        line = b"".join(b"\x00" * scale if dark else b"\xff" * scale for dark in row)
        pixels += line * scale
    return decode_gray(bytes(pixels), len(rows[0]) * scale, len(rows) * scale)
