"""The same command twice gives bit-identical numbers on CPU.

`hfta-nas search` and `hfta-nas stability` run as two fresh processes side by side
(`--threads 1` each) into two fresh storages, with different PYTHONHASHSEEDs (so
nothing may depend on set or dict order of strings), and every trial's
parameters, intermediate values and values, and every seed's metrics, must be
equal exactly (==, not approx). `hfta_nas.train` twice in one
process must give torch.equal parameters and buffers.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import torch
import yaml

import hfta_nas
from hfta_nas.search import open_storage
from tests._rendezvous import GUARD_S

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
# user attributes that are timings, or name the process / machine that ran the trial
_RUN_SPECIFIC = {"train_seconds", "train_start", "train_end", "heartbeat", "worker", "worker_host", "array_id"}


def run_twice(make_args, tmp_path: Path) -> list[str]:
    """`hfta-nas *make_args(run)` for run "a" and "b", side by side (each --threads 1), with
    PYTHONHASHSEED 1 and 2; returns each one's stdout."""
    script = Path(sys.executable).with_name("hfta-nas")
    command = [sys.executable, str(script)] if script.exists() else [sys.executable, str(ROOT / "cli.py")]
    processes = []
    for run, hash_seed in (("a", "1"), ("b", "2")):
        env = dict(
            os.environ,
            PYTHONHASHSEED=hash_seed,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        )
        with open(tmp_path / f"{run}.out", "wb") as out, open(tmp_path / f"{run}.err", "wb") as err:
            processes.append(subprocess.Popen([*command, *make_args(run)], cwd=ROOT, env=env, stdout=out, stderr=err))
    outputs = []
    for run, process in zip("ab", processes):
        try:
            process.wait(timeout=GUARD_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        out, err = (tmp_path / f"{run}.out").read_text(), (tmp_path / f"{run}.err").read_text()
        assert process.returncode == 0, (out + err)[-3000:]
        outputs.append(out)
    return outputs


def search_space() -> str:
    """Tiny, with a pruner (successive halving prunes a trial here), dropout and two widths."""
    return yaml.safe_dump(
        {
            "study": {"name": "same", "metrics": ["val_acc"]},
            "sampler": {"name": "tpe", "kwargs": {"n_startup_trials": 2}},
            "pruner": {"name": "successive_halving", "kwargs": {"min_resource": 1, "reduction_factor": 2}},
            "budget": {"n_trials": 6},
            "array": {"size": 3, "step_cost": {"fixed_s": 1e-4, "per_gmac_s": 0.1}},  # the packing too, not a timing
            "data": {"dataset": "digits", "batch_size": 64},
            "training": {"epochs": 3, "optimizer": {"name": "adam", "lr": 1e-3}},
            "model": {"family": "mlp", "config": {"depth": 1, "dropout": 0.2}},
            "seed": 11,
            "params": {
                "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
                "model.config.width": {"distribution": "categorical", "values": [16, 32]},
            },
        }
    )


def _trials(journal: Path) -> list[tuple]:
    study = optuna.load_study(study_name="same", storage=open_storage(str(journal))[0])
    return [
        (
            t.number,
            t.state.name,
            t.params,
            t.intermediate_values,
            t.values,
            {k: v for k, v in t.user_attrs.items() if k not in _RUN_SPECIFIC},
        )
        for t in study.get_trials(deepcopy=False)
    ]


def test_search_twice_gives_identical_trials(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(search_space())
    run_twice(
        lambda run: [
            "search",
            str(space),
            "--threads",
            "1",
            "--storage",
            str(tmp_path / f"{run}.journal"),
            "--out",
            str(tmp_path / run),
            "--quiet",
            "--json",
        ],
        tmp_path,
    )
    first, second = (_trials(tmp_path / f"{run}.journal") for run in "ab")
    assert len(first) >= 6 and any(t[3] for t in first)
    assert first == second  # params, intermediate values, values, seeds, slots, epochs: all exactly equal
    assert (tmp_path / "a" / "best_config.yaml").read_text() == (tmp_path / "b" / "best_config.yaml").read_text()
    weights = [torch.load(tmp_path / run / "best_weights.pt") for run in ("a", "b")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


STABILITY_CONFIG = """\
model: mlp
model_config: {width: 16, depth: 1, dropout: 0.2}
dataset: digits
optimizer: adam
hparams: {lr: 0.01}
epochs: 3
data: {batch_size: 32}
"""


def test_stability_twice_gives_identical_per_seed_metrics(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(STABILITY_CONFIG)
    texts = run_twice(
        lambda run: [
            "stability",
            str(config),
            "--seeds",
            "4",
            "--threads",
            "1",
            "--storage",
            str(tmp_path / f"{run}.journal"),
            "--out",
            str(tmp_path / run),
            "--format",
            "csv,json",
            "--plot-format",
            "svg",
            "--json",
        ],
        tmp_path,
    )
    summaries = [json.loads(text[text.index("{") :]) for text in texts]
    seed_rows, curves = [], []
    for run in "ab":
        with open(tmp_path / run / "seeds.csv", newline="") as stream:
            seed_rows.append(list(csv.DictReader(stream)))
        curves.append((tmp_path / run / "per_epoch.csv").read_text())
    assert len(seed_rows[0]) == 4 and {row["status"] for row in seed_rows[0]} == {"completed"}
    assert len({row["test_acc"] + row["train_loss"] for row in seed_rows[0]}) == 4  # the seeds differ
    assert seed_rows[0] == seed_rows[1]  # every metric of every seed, as written (full float repr)
    assert curves[0] == curves[1]
    assert summaries[0]["configs"] == summaries[1]["configs"]  # the statistics too (bootstrap seeded)


def test_train_twice_gives_bit_identical_parameters():
    from hfta_nas.data import load_dataset

    data = load_dataset("digits")

    def once(global_seed):
        torch.manual_seed(global_seed)  # the caller's global RNG state must not matter
        return hfta_nas.train(
            "mlp",
            model_config={"width": 16, "depth": 1, "dropout": 0.2},
            dataset=data,
            seeds=[0, 1, 2],
            data_seeds=[3, 4, 5],
            dropout_seeds=[6, 7, 8],
            optimizer="adam",
            hparams={"lr": [1e-3, 3e-3, 1e-2]},
            epochs=2,
            batch_size=64,
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the commands run (--threads 1): results are reproducible per thread count
    try:
        first, second = once(12345), once(999)
    finally:
        torch.set_num_threads(threads)
    for slot in range(3):
        a, b = first.array.slot_state_dict(slot), second.array.slot_state_dict(slot)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), slot
        assert first.results[slot].history == second.results[slot].history
    assert not torch.equal(first.array.slot_state_dict(0)["fc0.weight"], first.array.slot_state_dict(1)["fc0.weight"])
