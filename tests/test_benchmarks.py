"""The throughput harness runs end to end (`--quick`) and writes a complete, consistent JSON.

This checks the harness, not the timings: every (workload, B, method) cell must
hold a positive rate or an explicit reason, the ratios must be those of the
rates, and the fused methods must reproduce a plain model's first loss.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hfta_nas
from tests._benchmark_runs import run_from_checkout
from tests._rendezvous import GUARD_S

# one test process runs this file (pytest-xdist --dist loadgroup): its module fixtures, the quick runs, run once
pytestmark = pytest.mark.xdist_group(name="benchmarks")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks._report import RATIOS, ratios  # noqa: E402 - after the sys.path line above
from benchmarks.throughput import build_parser, main  # noqa: E402 - after the sys.path line above

METHODS = ["serial", "processes", "vmap", "array", "limit"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    completed = run_from_checkout("-m", "benchmarks.throughput", "--quick", "--out", str(out))
    return json.loads(out.read_text()), completed.stdout


@pytest.mark.slow
def test_quick_run_covers_every_cell(quick_run):
    result, _ = quick_run
    settings = result["settings"]
    assert settings["quick"] is True
    assert settings["workloads"] == ["mlp", "cnn1d"] and settings["batches"] == [1, 8]
    assert settings["methods"] == METHODS and settings["threads"] == 1
    assert set(result["results"]) == {"mlp", "cnn1d"}
    for workload, by_batch in result["results"].items():
        assert set(by_batch) == {"1", "8"}
        for batch, entry in by_batch.items():
            assert set(entry["methods"]) == set(METHODS)
            for method, cell in entry["methods"].items():
                where = f"{workload} B={batch} {method}"
                rate = cell["samples_per_s"]
                if rate is None:
                    assert isinstance(cell["unsupported"], str) and cell["unsupported"], where
                else:
                    assert math.isfinite(rate) and rate > 0, where
                    assert cell["unsupported"] is None, where
                    assert min(2, settings["repeats"]) <= len(cell["repeat_seconds"]) <= settings["repeats"], where
            # On these workloads everything runs, except processes above --max-processes (2 in quick mode).
            for method in ("serial", "vmap", "array", "limit"):
                assert entry["methods"][method]["samples_per_s"] is not None, (workload, batch, method)
            processes = entry["methods"]["processes"]
            if int(batch) <= settings["max_processes"]:
                assert processes["samples_per_s"] is not None, processes.get("unsupported")
            else:
                assert "max-processes" in processes["unsupported"]


@pytest.mark.slow
def test_quick_run_ratios_come_from_the_rates(quick_run):
    result, _ = quick_run
    for by_batch in result["results"].values():
        for entry in by_batch.values():
            cells = entry["methods"]
            assert set(entry["ratios"]) == set(RATIOS)
            for name, (top, bottom, _) in RATIOS.items():
                a, b = cells[top]["samples_per_s"], cells[bottom]["samples_per_s"]
                if a is None or b is None:
                    assert entry["ratios"][name] is None
                else:
                    assert entry["ratios"][name] == pytest.approx(a / b, rel=1e-12)
            fusion = entry["ratios"]["fusion_efficiency"]
            assert fusion == pytest.approx(cells["array"]["samples_per_s"] / cells["limit"]["samples_per_s"])


@pytest.mark.slow
def test_quick_run_fused_methods_match_serial_first_loss(quick_run):
    result, _ = quick_run
    assert result["flags"] == []
    for by_batch in result["results"].values():
        for entry in by_batch.values():
            for method in ("serial", "vmap", "array"):
                equivalence = entry["methods"][method]["equivalence"]
                assert equivalence["ok"] and equivalence["rel_diff"] <= 1e-4
                assert entry["methods"][method]["flag"] is None


@pytest.mark.slow
def test_quick_run_records_machine_and_prints_table(quick_run):
    result, stdout = quick_run
    machine = result["machine"]
    for key in ("cpu_count", "torch", "threads", "device_name"):
        assert machine[key] not in (None, "")
    assert machine["threads"] == 1
    assert result["duration_s"] > 0
    for header in (
        "serial",
        "processes",
        "vmap",
        "array",
        "limit",
        "array/serial",
        "array/vmap",
        "processes/serial",
        "T_limit/T_array",
    ):
        assert header in stdout


def test_ratios_handle_unsupported_cells():
    cells = {
        "serial": {"samples_per_s": 100.0},
        "processes": {"samples_per_s": None, "unsupported": "skipped"},
        "vmap": {"samples_per_s": None, "unsupported": "no batching rule"},
        "array": {"samples_per_s": 400.0},
        "limit": {"samples_per_s": 500.0},
    }
    assert ratios(cells) == {
        "array/serial": 4.0,
        "array/vmap": None,
        "processes/serial": None,
        "fusion_efficiency": 0.8,
    }


def test_bad_arguments_are_rejected(capsys):
    parser = build_parser()
    for argv in (["--batches", "0"], ["--batches", "x"], ["--workloads", "resnet"], ["--methods", "jit"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
    assert main(["--warmup", "1", "--threads", "0", "--workloads", "mlp", "--batches", "1", "--quiet"]) == 2
    assert "threads" in capsys.readouterr().err


# ---------------------------------------------------------------- benchmarks/search.py
from benchmarks import _anytime  # noqa: E402 - after the sys.path line at the top

SEARCH_METHODS = ["plain", "processes", "hfta", "replicate", "pack", "pack-workers"]


@pytest.fixture(scope="module")
def search_quick_run(tmp_path_factory):
    """`hfta-nas bench search --quick`: the five methods on the shipped mnist1d_cnn space, 2 seeds, tiny budget."""
    folder = tmp_path_factory.mktemp("bench-search")
    out, image = folder / "search.json", folder / "anytime.png"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = Path(sys.executable).with_name("hfta-nas")  # the installed console script, else the same entry point
    command = [str(script)] if script.exists() else [sys.executable, "-m", "hfta_nas.cli"]
    completed = subprocess.run(
        [
            *command,
            "bench",
            "search",
            "--quick",
            "--methods",
            ",".join(SEARCH_METHODS),
            "--out",
            str(out),
            "--plot",
            str(image),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), completed.stdout, image


@pytest.mark.slow
def test_search_quick_run_has_every_method_and_seed(search_quick_run):
    result, stdout, image = search_quick_run
    assert result["quick"] is True and result["threads"] == 1 and result["device"] == "cpu"
    assert result["metric"] == "val_acc" and result["direction"] == "maximize" and result["reference"] == "plain"
    n_trials, seeds = result["n_trials"], result["seeds"]
    assert n_trials == 4 and result["epochs"] == 2 and seeds == [0, 1]
    assert result["processes"] == min(len(os.sched_getaffinity(0)), 2)
    assert list(result["runs"]) == SEARCH_METHODS
    for method, runs in result["runs"].items():
        assert [run["seed"] for run in runs] == seeds, method
        for run in runs:
            assert math.isfinite(run["seconds"]) and run["seconds"] > 0, method
            states = run["trials"]
            assert sum(states.values()) == n_trials and states["RUNNING"] == states["WAITING"] == 0, (method, states)
            assert states["COMPLETE"] >= 1, (method, states)
            curve = run["curve"]  # best so far: times and values never go backwards, and end at the best
            assert curve and all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(curve, curve[1:])), (method, curve)
            assert run["best_value"] == curve[-1][1] and 0.0 <= run["best_value"] <= 1.0
            assert curve[0][0] >= 0 and curve[-1][0] <= run["seconds"] + 1.0, (method, curve, run["seconds"])
            assert 1 <= run["epochs_trained"] <= n_trials * result["epochs"]
            assert 1 <= run["architectures_trained"] <= n_trials
    for method in ("hfta", "replicate", "pack", "pack-workers"):
        assert all(run["arrays"] >= 1 for run in result["runs"][method])
    # replicate fills each array with its first trial's architecture (one per array); pack trains each as proposed
    assert all(run["architectures_trained"] <= run["arrays"] for run in result["runs"]["replicate"])


@pytest.mark.slow
def test_search_quick_run_summary_is_that_of_the_runs(search_quick_run):
    result, stdout, image = search_quick_run
    summary, runs = result["summary"], result["runs"]
    plain_seconds = [run["seconds"] for run in runs["plain"]]
    assert summary["horizon_s"] == pytest.approx(sorted(plain_seconds)[0] / 2 + sorted(plain_seconds)[1] / 2)
    for method, cell in summary["methods"].items():
        seconds = [run["seconds"] for run in runs[method]]
        assert cell["seconds"]["min"] == min(seconds) and cell["seconds"]["max"] == max(seconds)
        ratios = [p / s for p, s in zip(plain_seconds, seconds)]
        assert cell["speedup"]["min"] == pytest.approx(min(ratios)) and cell["speedup"]["max"] == pytest.approx(
            max(ratios)
        )
        assert cell["best_value"]["max"] == max(run["best_value"] for run in runs[method])
    assert summary["methods"]["plain"]["speedup"]["median"] == pytest.approx(1.0)
    # Trial 0 is sampled alike in plain and pack (same sampler seed, no results yet) and trained
    # with the same seeds: the plain loop and the array must then agree epoch by epoch.
    same = {pair["number"]: pair for pair in result["same_trials"]}
    assert 0 in same
    for step, value in same[0]["plain_values"].items():
        assert same[0]["pack_values"][step] == pytest.approx(value, abs=0.02)
    for header in (
        "method",
        "wall s",
        "best val_acc",
        "s to target",
        "plain / method",
        "pack / replicate wall time",
        "1 torch threads",
        *SEARCH_METHODS,
    ):
        assert header in stdout
    assert image.stat().st_size > 10_000 and image.read_bytes()[:4] == b"\x89PNG"


def test_anytime_curve_value_and_time_to_target():
    finished = [
        (1.0, "PRUNED", None),
        (2.0, "COMPLETE", 0.5),
        (3.0, "FAIL", None),
        (4.0, "COMPLETE", 0.4),
        (5.0, "COMPLETE", 0.7),
        (6.0, "COMPLETE", float("nan")),
    ]
    curve = _anytime.best_so_far(finished, "maximize")
    assert curve == [(2.0, 0.5), (5.0, 0.7)]
    assert _anytime.best_so_far(finished, "minimize") == [(2.0, 0.5), (4.0, 0.4)]
    assert [_anytime.value_at(curve, t) for t in (1.9, 2.0, 4.9, 5.0, 99.0)] == [None, 0.5, 0.5, 0.7, 0.7]
    assert _anytime.time_to(curve, 0.6, "maximize") == 5.0 and _anytime.time_to(curve, 0.8, "maximize") is None


def test_anytime_spread_counts_missing_runs_as_worst():
    assert _anytime.spread([0.3, None, 0.5], "maximize") == {"median": 0.3, "min": None, "max": 0.5}
    assert _anytime.spread([0.3, None, None], "maximize")["median"] is None
    assert _anytime.spread([0.3, None, 0.5], "minimize") == {"median": 0.5, "min": 0.3, "max": None}
    assert _anytime.spread([2.0, None, 1.0]) == {"median": 2.0, "min": 1.0, "max": None}  # times: never = +inf
    curves = [[(1.0, 0.5)], [(2.0, 0.6)], [(3.0, 0.4)], [(3.0, 0.7)], [(4.0, 0.3)]]
    grid = _anytime.grid_curves(curves, "maximize", np.array([0.5, 1.5, 2.5, 3.5, 4.5]))
    # a run with no value yet is the worst: the median needs 3 of 5 runs, the 75th percentile 2
    assert np.isnan(grid["median"][:3]).all() and grid["median"][3:].tolist() == [0.5, 0.5]
    assert np.isnan(grid["q25"][:3]).all() and grid["q25"][3:].tolist() == [0.4, 0.4]
    assert np.isnan(grid["q75"][:2]).all() and grid["q75"][2:].tolist() == [0.5, 0.6, 0.6]


# ---------------------------------------------------------------- benchmarks/envelope.py
from benchmarks import envelope  # noqa: E402 - after the sys.path line above

ENVELOPE_METHODS = ["padded", "grouped", "serial"]


@pytest.fixture(scope="module")
def envelope_quick_run(tmp_path_factory):
    """`python -m benchmarks.envelope --quick` cut down to one mixed workload and two tiny sweep
    series (a few seconds)."""
    out = tmp_path_factory.mktemp("bench-envelope") / "envelope.json"
    completed = run_from_checkout(
        "-m",
        "benchmarks.envelope",
        "--quick",
        "--threads",
        "1",
        "--workloads",
        "mlp",
        "--sweep",
        "mlp",
        "--mixes",
        "pair,ladder",
        "--ratios",
        "1,0.5",
        "--json",
        str(out),
    )
    return json.loads(out.read_text()), completed.stdout


def _envelope_entries(result):
    yield from result["results"].items()
    yield from ((point["name"], point) for point in result["sweep"])


@pytest.mark.slow
def test_envelope_quick_run_has_three_methods_with_positive_rates(envelope_quick_run):
    result, _ = envelope_quick_run
    settings = result["settings"]
    assert settings["quick"] is True and settings["threads"] == 1 and result["machine"]["threads"] == 1
    assert settings["methods"] == ENVELOPE_METHODS
    assert list(result["results"]) == ["mlp"]
    assert len(result["sweep"]) == 4  # mlp x (pair, ladder) x (1, 0.5)
    assert result["flags"] == []
    for name, entry in _envelope_entries(result):
        assert list(entry["methods"]) == ENVELOPE_METHODS, name
        for method, cell in entry["methods"].items():
            rate = cell["samples_per_s"]
            assert rate is not None and math.isfinite(rate) and rate > 0, (name, method, cell.get("unsupported"))
            assert cell["models_timed"] == entry["models"] and cell["equivalence"]["ok"], (name, method)
        for ratio, (top, bottom, _) in envelope.RATIOS.items():
            expected = entry["methods"][top]["samples_per_s"] / entry["methods"][bottom]["samples_per_s"]
            assert entry["ratios"][ratio] == pytest.approx(expected, rel=1e-12), (name, ratio)
        # Groups partition the slots by exact config.
        assert sorted(s for g in entry["groups"] for s in g) == list(range(entry["models"]))
        for group in entry["groups"]:
            assert all(entry["configs"][s] == entry["configs"][group[0]] for s in group)


@pytest.mark.slow
def test_envelope_quick_run_reports_padding_waste(envelope_quick_run):
    result, _ = envelope_quick_run
    mixed = result["results"]["mlp"]
    assert mixed["models"] == 4 and len(mixed["groups"]) == 4  # widths 32, 128 x depth 1, 2 in quick mode
    assert 0 < mixed["padding"]["waste"] < 1
    for name, entry in _envelope_entries(result):
        padding = entry["padding"]
        assert padding["executed_macs_per_sample"] >= padding["useful_macs_per_sample"] > 0, name
        assert padding["executed_over_useful"] == pytest.approx(
            padding["executed_macs_per_sample"] / padding["useful_macs_per_sample"]
        )
        assert padding["waste"] == pytest.approx(1 - 1 / padding["executed_over_useful"])
        if entry.get("sweep", {}).get("ratio") == 1.0:
            assert padding["waste"] == 0 and len(entry["groups"]) == 1, name  # equal shapes: the control
    assert set(result["crossover"]) == {"mlp pair", "mlp ladder"}
    for cross in result["crossover"].values():
        assert isinstance(cross["summary"], str) and len(cross["points"]) == 1


@pytest.mark.slow
def test_envelope_quick_run_prints_table(envelope_quick_run):
    _, stdout = envelope_quick_run
    for header in (
        "padded",
        "grouped",
        "serial",
        "padded/serial",
        "grouped/serial",
        "padded/grouped",
        "exec/useful",
        "waste",
        "Where padding stops paying",
        "padded/grouped, mlp pair:",
    ):
        assert header in stdout


def test_envelope_crossover_interpolates_the_waste_at_parity():
    points = [
        {"waste": 0.0, "padded/grouped": 0.98},
        {"waste": 0.1, "padded/grouped": 1.2},
        {"waste": 0.3, "padded/grouped": 1.1},
        {"waste": 0.5, "padded/grouped": 0.9},
    ]
    cross = envelope.crossover(points)
    assert cross["waste_at_parity"] == pytest.approx(0.4)
    assert cross["equal_shape_control"] == [0.98]  # no waste: left out of the crossing
    assert cross["clearly_pays_up_to_waste"] == 0.3 and cross["clearly_loses_from_waste"] == 0.5
    assert envelope.crossover(points[:3])["waste_at_parity"] is None  # pays everywhere
    assert "never pays" in envelope.crossover([{"waste": 0.2, "padded/grouped": 0.5}])["summary"]


def test_envelope_bad_arguments_are_rejected(capsys):
    parser = envelope.build_parser()
    for argv in (["--workloads", "gru"], ["--sweep", "resnet"], ["--mixes", "odd"], ["--ratios", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
    assert envelope.main(["--quick", "--ratios", "1.5", "--workloads", "none", "--quiet"]) == 2
    assert "ratios" in capsys.readouterr().err


# ---------------------------------------------------------------- benchmarks/chaos.py
def chaos_failure(completed, tail=3000):
    """What a failed chaos run printed: every round's verdict (the line "round N: ..." and the
    problems under it, each round's cut to 2500 characters, wherever it is in the output), then
    the output's tails, which hold the summary lines and any error."""
    verdicts, current = [], None
    for line in completed.stdout.splitlines():
        if line.startswith("round "):
            current = [line]
            verdicts.append(current)
        elif line.startswith("chaos: "):
            current = None
        elif current is not None:
            current.append(line)
    rounds = "\n".join("\n".join(lines)[:2500] for lines in verdicts) or "(no round verdict printed)"
    return f"{rounds}\n--- stdout's tail:\n{completed.stdout[-tail:]}\n--- stderr's tail:\n{completed.stderr[-tail:]}"


