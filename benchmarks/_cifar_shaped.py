"""CIFAR-shaped images made offline: 3x32x32, 10 classes, learnable, nothing downloaded.

A GPU benchmark needs image-sized inputs (small models on MNIST-1D are launch-bound
in a way real image models are not), and the GPU machine reaches no network. Each
class is a smooth random pattern (8x8 noise blown up to 32x32); a sample is its
class's pattern at half strength, shifted by up to 4 pixels each way, plus unit
noise, so a CNN learns it in a few epochs and different configurations reach
different accuracies (a search has something to find). Deterministic (seed 0).

Used as a data source by name: `dataset: benchmarks._cifar_shaped:images`.
"""

from __future__ import annotations

import numpy as np

CLASSES = 10
SAMPLES = 10_000
QUICK_SAMPLES = 600
SHIFT = 4  # pixels each way


def _make(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    patterns = np.kron(rng.normal(size=(CLASSES, 3, 8, 8)), np.ones((4, 4))).astype(np.float32)
    y = rng.integers(0, CLASSES, size=samples)
    x = 0.5 * patterns[y]
    shifts = rng.integers(-SHIFT, SHIFT + 1, size=(samples, 2))
    for index, (down, right) in enumerate(shifts):
        x[index] = np.roll(x[index], (int(down), int(right)), axis=(1, 2))
    x += rng.normal(size=x.shape).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def images() -> tuple[np.ndarray, np.ndarray]:
    """10,000 samples [3, 32, 32] and their labels."""
    return _make(SAMPLES)


def images_small() -> tuple[np.ndarray, np.ndarray]:
    """600 samples: a quick run's data."""
    return _make(QUICK_SAMPLES)
