"""Chaos rounds: kill, pause or interrupt searches and stability studies at random times,
re-run them, and check that nothing was lost. Not a unit test (minutes per dozen rounds).

    python -m benchmarks.chaos                     # 100 rounds, journal + SQLite (+ PostgreSQL when it can start)
    python -m benchmarks.chaos --rounds 10 --seed 3 --storages journal --json chaos.json
    python -m benchmarks.chaos --rounds 30 --epochs 40  # longer arrays: signals land mid-array, re-runs resume

Each round draws, from `--seed`: the command (search or stability), the storage
(journal file, SQLite, a throwaway PostgreSQL), 1-3 workers (search), the signal
(SIGKILL, SIGINT, or SIGSTOP for a few seconds then SIGCONT), its target (the
command, or one worker) and its time. It runs the command, sends the signal, lets
it end, runs the same command again to the end with no signal, and checks:

- search: nothing RUNNING or WAITING; exactly n_trials counted; every trial failed
  as interrupted has a finished retry with its parameters, and no two counted
  trials retry the same one; the exported config names the study's best trial and
  the exported weights are its staged ones; every counted trial whose parameters
  and seeds a clean reference run also trained has the reference's value (1e-6);
- stability: every seed completed once, with the values of a clean reference run
  (1e-5: a re-run trains the missing seeds in a smaller array);
- both: no checkpoint file is left once the re-run ends (a re-run that continued an
  array from its checkpoint is counted in the last line).

A round that breaks an invariant is printed with its draw and its logs' tails. The
last line is the count: `chaos: N rounds (S signalled mid-run, R continued mid-array), K passed, F failed`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
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


def _workers_of(parent: int) -> list[int]:
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
        if draw.target == "worker" and _workers_of(process.pid):
            targets = [random.Random(draw.round).choice(_workers_of(process.pid))]
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
def search_problems(url: str, name: str, out: Path, reference: dict[tuple, float]) -> tuple[list[str], int]:
    """What breaks an invariant, and how many trials were compared with the clean run."""
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
    for lost in (t for t in trials if outcome_of(t) is not None and outcome_of(t).value == "interrupted"):
        if not any(t.params == lost.params and t.state.is_finished() and counts(t) for t in trials):
            problems.append(f"interrupted trial {lost.number} ({lost.params}) was never trained again")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
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


# --------------------------------------------------------------------- main
def draw_round(rng: random.Random, number: int, storages: list[str]) -> Draw:
    what = rng.choice(["search", "search", "stability"])
    workers = rng.choice([1, 2, 3]) if what == "search" else 1
    sig = rng.choice(SIGNALS)
    target = rng.choice(["command", "worker"]) if workers > 1 else "command"
    return Draw(
        number,
        what,
        rng.choice(storages),
        workers,
        sig,
        target,
        round(rng.uniform(1.0, 7.0), 2),
        round(rng.uniform(0.5, 4.0), 2),
    )


def references(base: Path, epochs: int = EPOCHS) -> dict[str, Any]:
    """Clean runs of both commands, once, on the journal (values do not depend on the storage)."""
    folder = base / "reference"
    folder.mkdir()
    (folder / "space.yaml").write_text(space_text("reference", epochs))
    (folder / "config.yaml").write_text(stability_config(epochs))
    url = storage_url("journal", folder, None, "reference")
    for what in ("search", "stability"):
        probe = Draw(0, what, "journal", 1, "", "command", 0, 0)
        if clean_run(command(probe, folder, url), folder / f"{what}.log"):
            raise SystemExit(f"the clean reference {what} failed:\n{(folder / f'{what}.log').read_text()[-3000:]}")
    return {"search": search_reference(url, "reference"), "stability": stability_values(folder / "report")}


def run_round(
    draw: Draw, base: Path, postgres: str | None, reference: dict[str, Any], epochs: int = EPOCHS
) -> tuple[list[str], int, bool, bool]:
    """The round's broken invariants, how many results were compared with a clean run, whether
    the signal found the command running, and whether the re-run continued a checkpoint."""
    folder = base / f"round-{draw.round}"
    folder.mkdir()
    name = f"chaos{draw.round}"
    (folder / "space.yaml").write_text(space_text(name, epochs))
    (folder / "config.yaml").write_text(stability_config(epochs))
    url = storage_url(draw.storage, folder, postgres, name)
    argv = command(draw, folder, url)
    hit = disturbed_run(draw, argv, folder / "disturbed.log")
    if clean_run(argv, folder / "rerun.log"):
        return [f"the re-run failed:\n{(folder / 'rerun.log').read_text(errors='replace')[-1500:]}"], 0, hit, False
    if draw.command == "search":
        problems, compared = search_problems(url, name, folder / "out", reference["search"])
        resumed = any(
            "resumed_from_epoch" in t.user_attrs
            for t in optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
        )
    else:
        problems, compared = stability_problems(folder / "report", reference["stability"])
        resumed = _stability_resumed(folder / "report")
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("checkpoints/*/*.pt"))
    if left:
        problems.append(f"checkpoints left after the re-run: {left}")
    return problems, compared, hit, resumed


def _stability_resumed(report: Path) -> bool:
    try:
        metadata = json.loads((report / "result" / "metadata.json").read_text())
    except (OSError, ValueError):
        return False
    return any(a.get("resumed_epoch", 0) > 0 for a in metadata.get("arrays", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="draws the rounds")
    parser.add_argument("--storages", default=",".join(STORAGES), help="from journal, sqlite, postgresql")
    parser.add_argument("--keep", type=Path, default=None, help="keep every round's folder here")
    parser.add_argument(
        "--epochs",
        type=int,
        default=EPOCHS,
        help=f"epochs of every model [{EPOCHS}]; more make a signal land mid-array more often",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the draws and results here")
    args = parser.parse_args(argv)
    storages = [s for s in args.storages.split(",") if s]
    if not storages or set(storages) - set(STORAGES) or args.rounds < 1 or args.epochs < 1:
        parser.error(f"--storages takes some of {','.join(STORAGES)}; --rounds and --epochs must be positive")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="hfta-nas-chaos-")) if args.keep is None else args.keep
    base.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        postgres = None
        if "postgresql" in storages:
            from benchmarks._postgres import Unavailable, throwaway_postgres

            try:
                postgres = stack.enter_context(throwaway_postgres("hfta_nas_chaos"))
            except Unavailable as why:
                print(f"chaos: no PostgreSQL ({why}); journal and SQLite only", flush=True)
                storages.remove("postgresql")
        reference = references(base, args.epochs)
        for number in range(1, args.rounds + 1):
            draw = draw_round(rng, number, storages)
            started = time.monotonic()
            problems, compared, hit, resumed = run_round(draw, base, postgres, reference, args.epochs)
            results.append(
                {
                    **asdict(draw),
                    "seconds": round(time.monotonic() - started, 1),
                    "problems": problems,
                    "compared_with_clean_run": compared,
                    "signal_hit": hit,
                    "resumed_mid_array": resumed,
                }
            )
            verdict = (
                f"ok ({compared} results equal a clean run's)" if not problems else "FAILED: " + "; ".join(problems)
            )
            verdict += " [continued mid-array from a checkpoint]" if resumed else ""
            verdict += "" if hit else " [the command had ended before the signal]"
            print(
                f"round {number}: {draw.command} {draw.storage} workers={draw.workers} {draw.signal}->{draw.target} "
                f"at {draw.at_s}s: {verdict}",
                flush=True,
            )
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "epochs": args.epochs, "rounds": results}, indent=2) + "\n")
    failed = sum(1 for r in results if r["problems"])
    hit = sum(1 for r in results if r["signal_hit"])
    resumed = sum(1 for r in results if r["resumed_mid_array"])
    print(
        f"chaos: {len(results)} rounds ({hit} signalled mid-run, {resumed} continued mid-array), "
        f"{len(results) - failed} passed, {failed} failed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
