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

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks._report import RATIOS, ratios  # noqa: E402
from benchmarks.throughput import build_parser, main  # noqa: E402
METHODS = ["serial", "processes", "vmap", "array", "limit"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.throughput", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=85,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), completed.stdout


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


def test_quick_run_fused_methods_match_serial_first_loss(quick_run):
    result, _ = quick_run
    assert result["flags"] == []
    for by_batch in result["results"].values():
        for entry in by_batch.values():
            for method in ("serial", "vmap", "array"):
                equivalence = entry["methods"][method]["equivalence"]
                assert equivalence["ok"] and equivalence["rel_diff"] <= 1e-4
                assert entry["methods"][method]["flag"] is None


def test_quick_run_records_machine_and_prints_table(quick_run):
    result, stdout = quick_run
    machine = result["machine"]
    for key in ("cpu_count", "torch", "threads", "device_name"):
        assert machine[key] not in (None, "")
    assert machine["threads"] == 1
    assert result["duration_s"] > 0
    for header in ("serial", "processes", "vmap", "array", "limit", "array/serial", "array/vmap", "processes/serial", "T_limit/T_array"):
        assert header in stdout


def test_ratios_handle_unsupported_cells():
    cells = {
        "serial": {"samples_per_s": 100.0},
        "processes": {"samples_per_s": None, "unsupported": "skipped"},
        "vmap": {"samples_per_s": None, "unsupported": "no batching rule"},
        "array": {"samples_per_s": 400.0},
        "limit": {"samples_per_s": 500.0},
    }
    assert ratios(cells) == {"array/serial": 4.0, "array/vmap": None, "processes/serial": None, "fusion_efficiency": 0.8}


def test_bad_arguments_are_rejected(capsys):
    parser = build_parser()
    for argv in (["--batches", "0"], ["--batches", "x"], ["--workloads", "resnet"], ["--methods", "jit"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
    assert main(["--warmup", "1", "--threads", "0", "--workloads", "mlp", "--batches", "1", "--quiet"]) == 2
    assert "threads" in capsys.readouterr().err


# ---------------------------------------------------------------- benchmarks/search.py
@pytest.fixture(scope="module")
def search_quick_run(tmp_path_factory):
    """`hfta-nas bench search --quick`: both sides on the shipped mnist1d_cnn space, tiny budget."""
    out = tmp_path_factory.mktemp("bench-search") / "search.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = Path(sys.executable).with_name("hfta-nas")  # the installed console script, else the same entry point
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cli"]
    completed = subprocess.run([*command, "bench", "search", "--quick", "--out", str(out)],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), completed.stdout


def test_search_quick_run_has_both_methods(search_quick_run):
    result, stdout = search_quick_run
    assert result["quick"] is True and result["threads"] == 1 and result["device"] == "cpu"
    assert result["metric"] == "val_acc" and result["direction"] == "maximize"
    n_trials = result["n_trials"]
    assert n_trials == 4 and result["epochs"] == 2
    for side in ("plain", "search"):
        figures = result["methods"][side]
        assert math.isfinite(figures["seconds"]) and figures["seconds"] > 0, side
        assert math.isfinite(figures["cpu_seconds"]) and figures["cpu_seconds"] > 0, side
        states = figures["trials"]
        assert sum(states.values()) == n_trials and states["RUNNING"] == states["WAITING"] == 0, (side, states)
        assert states["COMPLETE"] >= 1, (side, states)
        assert len(figures["final_values"]) == states["COMPLETE"]
        assert 0.0 <= figures["best_value"] <= 1.0 and figures["best_value"] == max(figures["final_values"])
        assert min(figures["final_values"]) <= figures["median_final"] <= figures["best_value"]
        assert figures["mean_final"] == pytest.approx(sum(figures["final_values"]) / len(figures["final_values"]))
        assert 1 <= figures["epochs_trained"] <= n_trials * result["epochs"]
        assert figures["seconds_per_epoch"] == pytest.approx(figures["seconds"] / figures["epochs_trained"])
        assert set(figures["best_params"]) == {"training.optimizer.lr", "training.optimizer.weight_decay",
                                               "model.config.channels", "model.config.kernel_size"}
    assert result["methods"]["search"]["arrays"] >= 1
    plain, search = result["methods"]["plain"], result["methods"]["search"]
    assert result["ratio"] == pytest.approx(plain["seconds"] / search["seconds"])
    assert result["ratio_cpu"] == pytest.approx(plain["cpu_seconds"] / search["cpu_seconds"])
    assert result["ratio_per_epoch"] == pytest.approx(plain["seconds_per_epoch"] / search["seconds_per_epoch"])
    for key in ("python", "torch", "optuna", "hfta_nas"):
        assert result["versions"][key]
    # Trial 0 is sampled alike on both sides (same sampler seed, no results yet) and trained
    # with the same seeds: the plain loop and the array must then agree epoch by epoch.
    same = {pair["number"]: pair for pair in result["same_trials"]}
    assert 0 in same
    for step, value in same[0]["plain_values"].items():
        assert same[0]["search_values"][step] == pytest.approx(value, abs=0.02)
    for header in ("plain", "search", "wall s", "best val_acc", "mean final", "median final", "plain / search wall time",
                   "1 torch threads"):
        assert header in stdout


# ---------------------------------------------------------------- benchmarks/envelope.py
from benchmarks import envelope  # noqa: E402

ENVELOPE_METHODS = ["padded", "grouped", "serial"]


@pytest.fixture(scope="module")
def envelope_quick_run(tmp_path_factory):
    """`python -m benchmarks.envelope --quick` cut down to one mixed workload and two tiny sweep series (a few seconds)."""
    out = tmp_path_factory.mktemp("bench-envelope") / "envelope.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.envelope", "--quick", "--threads", "1", "--workloads", "mlp",
         "--sweep", "mlp", "--mixes", "pair,ladder", "--ratios", "1,0.5", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), completed.stdout


def _envelope_entries(result):
    yield from result["results"].items()
    yield from ((point["name"], point) for point in result["sweep"])


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


def test_envelope_quick_run_reports_padding_waste(envelope_quick_run):
    result, _ = envelope_quick_run
    mixed = result["results"]["mlp"]
    assert mixed["models"] == 4 and len(mixed["groups"]) == 4  # widths 32, 128 x depth 1, 2 in quick mode
    assert 0 < mixed["padding"]["waste"] < 1
    for name, entry in _envelope_entries(result):
        padding = entry["padding"]
        assert padding["executed_macs_per_sample"] >= padding["useful_macs_per_sample"] > 0, name
        assert padding["executed_over_useful"] == pytest.approx(
            padding["executed_macs_per_sample"] / padding["useful_macs_per_sample"])
        assert padding["waste"] == pytest.approx(1 - 1 / padding["executed_over_useful"])
        if entry.get("sweep", {}).get("ratio") == 1.0:
            assert padding["waste"] == 0 and len(entry["groups"]) == 1, name  # equal shapes: the control
    assert set(result["crossover"]) == {"mlp pair", "mlp ladder"}
    for cross in result["crossover"].values():
        assert isinstance(cross["summary"], str) and len(cross["points"]) == 1


def test_envelope_quick_run_prints_table(envelope_quick_run):
    _, stdout = envelope_quick_run
    for header in ("padded", "grouped", "serial", "padded/serial", "grouped/serial", "padded/grouped", "exec/useful",
                   "waste", "Where padding stops paying", "padded/grouped, mlp pair:"):
        assert header in stdout


def test_envelope_crossover_interpolates_the_waste_at_parity():
    points = [{"waste": 0.0, "padded/grouped": 0.98}, {"waste": 0.1, "padded/grouped": 1.2},
              {"waste": 0.3, "padded/grouped": 1.1}, {"waste": 0.5, "padded/grouped": 0.9}]
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