@pytest.mark.slow
def test_one_chaos_round_kills_a_worker_and_checks_the_invariants(tmp_path):
    """`--seed 0` draws a search with 2 workers, one SIGKILLed mid-run (the 100-round count is in the README)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "chaos.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            "--rounds",
            "1",
            "--seed",
            "0",
            "--storages",
            "journal",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert completed.returncode == 0, chaos_failure(completed)
    [round_] = json.loads(out.read_text())["rounds"]
    assert (round_["command"], round_["workers"], round_["signal"], round_["target"]) == (
        "search",
        2,
        "SIGKILL",
        "worker",
    )
    assert round_["problems"] == [] and round_["compared_with_clean_run"] >= 1
    assert completed.stdout.strip().splitlines()[-1].startswith("chaos: 1 rounds (")
    assert completed.stdout.strip().endswith("1 passed, 0 failed")


@pytest.mark.slow
def test_a_full_disk_round_and_a_sigterm_round_hold_their_invariants(tmp_path):
    """`--faults sigterm,disk --seed 13` draws a PBT run whose --out fills (4 KiB free), then a search of
    3 workers sent SIGTERM once an array is part-way: the first ends with exit 2 naming the full disk and
    no trained member failed, the second with exit 143, its line and nothing RUNNING; the next run of
    each finishes its study as a clean run does, and no mount is left."""
    from benchmarks import _chaos_disk

    why = _chaos_disk.why_not()
    if why is not None:
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "chaos.json"
    argv = ["--faults", "sigterm,disk", "--rounds", "2", "--seed", "13", "--storages", "journal"]
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", *argv, "--keep", str(tmp_path / "rounds"), "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert completed.returncode == 0, chaos_failure(completed)
    full, terminated = json.loads(out.read_text())["rounds"]
    assert (full["fault"], full["command"], full["free_kib"]) == ("disk-full", "pbt", 4)
    assert (terminated["fault"], terminated["command"], terminated["workers"]) == ("sigterm", "search", 3)
    assert full["fault_hit"] and terminated["signal_hit"]
    assert full["problems"] == [] and terminated["problems"] == []
    assert full["compared_with_clean_run"] == 4 and terminated["compared_with_clean_run"] >= 1
    assert not _chaos_disk.mounts_under(tmp_path)


@pytest.mark.slow
def test_two_chaos_rounds_restart_the_database_and_partition_a_host(tmp_path):
    """`--faults network,database --seed 9` draws a database stopped as a crash for 3.4 s under three
    hosts, then one host of three cut off for 9.9 s (past the 6 s heartbeat grace): each round's
    invariants hold and nothing of the hosts' namespaces is left."""
    from benchmarks import _netns, _postgres

    why = _netns.why_not()
    if why is not None:
        pytest.skip(f"no network namespaces: {why}")
    if not (_postgres._binary("initdb") and _postgres._binary("pg_ctl")):
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "chaos.json"
    argv = ["--faults", "network,database", "--rounds", "2", "--seed", "9"]
    argv += ["--partition-seconds", "8-10", "--outage-seconds", "3-5", "--json", str(out)]
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    if "chaos: no PostgreSQL" in completed.stdout:
        pytest.skip(completed.stdout.strip().splitlines()[0])
    assert completed.returncode == 0, chaos_failure(completed)
    record = json.loads(out.read_text())
    rounds = record["rounds"]
    assert [(r["fault"], r["hosts"], r["target"], r["length_s"], r["stop_mode"]) for r in rounds] == [
        ("db-restart", 3, -1, 3.4, "immediate"),
        ("partition", 3, 2, 9.9, ""),
    ]
    assert all(r["problems"] == [] and r["namespaces"] for r in rounds), [r["problems"] for r in rounds]
    assert all(r["codes"] == [0, 0, 0] for r in rounds), [r["codes"] for r in rounds]
    assert set(record["by_fault"]) == {"db-restart", "partition"}
    assert completed.stdout.strip().endswith("2 passed, 0 failed")
    assert "left after the run" not in completed.stdout


