"""A search written the way Optuna users write one: `trial.suggest_*` inside a function
that returns what to train. Here the model is the user's own class.

    python examples/define_by_run.py           # 16 trials of 5 epochs on MNIST-1D, arrays of 8
    python examples/define_by_run.py --tiny    # 4 trials of 1 epoch on 1,000 samples (what CI runs)

Every trial's architecture is the sampler's choice; the search packs the
candidates into arrays by their measured cost on this device and trains them.
"""

from __future__ import annotations

import argparse
import functools

import optuna
import torch
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset


class SmallCNN(nn.Module):
    """Two convolutions, global average pooling and a linear head: sizes are the arguments."""

    def __init__(self, channels: int, kernel_size: int, hidden: int, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, channels, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=-1))


def make_build(epochs: int):
    def build(trial: optuna.Trial) -> hfta_nas.Candidate:
        channels = trial.suggest_categorical("channels", [8, 16, 32])
        kernel_size = trial.suggest_int("kernel_size", 3, 7, step=2)
        hidden = trial.suggest_categorical("hidden", [32, 64])
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return hfta_nas.Candidate(
            model=functools.partial(SmallCNN, channels, kernel_size, hidden),
            optimizer="adam",
            hparams={"lr": lr},
            schedule={"kind": "cosine"},
            epochs=epochs,
        )

    return build


def main(argv: list[str] | None = None) -> hfta_nas.SearchSummary:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="4 trials, 1 epoch, 1,000 samples")
    args = parser.parse_args(argv)
    n_trials, epochs, samples = (4, 1, 1000) if args.tiny else (16, 5, 4000)
    data = load_dataset("mnist1d", num_samples=samples)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True))
    summary = hfta_nas.optimize(study, make_build(epochs), data, n_trials=n_trials, array_size=8, metrics=["val_acc"])
    for array in summary.arrays:
        print(
            f"array {array['array']}: trials {array['trials']}, {array['architectures']} architecture(s), "
            f"{array['waste']:.0%} padding, {array['seconds']:.1f} s"
        )
    print(
        f"best val_acc {study.best_value:.3f} with {study.best_params}; "
        f"{summary.architectures_trained} of {summary.architectures_proposed} proposed architectures trained"
    )
    return summary


if __name__ == "__main__":
    main()
