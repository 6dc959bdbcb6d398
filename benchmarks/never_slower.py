"""Never slower than plain Optuna: the default search against plain Optuna on every shipped space.

    python -m benchmarks.never_slower --out benchmarks/results/never-slower.json   # each space's budget, 3 seeds
    python -m benchmarks.never_slower --quick                                      # 2 epochs, 1000 samples, 1 seed
    python -m benchmarks.never_slower --n-trials 48 --spaces mnist1d_user_factory

For each `search_spaces/*.yaml` (or those named), benchmarks/search.py's `plain`, `plain-journal` and
`pack` methods run on the same seeds in one process, in turns (its `run`: same budget, per-trial
seeds, one torch thread). Per space, seed by seed: plain's wall time / pack's (the acceptance is
>= 1.0) and each method's time to plain's median final best (pack's no later than plain's); the same
ratios against plain Optuna on a journal file (`against_plain_journal`: the storage as durable as
pack's, each write a locked, fsynced append); and pack's time account, so that a space below 1.0
shows which phase costs it. A space the plain loop cannot reproduce (several objectives, a
metric it does not evaluate, a schedule it does not have) is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from scipy.stats import wilcoxon

from benchmarks._cli import package_versions, write_result
from benchmarks.search import quick_space, run
from hfta_nas.errors import HftaNasError
from hfta_nas.search_spaces import load_space

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
METHODS = ["plain", "plain-journal", "pack"]


def one_space(path: Path, n_trials: int | None, seeds: int, quick: bool) -> dict[str, Any]:
    """plain against pack on one space: the ratios, or why the plain loop cannot run it."""
    space = load_space(path)
    if space.pbt is not None:
        return {"skipped": "a pbt: block (benchmarks/pbt.py compares PBT)"}
    if quick:
        space = quick_space(space)
    try:
        figures = run(space, n_trials or space.budget.n_trials, list(range(seeds)), METHODS, 1, "cpu", "float32")
    except SystemExit as refusal:  # the plain loop cannot reproduce this space
        return {"skipped": str(refusal)}
    plain, pack = (figures["summary"]["methods"][m] for m in ("plain", "pack"))
    speedup, to_target = pack["speedup"], (plain["time_to_target"]["median"], pack["time_to_target"]["median"])
    return {
        "n_trials": figures["n_trials"],
        "epochs": figures["epochs"],
        "plain_over_pack_wall": speedup,
        "time_to_plain_median_best": {"plain": to_target[0], "pack": to_target[1]},
        "never_slower": speedup["median"] >= 1.0,
        "reaches_plain_best_no_later": to_target[1] is not None
        and (to_target[0] is None or to_target[1] <= to_target[0]),
        "paired": paired(figures),
        # like for like on storage: plain Optuna on a journal file, as durable as pack's
        "against_plain_journal": paired(figures, reference="plain-journal"),
        "pack_time_account": pack.get("time_account", {}),
        "pack_arrays": [(r["arrays"], r["mean_occupancy"]) for r in figures["runs"]["pack"]],
        "figures": figures,
    }


def paired(figures: dict[str, Any], reference: str = "plain") -> dict[str, Any]:
    """Seed by seed, pack against `reference` (plain, or plain-journal; named plain below): wall time,
    wall time per trained epoch (speed apart from which trials the pruner stopped) and final best value
    (positive: pack's better). For each, the median, min and max over seeds and the two-sided Wilcoxon
    signed-rank p-value of "no difference" (of the ratios' logarithms), so that a skeptic can tell a
    difference from the spread between seeds."""
    sign = 1.0 if figures["direction"] == "maximize" else -1.0
    runs = {m: {r["seed"]: r for r in figures["runs"][m]} for m in (reference, "pack")}
    seeds = sorted(set(runs[reference]) & set(runs["pack"]))
    plain, pack = ([runs[m][s] for s in seeds] for m in (reference, "pack"))
    valued = [(a, b) for a, b in zip(plain, pack) if a["best_value"] is not None and b["best_value"] is not None]
    series = {
        "plain_over_pack_wall": [a["seconds"] / b["seconds"] for a, b in zip(plain, pack)],
        "plain_over_pack_per_epoch": [_per_epoch(a) / _per_epoch(b) for a, b in zip(plain, pack)],
        "pack_best_minus_plain": [sign * (b["best_value"] - a["best_value"]) for a, b in valued],  # seeds with both
    }
    logs = {"plain_over_pack_wall": True, "plain_over_pack_per_epoch": True, "pack_best_minus_plain": False}
    return {"seeds": seeds} | {name: _described(values, logs[name]) for name, values in series.items()}


def _per_epoch(run: dict[str, Any]) -> float:
    return run["seconds"] / max(run["epochs_trained"], 1)


def _described(values: list[float], ratio: bool) -> dict[str, Any]:
    if not values:  # no seed where both methods completed a trial
        return {
            "per_seed": [],
            "median": None,
            "min": None,
            "max": None,
            "pack_ahead": 0,
            "pack_behind": 0,
            "wilcoxon_p": None,
        }
    differences = np.log(values) if ratio else np.asarray(values)
    nonzero = differences[differences != 0]
    p_value = float(wilcoxon(nonzero).pvalue) if len(nonzero) >= 2 else None
    return {
        "per_seed": values,
        "median": float(np.median(values)),
        "min": min(values),
        "max": max(values),
        "pack_ahead": int(np.sum(differences > 0)),
        "pack_behind": int(np.sum(differences < 0)),
        "wilcoxon_p": p_value,
    }


def print_row(name: str, row: dict[str, Any]) -> None:
    if "skipped" in row:
        print(f"{name:>28}: skipped ({row['skipped']})")
        return
    ratio, reach = row["plain_over_pack_wall"], row["time_to_plain_median_best"]
    shown = lambda v: "never" if v is None else f"{v:.1f} s"
    overhead = row["pack_time_account"].get("overhead")
    print(
        f"{name:>28}: plain / pack wall {ratio['median']:.2f}x [{ratio['min']:.2f}-{ratio['max']:.2f}]"
        f"{'' if row['never_slower'] else ' SLOWER'}; to plain's median best: plain {shown(reach['plain'])}, "
        f"pack {shown(reach['pack'])}; pack overhead "
        + ("-" if overhead is None else f"{overhead:.0%}")
        + f" of its wall; arrays, occupancy {row['pack_arrays']}"
    )
    statistics = [*row["paired"].items()]
    statistics += [(f"[plain-journal] {k}", v) for k, v in row.get("against_plain_journal", {}).items()]
    for statistic, values in statistics:
        if not statistic.endswith("seeds") and values["per_seed"]:
            p_value = "-" if values["wilcoxon_p"] is None else f"{values['wilcoxon_p']:.2f}"
            print(
                f"{'':>30}{statistic}: median {values['median']:.3f} [{values['min']:.3f}, {values['max']:.3f}], "
                f"pack ahead in {values['pack_ahead']} and behind in {values['pack_behind']} of "
                f"{len(values['per_seed'])} seeds, Wilcoxon p {p_value}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--spaces", default="", help="comma-separated space names (file stems); default: all")
    parser.add_argument("--n-trials", type=int, default=None, help="trials per search; None: each space's budget")
    parser.add_argument("--seeds", type=int, default=3, help="search seeds 0..N-1")
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1000 samples (generated data), 1 seed")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    paths = sorted(SPACES.glob("*.yaml"))
    if args.spaces:
        wanted = {name.strip() for name in args.spaces.split(",")}
        unknown = wanted - {p.stem for p in paths}
        if unknown:
            print(f"error: no shipped space {', '.join(sorted(unknown))} in {SPACES}", file=sys.stderr)
            return 2
        paths = [p for p in paths if p.stem in wanted]
    if min(args.seeds, args.n_trials or 1) < 1:
        print("error: --seeds and --n-trials must be positive", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_before = os.getloadavg()
    rows = {}
    for path in paths:
        try:
            rows[path.stem] = one_space(path, args.n_trials, 1 if args.quick else args.seeds, args.quick)
        except HftaNasError as error:
            rows[path.stem] = {"skipped": str(error)}
        print_row(path.stem, rows[path.stem])
    result = {
        "quick": args.quick,
        "spaces": rows,
        "versions": package_versions(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
    }
    if args.out:
        write_result(result, args.out, "benchmarks.never_slower", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