@pytest.mark.slow
def test_coverage_quick_run_prints_every_cell_and_its_count(tmp_path):
    from benchmarks import coverage

    out = tmp_path / "coverage.json"
    assert coverage.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["shape"], r["n"]) for r in result["rows"]] == [(s, n) for s in coverage.SHAPES for n in (3, 8)]
    for row in result["rows"]:
        for key in ("mean_t", "mean_bca", "p_better_newcombe", "p_better_bca"):
            assert 0.0 <= row[key] <= 1.0
    assert abs(result["rows"][0]["true_p_better"] - 0.71) < 0.01  # normal data, a shift of 0.78 sd
    assert coverage.worst_headline(result).startswith("coverage: intervals at n >= 5")
    assert [(r["shape"], r["n"]) for r in result["unimodal"]] == [(s, 8) for s in coverage.MODE_SHAPES]
    assert [(r["bad_share"], r["n"]) for r in result["mixtures"]] == [(s, 8) for s in coverage.BAD_SHARES]
    for row in result["mixtures"]:
        assert row["modes_found_when_present"] >= 0.98  # a mode 35 sd lower is found when seeds are in it
    from benchmarks import _coverage_shapes

    assert [(r["shape"], r["n"]) for r in result["shapes"]] == [(s, 8) for s in _coverage_shapes.SHAPES]
    for row in result["shapes"]:  # the exact and DKW intervals hold whatever the shape
        assert row["median_exact"] >= 0.9 and row["bad_exact"] >= 0.9 and row["profile_dkw"] >= 0.9
    assert [g["runs"] for g in result["grids"]] == [16] and result["grids"][0]["per_init_seed"] >= 0.9
    assert [(r["shape"], r["n"]) for r in result["differences"]] == [(s, 8) for s in _coverage_shapes.SHAPES]
    normal = result["differences"][0]  # normal seeds: every interval of a difference and the variance's hold
    assert min(normal[k] for k in ("paired_t", "welch", "paired_t_a_only", "welch_a_only", "variance_chi2")) >= 0.85
    assert next(r for r in result["differences"] if r["shape"] == "t2")["variance_chi2"] == 0.0  # t2 has no variance
    assert [(g["grid"], g["runs"]) for g in result["grid_intervals"]] == [(m, 16) for m in _coverage_shapes.GRID_MODELS]
    normal_grid = result["grid_intervals"][0]
    assert min(normal_grid[k] for k in ("crossed_mean", "init_mls", "data_mls", "residual_chi2")) >= 0.85
    assert len(result["machine_at_start"]["load_1_5_15"]) == 3


