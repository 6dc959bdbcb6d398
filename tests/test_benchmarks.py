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
