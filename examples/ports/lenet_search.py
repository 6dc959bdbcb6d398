"""A LeNet-5 search: the classic convolutional network's widths, kernel, activation and
learning rate, on the 8x8 `digits` images (shipped with scikit-learn).

LeNet-5 (LeCun et al. 1998) is two convolution + pooling stages and three linear layers;
at 8x8 the first convolution pads by half its kernel so that two 2x2 poolings fit. Every
searched size changes the model's shapes, so the search packs candidates of different sizes
into arrays by their measured cost (padding the smaller ones where that pays).

    python examples/ports/lenet_search.py          # 32 trials of 10 epochs
    python examples/ports/lenet_search.py --tiny   # 6 trials of 1 epoch (what CI runs)
"""

from __future__ import annotations

import argparse
import functools

import optuna
import torch
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class LeNet5(nn.Module):
    def __init__(self, c1: int, c2: int, kernel: int, hidden: int, activation: str, classes: int = 10) -> None:
        super().__init__()
        act = ACTIVATIONS[activation]
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, kernel, padding=kernel // 2), act(), nn.AvgPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(c1, c2, 3, padding=1), act(), nn.AvgPool2d(2),  # 4x4 -> 2x2
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * 2 * 2, hidden), act(), nn.Linear(hidden, hidden // 2), act(),
            nn.Linear(hidden // 2, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_build(epochs: int):
    def build(trial: optuna.Trial) -> hfta_nas.Candidate:
        c1 = trial.suggest_categorical("c1", [6, 12])
        c2 = trial.suggest_categorical("c2", [16, 32])
        kernel = trial.suggest_categorical("kernel", [3, 5])
        hidden = trial.suggest_categorical("hidden", [64, 120])
        activation = trial.suggest_categorical("activation", ["tanh", "relu"])
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return hfta_nas.Candidate(
            model=functools.partial(LeNet5, c1, c2, kernel, hidden, activation),
            optimizer="adam",
            hparams={"lr": lr},
            epochs=epochs,
            batch_size=64,
        )

    return build


def main(argv: list[str] | None = None) -> optuna.Study:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="6 trials of 1 epoch")
    args = parser.parse_args(argv)
    n_trials, epochs = (6, 1) if args.tiny else (32, 10)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    hfta_nas.optimize(study, make_build(epochs), load_dataset("digits"), n_trials=n_trials, metrics=["val_acc"])
    print(f"best val_acc {study.best_value:.3f} with {study.best_params}")
    return study


if __name__ == "__main__":
    main()
