#!/usr/bin/env python3
"""render-terminal.py: a terminal recording (raw bytes, as
scripts/gpu/pty_capture.py saves them) drawn as the screen it left, to PNG.

  scripts/render-terminal.py COLS ROWS IN.bin OUT.png

The bytes are played through pyte (a VT100/xterm emulator) and the final
screen is drawn cell by cell in DejaVu Sans Mono with its colours and bold.
Installs pyte and Pillow from PyPI into target/render-venv when missing and
needs the DejaVu fonts (Debian: fonts-dejavu-core).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "render-venv")
FONT_DIR = "/usr/share/fonts/truetype/dejavu"

# xterm's 16 colours, pyte's names for them.
PALETTE = {
    "black": (0, 0, 0),
    "red": (205, 49, 49),
    "green": (13, 188, 121),
    "brown": (229, 229, 16),
    "blue": (36, 114, 200),
    "magenta": (188, 63, 188),
    "cyan": (17, 168, 205),
    "white": (229, 229, 229),
    "brightblack": (102, 102, 102),
    "brightred": (241, 76, 76),
    "brightgreen": (35, 209, 139),
    "brightbrown": (245, 245, 67),
    "brightblue": (59, 142, 234),
    "brightmagenta": (214, 112, 214),
    "brightcyan": (41, 184, 219),
    "brightwhite": (255, 255, 255),
}
FG = (220, 220, 220)
BG = (24, 24, 28)


def ensure_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "pyte==0.8.2", "pillow"], check=True)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def colour(name, default, bold=False):
    if name == "default":
        return default
    if bold and name in PALETTE and not name.startswith("bright"):
        return PALETTE["bright" + name]
    if name in PALETTE:
        return PALETTE[name]
    if len(name) == 6:  # pyte gives 256-colour and true colour as hex
        return tuple(int(name[i : i + 2], 16) for i in (0, 2, 4))
    return default


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    ensure_venv()
    import pyte
    from PIL import Image, ImageDraw, ImageFont

    cols, rows, src, dst = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    with open(src, "rb") as f:
        stream.feed(f.read())

    size = 16
    regular = ImageFont.truetype(os.path.join(FONT_DIR, "DejaVuSansMono.ttf"), size)
    bold = ImageFont.truetype(os.path.join(FONT_DIR, "DejaVuSansMono-Bold.ttf"), size)
    cw = round(regular.getlength("M"))
    ch = round(size * 1.25)
    pad = 12
    img = Image.new("RGB", (cols * cw + 2 * pad, rows * ch + 2 * pad), BG)
    draw = ImageDraw.Draw(img)
    for y in range(rows):
        line = screen.buffer[y]
        for x in range(cols):
            c = line[x]
            fg = colour(c.fg, FG, c.bold)
            bg = colour(c.bg, BG)
            if c.reverse:
                fg, bg = bg, fg
            left, top = pad + x * cw, pad + y * ch
            if bg != BG:
                draw.rectangle([left, top, left + cw - 1, top + ch - 1], fill=bg)
            if c.data.strip():
                # Block elements fill their cell exactly, not as the font draws them.
                if c.data == "█":
                    draw.rectangle([left, top + 2, left + cw - 1, top + ch - 3], fill=fg)
                    continue
                draw.text((left, top + 1), c.data, font=bold if c.bold else regular, fill=fg)
    img.save(dst)
    print(f"render-terminal: {cols}x{rows} screen from {src} drawn to {dst} ({img.width}x{img.height})")


if __name__ == "__main__":
    main()
