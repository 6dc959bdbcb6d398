"""benchmarks/ask_batch.py runs end to end (`--quick`): the default search with other ask policies.

This checks the script, not the sampler's quality: every variant ran on the same seed with the pool it
names, no search asked more before its first result than its pool, and the comparisons with `shipped`
are those of the runs."""

import json

import pytest

from tests._benchmark_runs import run_from_checkout

pytestmark = pytest.mark.xdist_group(name="benchmarks")  # one process runs the benchmark files


@pytest.mark.slow
def test_quick_run_compares_each_ask_policy_with_the_shipped_one(tmp_path):
    out = tmp_path / "ask-batch.json"
    run_from_checkout("-m", "benchmarks.ask_batch", "--quick", "--n-trials", "4", "--pools", "2", "--out", str(out))
    result = json.loads(out.read_text())
    runs, variants = result["runs"], result["summary"]["variants"]
    assert list(runs) == ["shipped", "pool-2", "no-liar"] and result["seeds"] == [0]
    assert [runs[v][0]["pool"] for v in runs] == ["auto", 2, "auto"]  # auto: the search's own pool
    for variant, (row,) in runs.items():
        pool = result["n_trials"] if row["pool"] == "auto" else row["pool"]
        assert 1 <= row["asked_before_first_result"] <= min(pool * 2, result["n_trials"]), variant
        assert sum(row["trials"].values()) == result["n_trials"], variant
        shipped = runs["shipped"][0]["best_value"]
        assert variants[variant]["best_minus_shipped"]["median"] == pytest.approx(row["best_value"] - shipped)
    assert variants["shipped"]["best_minus_shipped"]["median"] == 0.0
    assert len(result["machine"]["load_average_before"]) == 3 and "torch" in result["versions"]


@pytest.mark.slow
def test_without_pools_it_compares_the_liar_alone_from_the_first_seed_given(tmp_path):
    out = tmp_path / "liar.json"
    options = ["--quick", "--n-trials", "3", "--pools", "none", "--first-seed", "3"]
    run_from_checkout("-m", "benchmarks.ask_batch", *options, "--out", str(out))
    result = json.loads(out.read_text())
    assert list(result["runs"]) == ["shipped", "no-liar"] and result["seeds"] == [3]
    assert [row["seed"] for rows in result["runs"].values() for row in rows] == [3, 3]
