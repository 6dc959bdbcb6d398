"""An Optuna LSTM objective written the usual way, ported: a sequence classifier whose forward
makes its initial states with `.to(DEVICE)` and whose init finds its LSTM with `isinstance`.

Both habits work in an array unchanged: the search sizes each candidate with one forward on
shapes only (the meta device), and where that cannot run a fixed-device forward it counts on a
CPU copy; the array's LSTM stand-in is an `nn.LSTM`. The sequences are MNIST-1D's 40 steps
of one feature (generated offline).

    python examples/ports/optuna_pytorch_lstm.py          # 24 trials of 8 epochs
    python examples/ports/optuna_pytorch_lstm.py --tiny   # 4 trials of 1 epoch (what CI runs)
"""

from __future__ import annotations

import argparse
import functools

import optuna
import torch
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset

DEVICE = torch.device("cpu")  # as the original objective sets it at the top of the file


class LSTMClassifier(nn.Module):
    def __init__(self, hidden: int, layers: int, classes: int = 10) -> None:
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.lstm = nn.LSTM(1, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, classes)
        for module in self.modules():  # orthogonal recurrent weights, found by class
            if isinstance(module, nn.LSTM):
                for name, weight in module.named_parameters():
                    if name.startswith("weight_hh"):
                        nn.init.orthogonal_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)  # [N, 1, 40] -> [N, 40 steps, 1 feature]
        h0 = torch.zeros(self.layers, x.size(0), self.hidden).to(DEVICE)
        c0 = torch.zeros(self.layers, x.size(0), self.hidden).to(DEVICE)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1])


def make_build(epochs: int):
    def build(trial: optuna.Trial) -> hfta_nas.Candidate:
        hidden = trial.suggest_categorical("hidden", [16, 32, 64])
        layers = trial.suggest_int("layers", 1, 2)
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return hfta_nas.Candidate(
            model=functools.partial(LSTMClassifier, hidden, layers),
            optimizer="adam",
            hparams={"lr": lr, "clip_norm": 1.0},
            epochs=epochs,
            batch_size=64,
        )

    return build


def main(argv: list[str] | None = None) -> optuna.Study:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="4 trials of 1 epoch on 300 samples")
    args = parser.parse_args(argv)
    n_trials, epochs, samples = (4, 1, 300) if args.tiny else (24, 8, 4000)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    data = load_dataset("mnist1d", num_samples=samples)
    hfta_nas.optimize(study, make_build(epochs), data, n_trials=n_trials, metrics=["val_acc"])
    print(f"best val_acc {study.best_value:.3f} with {study.best_params}")
    return study


if __name__ == "__main__":
    main()
