"""The user's own CNN for 3 x 32 x 32 images: hfta-nas calls
build_cnn(width=..., input_shape=(3, 32, 32), num_classes=10) under each trial's seed."""

from torch import nn


def build_cnn(width: int = 32, dropout: float = 0.0, input_shape=(3, 32, 32), num_classes: int = 10) -> nn.Module:
    channels = input_shape[0]

    def block(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(), nn.MaxPool2d(2)
        )

    return nn.Sequential(
        block(channels, width),
        block(width, 2 * width),
        block(2 * width, 2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * width, num_classes),
    )
