"""The PBT benchmark runs end to end (`--quick`) and writes every method's figures.

This checks the script, not the timings: each of the five methods ran once on
the quick budget, its figures are finite, the summary's head-to-head ratios are
those of the runs (one statistic for every method: the final value of what it
exports), and the plain loop Ray's members train is the `plain` method's loop.
"""

import json
import math
from pathlib import Path

import pytest

from tests._benchmark_runs import run_from_checkout

pytest.importorskip("ray.tune", reason="the ray_pbt method needs Ray Tune: pip install 'hfta-nas[bench]'")

# one test process runs the benchmark files (pytest-xdist --dist loadgroup), so quick runs do not overlap
pytestmark = pytest.mark.xdist_group(name="benchmarks")

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["pbt", "tpe", "plain", "ray_pbt", "ray_pbt_sync"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-pbt") / "pbt.json"
    completed = run_from_checkout("-m", "benchmarks.pbt", "--quick", "--out", str(out))
    return json.loads(out.read_text()), out.with_suffix(".txt").read_text(), completed.stdout


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.slow
def test_quick_run_has_every_method_with_finite_figures(quick_run):
    result, table, stdout = quick_run
    assert result["quick"] is True and result["threads"] == 1 and result["seeds"] == [0]
    assert (result["population"], result["epochs"], result["interval"]) == (4, 4, 2)
    assert list(result["runs"]) == METHODS and list(result["summary"]["methods"]) == METHODS
    budget = result["population"] * result["epochs"]
    for method, runs in result["runs"].items():
        (run,) = runs
        assert _finite(run["seconds"]) and run["seconds"] > 0, method
        assert _finite(run["best_value"]) and 0.0 <= run["best_value"] <= 1.0, method
        assert _finite(run["epochs_trained"]) and run["epochs_trained"] >= 1, method
        curve = run["curve"]  # best so far: never goes back, and within the run's clock
        assert curve and all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(curve, curve[1:])), method
        assert curve[0][0] >= 0 and curve[-1][0] <= run["seconds"] + 1.0, method
        cell = result["summary"]["methods"][method]
        assert all(_finite(cell[key]["median"]) for key in ("seconds", "best_value", "epochs_trained")), method
    assert result["runs"]["pbt"][0]["epochs_trained"] == budget  # a PBT member is never pruned
    assert result["runs"]["tpe"][0]["epochs_trained"] <= budget >= result["runs"]["plain"][0]["epochs_trained"]
    for method in ("ray_pbt", "ray_pbt_sync"):
        ray = result["runs"][method][0]
        assert ray["synch"] is (method == "ray_pbt_sync")
        assert _finite(ray["startup_s"]) and ray["cpus"] == result["machine"]["cores_available"]  # the same cores
        assert _finite(ray["actor_startup_s"]) and 0 <= ray["actor_startup_s"] <= ray["seconds"]
        assert all(_finite(v) and v >= 0 for v in ray["checkpoint"].values())
        assert ray["checkpoint"]["save_s"] > 0  # every member saved at the interval
    for method in ("pbt", "ray_pbt", "ray_pbt_sync"):  # what is exported, at the end: no transient peak
        (run,) = result["runs"][method]
        assert run["curve"] == [[pytest.approx(run["curve"][0][0]), run["best_value"]]], method
    assert _finite(result["cold_startup_s"]) and result["cold_startup_s"] > 0
    assert isinstance(result["machine"]["busy"], bool) and "torch" in result["versions"]
    assert table == stdout and all(method in table for method in METHODS)


@pytest.mark.slow
def test_quick_run_ratios_are_those_of_the_runs(quick_run):
    result, _, _ = quick_run
    runs, pairs = result["runs"], result["summary"]["head_to_head"]
    expected = ("pbt_over_tpe", "pbt_over_plain", "tpe_over_plain", "ray_pbt_over_pbt", "ray_pbt_sync_over_pbt")
    assert set(pairs) == set(expected)
    (ray,), (pbt,), (tpe,) = runs["ray_pbt"], runs["pbt"], runs["tpe"]
    ray_over_pbt = pairs["ray_pbt_over_pbt"]
    assert ray_over_pbt["wall"]["per_seed"] == [pytest.approx(ray["seconds"] / pbt["seconds"])]
    per_epoch = (ray["seconds"] / ray["epochs_trained"]) / (pbt["seconds"] / pbt["epochs_trained"])
    assert ray_over_pbt["per_slot_epoch"]["per_seed"] == [pytest.approx(per_epoch)]
    neither = (ray["seconds"] - ray["actor_startup_s"]) / pbt["seconds"]
    both = (ray["seconds"] + ray["startup_s"]) / (pbt["seconds"] + result["cold_startup_s"])
    assert ray_over_pbt["wall_startup_neither"]["per_seed"] == [pytest.approx(neither)]
    assert ray_over_pbt["wall_startup_both"]["per_seed"] == [pytest.approx(both)]
    # the common target is the worse of the two finals, which both reach: a finite ratio of their times to it
    (to_target,) = pairs["pbt_over_tpe"]["time_to_common_target"]["per_seed"]
    assert _finite(to_target) and to_target > 0
    assert pairs["pbt_over_tpe"]["final_difference"]["per_seed"] == [
        pytest.approx(pbt["best_value"] - tpe["best_value"])
    ]
    assert result["summary"]["target"] == tpe["best_value"]
    share = result["summary"]["ray"]["ray_pbt"]["checkpoint_share_of_wall"]["median"]
    assert share == pytest.approx(ray["checkpoint"]["total_s"] / ray["seconds"])


@pytest.mark.slow
def test_members_start_as_the_plain_trials_of_the_same_number(quick_run):
    # Before the first exploit, member k of every method is trial k of plain: same params, same seeds.
    # Ray's members run the plain loop itself (equal values); the arrays agree to a sample or two.
    same = quick_run[0]["summary"]["same_start"]
    assert set(same) == {"pbt", "tpe", "ray_pbt", "ray_pbt_sync"}
    population, interval = quick_run[0]["population"], quick_run[0]["interval"]
    for method in ("ray_pbt", "ray_pbt_sync"):
        assert same[method] == {"compared": population * interval, "max_difference": 0.0}, method
    for method in ("pbt", "tpe"):
        assert same[method]["compared"] >= interval and same[method]["max_difference"] <= 0.02, method