@pytest.mark.parametrize("name", ["resnet18", "pointnet", "dcgan", "transformer"])
def test_the_paper_workloads_fuse_exactly(name):
    from benchmarks._workloads import WORKLOADS, prepare

    prep = prepare(WORKLOADS[name], "cpu")
    x = prep.x_train[:4]
    array = hfta_nas.ModelArray.from_factory(prep.factory(), seeds=[0, 1]).eval()
    with torch.no_grad():
        out = array(x, shared_input=True)
        for slot in range(2):
            torch.testing.assert_close(out[slot], prep.build(slot, "cpu").eval()(x), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- benchmarks/search.py: the ray method
@pytest.mark.slow
def test_search_ray_method_runs_the_plain_loop_with_the_same_seeds(tmp_path):
    """`--quick --methods plain,ray`: Ray Tune (OptunaSearch + ASHA) on a local Ray, 2 seeds, about 30 s."""
    pytest.importorskip("ray")
    out = tmp_path / "search-ray.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.search", "--quick", "--methods", "plain,ray", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    n_trials, seeds = result["n_trials"], result["seeds"]
    assert list(result["runs"]) == ["plain", "ray"] and seeds == [0, 1]
    assert result["processes"] == min(len(os.sched_getaffinity(0)), 2)  # default: the cores, at most 2 when quick
    for run in result["runs"]["ray"]:
        states = run["trials"]
        assert sum(states.values()) == n_trials, states
        assert states["RUNNING"] == states["WAITING"] == states["FAIL"] == 0, states
        assert states["COMPLETE"] >= 1
        assert run["startup_s"] > 0  # not in the wall time, which starts with the tuner
        assert 0 < run["first_trial_s"] < run["first_result_s"] <= run["seconds"]
        assert run["reduction_factor"] == 2 and run["processes"] == result["processes"]
        curve = run["curve"]
        assert curve and curve[0][0] >= 0 and curve[-1][0] <= run["seconds"] + 1.0 and run["best_value"] == curve[-1][1]
        assert 1 <= run["epochs_trained"] <= n_trials * result["epochs"]
    # The same sampler seed proposes trial 0 alike in both; trained by the same loop with the same
    # trial seeds, it must give the same values for every epoch Ray ran (ASHA may stop it early).
    same = {pair["number"]: pair for pair in result["same_trials_ray"]}
    assert 0 in same and same[0]["ray_values"]
    for step, value in same[0]["ray_values"].items():
        assert value == pytest.approx(same[0]["plain_values"][step], abs=1e-9)
    assert "ray: start-up" in done.stdout and "same number and parameters in plain and ray" in done.stdout


def test_search_ray_method_without_ray_fails_with_one_clear_line(monkeypatch, capsys):
    from benchmarks import search

    monkeypatch.setattr(search, "ray_available", lambda: False)
    assert search.main(["--quick", "--methods", "plain,ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hfta-nas[bench]" in err


def test_the_forward_checks_benchmark_runs_and_writes_its_json(tmp_path):
    """The harness of docs/engine.md's cost figures: both variants trained, the slot-by-slot one really looped."""
    from benchmarks import forward_checks

    result = forward_checks.main(["--quick", "--json", str(tmp_path / "f.json")])
    assert json.loads((tmp_path / "f.json").read_text()) == result
    assert [row["slots"] for row in result["slot_by_slot"]] == [2, 4]
    assert all(row["ratio"] > 0 and row["fused_step_s"] > 0 for row in result["slot_by_slot"])
    assert [row["batch"] for row in result["running_check"]] == [32, 64]
