"""A small ImageNet-style folder of procedurally drawn shapes, for the micro config and the tests.

Each class is a shape (circle, square, triangle, ...) drawn at a random position, size and colour over a noisy
background, so a small Swin learns it in a minute on a CPU, and the real ImageFolder code path is exercised.
The folder is written once under a temporary name and renamed into place, so an interrupted generation never
leaves a half-written dataset behind.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

__all__ = ["SHAPES", "ensure_generated_folder"]

SHAPES = ["circle", "square", "triangle", "cross", "ring", "hstripes", "vstripes", "checker", "diamond", "dots"]
_MANIFEST = "swarmd-generated.json"


def ensure_generated_folder(
    root: Path, *, num_classes: int, train_per_class: int, val_per_class: int, image_size: int, seed: int = 0
) -> Path:
    """Return a folder with train/ and val/ splits, generating it if it does not exist yet."""
    if not 2 <= num_classes <= len(SHAPES):
        raise ValueError(f"generated data has 2..{len(SHAPES)} classes, not {num_classes}")
    spec = dict(
        num_classes=num_classes,
        train_per_class=train_per_class,
        val_per_class=val_per_class,
        image_size=image_size,
        seed=seed,
        version=1,
    )
    key = "-".join(f"{v}" for v in spec.values())
    target = root / f"shapes-{key}"
    if (target / _MANIFEST).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".shapes-partial-", dir=root))
    try:
        rng = random.Random(seed)
        for split, per_class in (("train", train_per_class), ("val", val_per_class)):
            for label in range(num_classes):
                class_dir = tmp / split / f"{label:02d}_{SHAPES[label]}"
                class_dir.mkdir(parents=True)
                for index in range(per_class):
                    draw_shape(SHAPES[label], image_size, rng).save(class_dir / f"{index:05d}.png")
        (tmp / _MANIFEST).write_text(json.dumps(spec))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _MANIFEST).is_file():  # not another process that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def draw_shape(shape: str, size: int, rng: random.Random):
    from PIL import Image, ImageDraw

    background = tuple(rng.randint(0, 90) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    pixels = image.load()
    for _ in range(size * size // 6):  # speckle noise so the background is not a giveaway
        x, y = rng.randrange(size), rng.randrange(size)
        pixels[x, y] = tuple(min(255, c + rng.randint(0, 80)) for c in background)
    draw = ImageDraw.Draw(image)
    color = tuple(rng.randint(130, 255) for _ in range(3))
    r = rng.uniform(0.22, 0.4) * size
    cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=color)
    elif shape == "square":
        draw.rectangle(box, fill=color)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
    elif shape == "cross":
        w = r / 3
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=color)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=color)
    elif shape == "ring":
        draw.ellipse(box, outline=color, width=max(2, int(r / 3)))
    elif shape in ("hstripes", "vstripes"):
        step = max(3, int(r / 2))
        for offset in range(int(-r), int(r), step * 2):
            if shape == "hstripes":
                draw.rectangle((cx - r, cy + offset, cx + r, cy + offset + step - 1), fill=color)
            else:
                draw.rectangle((cx + offset, cy - r, cx + offset + step - 1, cy + r), fill=color)
    elif shape == "checker":
        cell = max(2, int(r / 2))
        for i, x in enumerate(range(int(cx - r), int(cx + r), cell)):
            for j, y in enumerate(range(int(cy - r), int(cy + r), cell)):
                if (i + j) % 2 == 0:
                    draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=color)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=color)
    elif shape == "dots":
        dot = max(1.0, r / 5)
        for k in range(5):
            angle = 2 * math.pi * k / 5 + rng.uniform(0, 0.5)
            x, y = cx + 0.7 * r * math.cos(angle), cy + 0.7 * r * math.sin(angle)
            draw.ellipse((x - dot, y - dot, x + dot, y + dot), fill=color)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return image
