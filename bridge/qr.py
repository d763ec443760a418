"""The sign-in link as a QR code (docs/security.md "Pairing a phone"): half-block text for
a terminal (``agent-bridge login-link --qr``, ``serve``'s first lines) and an SVG data URI
for the page (``POST /v1/me/pairing``). segno does the encoding; this module only decides
the symbol's parameters and draws it.

The text form packs two rows of modules into one line of characters (upper half block,
lower half block, full block, space), so a symbol for a 90-character link is about 21
lines tall. Dark modules are the block characters. On a terminal the lines are coloured
black on bright white, so the code reads the same on a dark or a light theme (a phone's
camera needs dark modules on a light field, quiet zone included); piped or with
``NO_COLOR`` set they are plain text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import segno

# The four-module light margin the QR specification asks for: without it a camera may not
# find the finder patterns against a terminal's own background.
QUIET_ZONE = 4
# Error correction "L" (7 %) keeps the symbol smallest; segno raises it for free when the
# version chosen has room to spare. A screen has no smudges, so nothing more is needed.
ERROR = "l"

_HALF_BLOCKS = {(True, True): "█", (True, False): "▀", (False, True): "▄", (False, False): " "}
# Black foreground on bright white background, then back to the terminal's own colours.
_COLOURED = ("\x1b[30;107m", "\x1b[0m")


def modules(text: str) -> list[list[bool]]:
    """The symbol for ``text`` as rows of modules (True: dark), its quiet zone included.
    Always a full QR code (never a Micro QR, which few phone cameras read), byte mode."""
    symbol = segno.make_qr(text, error=ERROR, boost_error=True)
    return [[bool(m) for m in row] for row in symbol.matrix_iter(scale=1, border=QUIET_ZONE)]


def half_block_lines(rows: Sequence[Sequence[bool]], *, colour: bool) -> list[str]:
    """Two rows of modules per line; an odd last row is paired with a light one."""
    lines = []
    for top in range(0, len(rows), 2):
        upper = rows[top]
        lower = rows[top + 1] if top + 1 < len(rows) else [False] * len(upper)
        line = "".join(_HALF_BLOCKS[pair] for pair in zip(upper, lower, strict=True))
        lines.append(f"{_COLOURED[0]}{line}{_COLOURED[1]}" if colour else line)
    return lines


def terminal_lines(text: str, *, colour: bool) -> list[str]:
    """``text`` as a QR code of half-block lines, ready to print."""
    return half_block_lines(modules(text), colour=colour)


def svg_data_uri(text: str) -> str:
    """``text`` as a QR code in an SVG ``data:`` URI (the page's ``img-src`` allows
    ``data:``), 4 px a module: sharp when the page scales it up, nothing to fetch."""
    symbol = segno.make_qr(text, error=ERROR, boost_error=True)
    return str(symbol.svg_data_uri(scale=4, border=QUIET_ZONE, dark="#000", light="#fff"))


def wants_colour(isatty: bool, environ: Iterable[str]) -> bool:
    """Colour escapes only for a terminal, and not when the user opted out (NO_COLOR)."""
    return isatty and "NO_COLOR" not in environ
