"""The GPU benchmarks (issues 45 and 46) stay runnable without a GPU: their budgeting, the rules they
derive, and their quick runs on the CPU writing the JSON a GPU run writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._rendezvous import GUARD_S

# one test process runs the quick runs (pytest-xdist --dist loadgroup), beside the other benchmarks' runs
pytestmark = pytest.mark.xdist_group(name="benchmarks")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu, gpu_jobs  # noqa: E402 - after the sys.path line above
from benchmarks._phases import Phase, allocate  # noqa: E402
from benchmarks.lowering import rule  # noqa: E402


def test_a_short_budget_drops_the_last_phases_and_hands_their_shares_on():
    phases = [Phase("a", 0.5, 100, "m"), Phase("b", 0.3, 50, "m"), Phase("c", 0.2, 60, "m")]
    assert allocate(phases, 1000) == {"a": 500, "b": 300, "c": 200}
    assert allocate(phases, 200) == {"a": 125, "b": 75}  # c's 40 s < its 60: dropped, a and b share 200 as 5:3
    # b would fit, but a does not beside it: the last phase goes first, whatever fits
    assert allocate([Phase("a", 0.1, 100, "m"), Phase("b", 0.1, 10, "m"), Phase("c", 0.8, 1, "m")], 180) == {"a": 180}
    assert allocate(phases, 90) == {}  # not even the first phase fits


def test_the_default_phases_fit_the_default_budget_whole():
    for module in (gpu, gpu_jobs):
        phases = module.phases(quick=False)
        assert set(allocate(phases, module.BUDGET_S)) == {p.name for p in phases}, module.__name__
        assert abs(sum(p.share for p in phases) - 1.0) < 1e-9


def _point(kind, macs, grouped_over_loop):
    return {"kind": kind, "per_slot_macs": macs, "grouped_over_loop": grouped_over_loop}


def test_the_lowering_rule_loops_from_the_size_where_the_loop_keeps_winning():
    points = [
        _point("conv2d", 1e5, 0.5),
        _point("conv2d", 1e6, 1.2),  # one win below a loss does not start the rule
        _point("conv2d", 1e7, 0.9),
        _point("conv2d", 1e8, 1.3),
        _point("conv2d", 1e9, 2.0),
        _point("conv1d", 1e6, 0.8),
        _point("conv1d", 1e8, 1.02),  # within the noise factor: not a win
        _point("batchnorm2d", 1e5, 1.5),
        _point("batchnorm2d", 1e6, 0.7),
        _point("batchnorm2d", 1e7, 0.8),
    ]
    found = rule(points)
    assert found["conv2d"]["loop_from_per_slot_macs"] == 1e8
    assert found["conv1d"]["loop_from_per_slot_macs"] is None
    assert found["batchnorm2d"]["prefer"] == "grouped"


def _throughput(workload, ratios):
    return {
        "phase": f"throughput {workload}",
        "environment": {},
        "figures": {"results": {workload: {"64": {"ratios": ratios}}}},
    }


def test_the_targets_are_read_from_the_float32_tables_and_profiled_where_missed():
    records = [
        _throughput("mlp", {"array/serial": 40.0, "array/vmap": 2.0, "fusion_efficiency": 0.9}),
        _throughput("cnn1d", {"array/serial": 12.0, "array/vmap": 1.6, "fusion_efficiency": 0.85}),
    ]
    found = {t["target"]: t for t in gpu.targets(records)}
    assert found["mlp array/serial"]["met"] is True and found["cnn1d array/serial"]["met"] is False
    assert found["resnet18 array/serial"]["value"] is None and found["resnet18 array/serial"]["met"] is None
    profiles = gpu.phases(quick=False)[[p.name for p in gpu.phases(quick=False)].index("profiles")].expand(records)
    assert [p.name for p in profiles] == ["profile cnn1d"]
    assert profiles[0].arguments[:6] == ["--workload", "cnn1d", "--batch", "64", "--method", "array"]


def _quick(module: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{module}.json"
    done = subprocess.run(
        [sys.executable, "-m", module, "--device", "cpu", "--quick", "--budget-s", "3000", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_the_gpu_benchmark_quick_run_finishes_every_phase_and_derives_its_rules(tmp_path):
    record = _quick("benchmarks.gpu", tmp_path)
    names = [p["phase"] for p in record["phases"]]
    assert names == ["throughput mlp", "lowering layers", "knee", "profile mlp", "lowering grouped", "dropout"]
    assert all(p["how"] == "finished" for p in record["phases"]), [p["how"] for p in record["phases"]]
    assert record["phases"][-2]["environment"] == {"HFTA_NAS_LOWERING": "grouped"}
    dropout = record["phases"][-1]["figures"]
    assert dropout["device"] == "cpu" and [row["slots"] for row in dropout["rows"]] == [2]
    assert dropout["rows"][0]["array_s"] > 0 and dropout["rows"][0]["torch_s"] > 0
    assert "ms per step" in record["phases"][3]["output_tail"]  # the profile's printed breakdown
    lowering = record["rules"]["cuda_lowering"]["per_layer"]
    assert set(lowering) == {"conv1d", "conv2d", "batchnorm2d"}
    assert record["rules"]["array_size"]["knee_per_workload"]["mlp"] in (1, 2, 4)
    mlp = {t["target"]: t for t in record["targets"]}["mlp array/serial"]
    assert mlp["value"] > 0 and mlp["profile"] == "profile mlp"


@pytest.mark.slow
def test_the_gpu_jobs_quick_run_finishes_every_job(tmp_path):
    record = _quick("benchmarks.gpu_jobs", tmp_path)
    assert [p["phase"] for p in record["phases"]] == ["stability", "search cnn1d", "search cifar-shaped", "pbt"]
    assert all(p["how"] == "finished" for p in record["phases"]), [p["output_tail"] for p in record["phases"]]
    figures = {p["phase"]: p["figures"] for p in record["phases"]}
    stability = figures["stability"]
    # the plain runs in processes are the plain runs: the same seeds give the same accuracies
    assert sorted(stability["processes"]["acc"]) == sorted(stability["plain"]["acc"])
    assert stability["plain"]["runs_measured"] == 4 and not stability["plain"]["extrapolated"]
    for name in ("search cnn1d", "search cifar-shaped"):
        assert set(figures[name]["runs"]) == {"plain", "processes", "pack"} and figures[name]["seeds"] == [0]
        assert figures[name]["targets"]["pack_speedup_over_plain"] > 0
    assert set(figures["pbt"]["runs"]) == {"pbt", "tpe"} and "Ray" in figures["pbt"]["ray_pbt"]
    assert record["targets"]["stability_plain_over_array"] > 0


def test_every_phase_passes_arguments_its_module_accepts():
    from benchmarks import dropout, envelope, throughput

    parsers = {
        "benchmarks.throughput": throughput.build_parser(),
        "benchmarks.envelope": envelope.build_parser(),
        "benchmarks.dropout": dropout.build_parser(),
    }
    checked = 0
    for phase in gpu.phases(quick=False):
        if phase.module in parsers:  # argparse exits 2 on an unknown option or value
            parsers[phase.module].parse_args([*phase.arguments, "--device", "cuda", "--out", "x.json"])
            checked += 1
    assert checked == 10
    from benchmarks._job_phases import build_parser

    for phase in gpu_jobs.phases(quick=False):
        build_parser().parse_args([*phase.arguments, "--device", "cuda", "--out", "x.json", "--deadline-s", "60"])


def _array_at_64(workload, rate):
    return {"results": {workload: {"64": {"methods": {"array": {"samples_per_s": rate}}}}}}


def test_the_rules_cite_the_lowering_and_knee_phases():
    records = [
        {"phase": "lowering layers", "figures": {"slots": 64, "rule": {"conv2d": {"loop_from_per_slot_macs": 1e8}}}},
        {
            "phase": "knee",
            "figures": {"workloads": {"mlp": {"knee": 128}, "cnn1d": {"knee": 32}}, "suggested_cap": 128},
        },
        {"phase": "lowering loop", "figures": _array_at_64("resnet18", 1000.0)},
        {"phase": "lowering grouped", "figures": _array_at_64("resnet18", 1500.0)},
    ]
    found = gpu.rules(records)
    assert found["cuda_lowering"]["per_layer"]["conv2d"]["loop_from_per_slot_macs"] == 1e8
    assert found["cuda_lowering"]["whole_models_at_B64"]["resnet18"]["grouped_over_loop"] == 1.5
    assert found["array_size"]["knee_per_workload"] == {"mlp": 128, "cnn1d": 32}
    assert found["array_size"]["suggested_cap"] == 128
    assert gpu.rules([])["array_size"]["suggested_cap"] is None  # nothing measured: nothing suggested


def test_the_search_targets_compare_pack_with_plain_and_the_processes_by_their_medians():
    from benchmarks._job_phases import search_targets

    def method(speedup, best, seconds, to_target):
        median = lambda v: {"median": v}  # noqa: E731 - benchmarks._anytime.spread's shape
        return {
            "speedup": median(speedup),
            "best_value": median(best),
            "seconds": median(seconds),
            "time_to_target": median(to_target),
        }

    methods = {
        "pack": method(5.0, 0.5, 10, 4),
        "plain": method(1.0, 0.75, 50, 40),
        "processes": method(2, 0.7, 25, None),
    }
    found = search_targets({"methods": methods}, "minimize")  # a loss: pack's 0.5 is better by 0.25
    assert found["pack_speedup_over_plain"] == 5.0 and found["pack_better_than_plain_by"] == 0.25
    assert found["pack_seconds_over_processes_seconds"] == 0.4
    assert found["time_to_plain_median_best_s"] == {"pack": 4, "plain": 40, "processes": None}
