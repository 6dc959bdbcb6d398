"""A user model factory: any nn.Module works, the array never edits it.

Used by `search_spaces/mnist1d_user_factory.yaml` (model.factory:
"examples/custom_model.py:build_model") and by `train_custom_model.py`.
hfta-nas calls it as build_model(**config, input_shape=..., num_classes=...).
"""

from torch import nn


class SignalNet(nn.Module):
    """A small residual 1-D CNN for MNIST-1D-like signals [N, C, L]."""

    def __init__(self, width: int, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, length = input_shape
        self.stem = nn.Conv1d(channels, width, kernel_size=5, padding=2)
        self.block = nn.Sequential(
            nn.Conv1d(width, width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size=3, padding=1),
        )
        self.head = nn.Linear(width * (length // 2), num_classes)

    def forward(self, x):
        x = self.stem(x).relu()
        x = (x + self.block(x)).relu()
        x = nn.functional.max_pool1d(x, 2)
        return self.head(x.flatten(1))


def build_model(width: int = 32, input_shape=(1, 40), num_classes: int = 10) -> nn.Module:
    return SignalNet(width, tuple(input_shape), num_classes)
