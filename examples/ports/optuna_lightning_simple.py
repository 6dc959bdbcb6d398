"""optuna-examples' pytorch_lightning_simple.py, ported: a LightningModule's parts as a Candidate.

The original (https://github.com/optuna/optuna-examples, pytorch/pytorch_lightning_simple.py)
suggests the number of layers, a dropout and each layer's width, wraps the network in a
LightningModule and trains it with a Trainer and a pruning callback. In the port each part of
the LightningModule has its place, and Lightning itself is not needed:

| LightningModule / Trainer           | here                                              |
|-------------------------------------|---------------------------------------------------|
| `__init__` building the network     | `Candidate(model=...)`: a function making it      |
| `training_step` (cross-entropy)     | the default loss                                  |
| `validation_step` logging val_acc   | `metrics=["val_acc"]`, reported every epoch       |
| `configure_optimizers` (Adam)       | `Candidate(optimizer="adam", hparams={"lr": ...})`|
| `Trainer(max_epochs=...)`           | `Candidate(epochs=...)`                           |
| `PyTorchLightningPruningCallback`   | the study's pruner, at each reported epoch        |

    python examples/ports/optuna_lightning_simple.py          # 32 trials of 10 epochs, median pruning
    python examples/ports/optuna_lightning_simple.py --tiny   # 6 trials of 2 epochs (what CI runs)
"""

from __future__ import annotations

import argparse
import functools

import optuna
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset


class Net(nn.Module):
    """The original's network: Linear + ReLU + Dropout blocks of the suggested widths."""

    def __init__(self, dropout: float, output_dims: list[int], in_features: int = 64, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for width in output_dims:
            layers += [nn.Linear(in_features, width), nn.ReLU(), nn.Dropout(dropout)]
            in_features = width
        layers.append(nn.Linear(in_features, classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


def make_build(epochs: int):
    def build(trial: optuna.Trial) -> hfta_nas.Candidate:
        n_layers = trial.suggest_int("n_layers", 1, 3)
        dropout = trial.suggest_float("dropout", 0.2, 0.5)
        output_dims = [trial.suggest_int(f"n_units_l{i}", 4, 128, log=True) for i in range(n_layers)]
        return hfta_nas.Candidate(
            model=functools.partial(Net, dropout, output_dims), optimizer="adam", hparams={"lr": 1e-3}, epochs=epochs
        )

    return build


def main(argv: list[str] | None = None) -> optuna.Study:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="6 trials of 2 epochs")
    args = parser.parse_args(argv)
    n_trials, epochs = (6, 2) if args.tiny else (32, 10)
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=0), pruner=optuna.pruners.MedianPruner()
    )
    hfta_nas.optimize(study, make_build(epochs), load_dataset("digits"), n_trials=n_trials, metrics=["val_acc"])
    print(f"best val_acc {study.best_value:.3f} with {study.best_params}")
    return study


if __name__ == "__main__":
    main()
