"""optuna-examples' pytorch_simple.py, ported: the same objective, trained as fused arrays.

The original (https://github.com/optuna/optuna-examples, pytorch/pytorch_simple.py) samples
an MLP of 1-3 layers of 4-128 units with dropout 0.2-0.5 each, an optimizer among Adam,
RMSprop and SGD and a log-uniform learning rate, and trains on FashionMNIST. The port:

- `define_model(trial)` is unchanged except that it returns a function making the model
  (`functools.partial`), so the search can build it under each trial's seed;
- `objective(trial)` becomes `build(trial)`, which returns a `hfta_nas.Candidate` instead of
  training: the search trains the candidates, packed into arrays;
- the data is `digits` (8x8 images, shipped with scikit-learn: nothing is downloaded);
- `LogSoftmax` + `F.nll_loss` is the default cross-entropy on the logits (the same loss).

    python examples/ports/optuna_pytorch_simple.py          # 32 trials of 10 epochs
    python examples/ports/optuna_pytorch_simple.py --tiny   # 6 trials of 1 epoch (what CI runs)

Trials of different optimizers never share an array (the dry run says so): a study per
optimizer fuses more.
"""

from __future__ import annotations

import argparse
import functools

import optuna
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset

CLASSES = 10
IN_FEATURES = 8 * 8


def make_mlp(units: list[int], dropouts: list[float]) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    in_features = IN_FEATURES
    for out_features, p in zip(units, dropouts):
        layers += [nn.Linear(in_features, out_features), nn.ReLU(), nn.Dropout(p)]
        in_features = out_features
    layers.append(nn.Linear(in_features, CLASSES))
    return nn.Sequential(*layers)


def define_model(trial: optuna.Trial):
    n_layers = trial.suggest_int("n_layers", 1, 3)
    units = [trial.suggest_int(f"n_units_l{i}", 4, 128) for i in range(n_layers)]
    dropouts = [trial.suggest_float(f"dropout_l{i}", 0.2, 0.5) for i in range(n_layers)]
    return functools.partial(make_mlp, units, dropouts)


def make_build(epochs: int):
    def build(trial: optuna.Trial) -> hfta_nas.Candidate:
        model = define_model(trial)
        optimizer = trial.suggest_categorical("optimizer", ["adam", "rmsprop", "sgd"])
        lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        return hfta_nas.Candidate(model=model, optimizer=optimizer, hparams={"lr": lr}, epochs=epochs, batch_size=128)

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
