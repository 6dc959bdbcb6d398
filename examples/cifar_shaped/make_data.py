"""Write a CIFAR-shaped dataset (3 x 32 x 32 images, 10 classes) to an .npz file, offline.

The images are synthetic but not trivial: each class is a smooth colour
pattern of its own, and every image is its class pattern shifted by up to 4
pixels, mirrored half the time, with its colours jittered and noise added,
so shifts and flips are the invariances augmentation teaches.

    python examples/cifar_shaped/make_data.py                 # 4000 images -> examples/cifar_shaped/cifar_like.npz
    python examples/cifar_shaped/make_data.py --samples 300 --out /tmp/tiny.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CLASSES, SIZE, SHIFT = 10, 32, 4


def class_patterns(rng: np.random.Generator) -> np.ndarray:
    """[10, 3, 32 + 2 SHIFT, 32 + 2 SHIFT]: a colour grid shared by all classes plus a fainter one of
    each class's own, smoothly upsampled (classes differ by a fraction of the image: not trivial)."""
    coarse = 0.5 + 0.25 * rng.uniform(-1, 1, size=(1, 3, 6, 6)) + 0.25 * rng.uniform(-1, 1, size=(CLASSES, 3, 6, 6))
    side = SIZE + 2 * SHIFT
    grid = np.linspace(0, 5, side)
    low, frac = np.floor(grid).astype(int).clip(0, 4), grid - np.floor(grid).clip(0, 4)
    rows = coarse[:, :, low, :] * (1 - frac)[None, None, :, None] + coarse[:, :, low + 1, :] * frac[None, None, :, None]
    return rows[:, :, :, low] * (1 - frac) + rows[:, :, :, low + 1] * frac


def make(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    patterns = class_patterns(rng)
    y = rng.integers(0, CLASSES, samples)
    x = np.empty((samples, 3, SIZE, SIZE), dtype=np.float32)
    for i, label in enumerate(y):
        dy, dx = rng.integers(0, 2 * SHIFT + 1, size=2)
        image = patterns[label, :, dy : dy + SIZE, dx : dx + SIZE]
        if rng.random() < 0.5:
            image = image[:, :, ::-1]
        image = image * rng.uniform(0.6, 1.4, size=(3, 1, 1)) + rng.normal(0, 0.35, size=image.shape)
        x[i] = image.clip(0, 1)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "cifar_like.npz")
    args = parser.parse_args()
    x, y = make(args.samples, args.seed)
    np.savez_compressed(args.out, x=x, y=y)
    print(f"wrote {args.out}: x {x.shape}, y {y.shape} ({CLASSES} classes)")


if __name__ == "__main__":
    main()
