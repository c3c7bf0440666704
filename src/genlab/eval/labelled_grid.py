"""Sample pictures with words on them: rows of images, each with a label on its left (the quality-vs-NFE grid,
eval_nfe.png), and several such pictures stacked under titles (a sweep's method x steps grid, nfe_grid.png)."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

PAD = 4
LABEL_W = 140  # at least this wide, so pictures of different runs line up


def labelled_rows(rows: list[tuple[str, np.ndarray]], path, scale: int = 2):
    """rows: (label, uint8 [n, H, W, C]) -> one PNG, a row of n images per label (a 1-pixel white gap)."""
    H, W, C = rows[0][1].shape[1:]
    n = max(len(imgs) for _, imgs in rows)
    strip_w = n * (W + 1) + 1
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_w = max(LABEL_W, max(int(probe.textlength(lab)) for lab, _ in rows) + 2 * PAD)
    row_h = max(H * scale, 12)
    img = Image.new("RGB", (label_w + strip_w * scale, len(rows) * (row_h + 1) + 1), "white")
    draw = ImageDraw.Draw(img)
    for i, (label, imgs) in enumerate(rows):
        strip = np.full((H + 2, strip_w, C), 255, dtype=np.uint8)
        for j, im in enumerate(np.asarray(imgs)):
            strip[1:1 + H, 1 + j * (W + 1):1 + j * (W + 1) + W] = im
        tile = Image.fromarray(strip[1:1 + H, :, 0] if C == 1 else strip[1:1 + H]).convert("RGB")
        y = 1 + i * (row_h + 1)
        img.paste(tile.resize((tile.width * scale, tile.height * scale), Image.NEAREST), (label_w, y))
        draw.text((PAD, y + row_h // 2 - 5), label, fill="black")
    img.save(path)
    return path


def stack_pictures(items: list[tuple[str, object]], path):
    """(title, PNG path) pairs -> one PNG, each picture under its title, left-aligned (the same layout lines up)."""
    pics = [(title, Image.open(p).convert("RGB")) for title, p in items]
    width = max(im.width for _, im in pics)
    title_h = 14
    img = Image.new("RGB", (width, sum(im.height + title_h + PAD for _, im in pics)), "white")
    draw = ImageDraw.Draw(img)
    y = 0
    for title, im in pics:
        draw.text((PAD, y + 2), title, fill="black")
        img.paste(im, (0, y + title_h))
        y += im.height + title_h + PAD
    img.save(path)
    return path
