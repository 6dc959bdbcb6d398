"""One command's chaos round, the parts every kind of round shares: the space and config a round
runs, its command line and storage, running it, and the invariants a finished search or stability
study must hold against a clean run (see benchmarks/chaos.py for the rounds themselves)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from hfta_nas.search import counts, open_storage, outcome_of

ROOT = Path(__file__).resolve().parents[1]
N_TRIALS, EPOCHS, SEEDS = 6, 4, 6
STORAGES = ("journal", "sqlite", "postgresql")
SIGNALS = ("SIGKILL", "SIGINT", "SIGSTOP")


@dataclass
class Draw:
    """What one round does."""

    round: int
    command: str  # search | stability
    storage: str  # journal | sqlite | postgresql
    workers: int
    signal: str
    target: str  # command | worker
    at_s: float  # seconds after the start
    pause_s: float  # SIGSTOP only


# ------------------------------------------------------------------- inputs
def space_text(name: str, epochs: int = EPOCHS) -> str:
    return yaml.safe_dump(
        {
            "study": {"name": name, "metrics": ["val_acc"]},
            "sampler": {"name": "tpe", "kwargs": {"n_startup_trials": 3}},
            "pruner": {"name": "none"},
            "budget": {"n_trials": N_TRIALS},
            "array": {"size": 3},
            "data": {"dataset": "digits", "batch_size": 64},
            "training": {"epochs": epochs, "optimizer": {"name": "adam", "lr": 1e-3}},
            "model": {"family": "mlp", "config": {"depth": 1}},
            "seed": 11,
            "params": {
                "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
                "model.config.width": {"distribution": "categorical", "values": [16, 32]},
            },
        }
    )


def stability_config(epochs: int = EPOCHS) -> str:
    return (
        "model: mlp\nmodel_config: {width: 16, depth: 1}\ndataset: digits\noptimizer: adam\n"
        f"hparams: {{lr: 0.01}}\nepochs: {epochs}\ndata: {{batch_size: 64}}\n"
    )


def command(draw: Draw, folder: Path, url: str) -> list[str]:
    script = Path(sys.executable).with_name("hfta-nas")
    base = [str(script)] if script.exists() else [sys.executable, str(ROOT / "cli.py")]
    if draw.command == "search":
        return [
            *base,
            "search",
            str(folder / "space.yaml"),
            "--storage",
            url,
            "--out",
            str(folder / "out"),
            "--threads",
            "1",
            "--quiet",
            *(["--workers", str(draw.workers)] if draw.workers > 1 else []),
        ]
    return [
        *base,
        "stability",
        str(folder / "config.yaml"),
        "--seeds",
        str(SEEDS),
        "--storage",
        url,
        "--out",
        str(folder / "report"),
        "--format",
        "csv",
        "--plot-format",
        "png",
        "--threads",
        "1",
        "--quiet",
    ]


def storage_url(kind: str, folder: Path, postgres: str | None, name: str) -> str:
    """A fresh storage for one round (on PostgreSQL a new database: a stability study
    found in an old one would be reused, not retrained)."""
    if kind == "journal":
        return str(folder / "study.journal")
    if kind == "sqlite":
        return f"sqlite:///{folder / 'study.db'}"
    assert postgres is not None
    import psycopg

    server, _, _ = postgres.rpartition("/")
    with psycopg.connect(postgres, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


# ------------------------------------------------------------------- a round
def env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )


def workers_of(parent: int) -> list[int]:
    """The worker processes of a `--workers` parent (its children, from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(stat.parent.name))
    return children


