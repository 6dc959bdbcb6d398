"""The HFTA paper's model families at small input size, for the throughput benchmark.

Written out here (no torchvision needed) at the sizes the paper trains them:
ResNet-18 for 3x32x32 images (the CIFAR variant: a 3x3 stem, no max-pool),
PointNet's classifier over point clouds, DCGAN's discriminator (as a 10-class
classifier, so every workload trains with cross-entropy), and a small
TransformerEncoder over token ids. Each builder takes `input_shape` and
`num_classes` as the families of `hfta_nas.models` do.
"""

from __future__ import annotations

from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(out)) + self.shortcut(x)).relu()


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64, channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, inputs = [], width
        for stage, stride in enumerate((1, 2, 2, 2)):
            outputs = width * 2**stage
            layers += [BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)]
            inputs = outputs
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(inputs, num_classes)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)).mean(dim=(2, 3)))


def resnet18(input_shape=(3, 32, 32), num_classes: int = 10, width: int = 64) -> nn.Module:
    return ResNet18(num_classes, width, input_shape[0])


def pointnet(input_shape=(3, 256), num_classes: int = 10) -> nn.Module:
    """PointNet's classifier without the input transforms: a shared MLP per point, max over points.
    Without its dropout: the benchmark checks every method's first-step loss against a plain model's,
    and the vmap recipe cannot batch random ops."""
    return nn.Sequential(
        nn.Conv1d(input_shape[0], 64, 1),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Conv1d(64, 128, 1),
        nn.BatchNorm1d(128),
        nn.ReLU(),
        nn.Conv1d(128, 1024, 1),
        nn.BatchNorm1d(1024),
        nn.ReLU(),
        nn.AdaptiveMaxPool1d(1),
        nn.Flatten(),
        nn.Linear(1024, 512),
        nn.BatchNorm1d(512),
        nn.ReLU(),
        nn.Linear(512, 256),
        nn.BatchNorm1d(256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


def dcgan_discriminator(input_shape=(3, 32, 32), num_classes: int = 10, width: int = 64) -> nn.Module:
    """DCGAN's discriminator for 32x32 images (strided 4x4 convs, BatchNorm, LeakyReLU)."""
    return nn.Sequential(
        nn.Conv2d(input_shape[0], width, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2),
        nn.Conv2d(width, 2 * width, 4, 2, 1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.LeakyReLU(0.2),
        nn.Conv2d(2 * width, 4 * width, 4, 2, 1, bias=False),
        nn.BatchNorm2d(4 * width),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        nn.Linear(4 * width * 4 * 4, num_classes),
    )


class TokenClassifier(nn.Module):
    def __init__(self, vocabulary: int, num_classes: int, width: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        # dropout 0: attention dropout inside the fused kernel cannot be drawn per slot (the array refuses it)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def transformer(input_shape=(64,), num_classes: int = 10, vocabulary: int = 1000) -> nn.Module:
    return TokenClassifier(vocabulary, num_classes)


BUILDERS = {"resnet18": resnet18, "pointnet": pointnet, "dcgan": dcgan_discriminator, "transformer": transformer}
