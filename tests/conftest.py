"""Shared fixtures: a tiny deterministic dataset so engine tests stay fast."""

import pytest
import torch

from hfta_nas.data import Dataset


def synthetic_dataset(n_train=60, n_eval=20, shape=(2, 12), classes=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def part(n):
        return torch.randn(n, *shape, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)

    (xt, yt), (xv, yv), (xs, ys) = part(n_train), part(n_eval), part(n_eval)
    return Dataset("synthetic", xt, yt, xv, yv, xs, ys, classes)


@pytest.fixture
def tiny_data():
    return synthetic_dataset()