def disturbed_run(draw: Draw, argv: list[str], log: Path) -> bool:
    """Run `argv`, send the draw's signal at its time, and wait for the command to end;
    whether the signal found it still running."""
    with open(log, "wb") as stream:
        process = subprocess.Popen(argv, cwd=log.parent, env=env(), stdout=stream, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + draw.at_s
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    hit = process.poll() is None
    if hit:
        targets = [process.pid]
        if draw.target == "worker" and workers_of(process.pid):
            targets = [random.Random(draw.round).choice(workers_of(process.pid))]
        sig = getattr(signal, draw.signal)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if draw.signal == "SIGSTOP":
            time.sleep(draw.pause_s)
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    try:
        process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return hit


def clean_run(argv: list[str], log: Path) -> int:
    with open(log, "wb") as stream:
        return subprocess.run(
            argv, cwd=log.parent, env=env(), stdout=stream, stderr=subprocess.STDOUT, timeout=900
        ).returncode


# --------------------------------------------------------------- invariants
def search_problems(
    url: str, name: str, out: Path, reference: dict[tuple, float], export_required: bool = True
) -> tuple[list[str], int]:
    """What breaks an invariant, and how many trials were compared with the clean run. Without
    `export_required` (the best trial's weights were lost to a full disk, as its run said) no
    published pair passes, but one that names another trial than the best does not."""
    study = optuna.load_study(study_name=name, storage=open_storage(url)[0])
    trials = study.get_trials(deepcopy=False)
    problems = [
        f"trial {t.number} left {t.state.name}" for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)
    ]
    counted = [t for t in trials if t.state.is_finished() and counts(t)]
    if len(counted) != N_TRIALS:
        problems.append(f"{len(counted)} trials counted, expected {N_TRIALS}")
    retried = [t.user_attrs.get("retry_of") for t in counted if "retry_of" in t.user_attrs]
    if len(retried) != len(set(retried)):
        problems.append(f"a trial was retried twice: {sorted(retried)}")
    originals = [t.user_attrs.get("retry_of", t.number) for t in counted]
    if len(originals) != len(set(originals)):
        problems.append(f"a parameter set was counted twice (original trial numbers {sorted(originals)})")
    for lost in (t for t in trials if outcome_of(t) is not None and outcome_of(t).value == "interrupted"):
        if not any(t.params == lost.params and t.state.is_finished() and counts(t) for t in trials):
            problems.append(f"interrupted trial {lost.number} ({lost.params}) was never trained again")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete and (export_required or (out / "best_config.yaml").exists()):
        best = min(complete, key=lambda t: (-t.values[0], t.number))
        config = out / "best_config.yaml"
        exported = yaml.safe_load(config.read_text())["origin"]["trial"] if config.exists() else None
        if exported != best.number:
            problems.append(f"best_config.yaml names trial {exported}, the study's best is {best.number}")
        staged = out / ".trials" / f"{best.number}.pt"
        if not staged.exists() or staged.read_bytes() != (out / "best_weights.pt").read_bytes():
            problems.append("best_weights.pt is not the best trial's staged weights")
    compared = [t for t in complete if _key(t) in reference]
    for t in compared:
        if abs(reference[_key(t)] - t.values[0]) > 1e-6:
            problems.append(
                f"trial {t.number}: {t.values[0]} where a clean run gave {reference[_key(t)]} for {t.params}"
            )
    return problems, len(compared)


def _key(trial: Any) -> tuple:
    return (trial.user_attrs.get("retry_of", trial.number), tuple(sorted(trial.params.items())))


def search_reference(url: str, name: str) -> dict[tuple, float]:
    trials = optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
    return {_key(t): t.values[0] for t in trials if t.state == TrialState.COMPLETE}


def stability_values(report: Path) -> dict[int, dict[str, float]]:
    import pandas as pd

    seeds = pd.read_csv(report / "result" / "seeds.csv")
    return {
        int(r["seed_index"]): {m: float(r[m]) for m in ("test_acc", "val_acc")} | {"status": r["status"]}
        for _, r in seeds.iterrows()
    }


def stability_problems(report: Path, reference: dict[int, dict[str, Any]]) -> tuple[list[str], int]:
    try:
        values = stability_values(report)
    except (OSError, ValueError, KeyError) as error:
        return [f"no readable report: {error}"], 0
    problems = [f"seed {i}: {row['status']}" for i, row in values.items() if row["status"] != "completed"]
    if sorted(values) != sorted(reference):
        problems.append(f"seeds {sorted(values)}, expected {sorted(reference)}")
    for index, row in values.items():
        expected = reference.get(index)
        if expected and any(abs(row[m] - expected[m]) > 1e-5 for m in ("test_acc", "val_acc")):
            problems.append(f"seed {index}: {row} where a clean run gave {expected}")
    return problems, len(set(values) & set(reference))


def stability_resumed(report: Path) -> bool:
    try:
        metadata = json.loads((report / "result" / "metadata.json").read_text())
    except (OSError, ValueError):
        return False
    return any(a.get("resumed_epoch", 0) > 0 for a in metadata.get("arrays", []))
