"""Studies that stop when they are decided: the anytime-valid confidence sequences against
their reference (confseq's hedged CS, the beta-binomial mixture from scipy's pmfs) and their
coverage in a small fixed-seed simulation, the round loop, and `--until` end to end."""

import json
import math
from types import SimpleNamespace

import numpy as np
import optuna
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy import stats

from hfta_nas.cli import main
from hfta_nas.search import open_storage
from hfta_nas.stability._rounds import Question, answer, decided, parse_until, run_rounds
from hfta_nas.stability._sequential import bernoulli_cs, hedged_cs, median_cs, running_median_cs
from tests.test_stability import TINY

# Observations in [0.55, 0.95] in a fixed order (no random generator: the same on every numpy).
FIXED = 0.55 + 0.4 * ((np.arange(1, 41) * 0.6180339887498949) % 1) ** 2
# confseq 0.0.11's confseq.betting.hedged_cs(FIXED, alpha) (its pure-Python betting module; the
# package itself needs a C++ build) at t = 4, 10, 20, 40.
CONFSEQ = {
    0.05: ([0.169, 0.356, 0.477, 0.565], [1.0, 0.842, 0.779, 0.745]),
    0.2: ([0.267, 0.444, 0.539, 0.603], [0.9, 0.801, 0.751, 0.729]),
}


@pytest.mark.parametrize("alpha", sorted(CONFSEQ))
def test_the_hedged_cs_gives_confseqs_bounds(alpha):
    lower, upper = hedged_cs(FIXED, alpha=alpha)
    expected_lower, expected_upper = CONFSEQ[alpha]
    np.testing.assert_allclose(lower[[3, 9, 19, 39]], expected_lower, atol=1e-12)
    np.testing.assert_allclose(upper[[3, 9, 19, 39]], expected_upper, atol=1e-12)


def test_the_hedged_cs_equals_the_installed_confseq():
    betting = pytest.importorskip("confseq.betting")
    x = np.random.default_rng(3).beta(8, 3, size=60)
    np.testing.assert_array_equal(hedged_cs(x), betting.hedged_cs(x, alpha=0.05))


@pytest.mark.parametrize("successes,trials", [(0, 32), (3, 32), (16, 32), (31, 32), (32, 32), (7, 200)])
def test_the_bernoulli_bounds_are_where_the_mixture_wealth_reaches_one_over_alpha(successes, trials):
    low, high = bernoulli_cs(successes, trials, alpha=0.05)

    def wealth(p):  # marginal likelihood under Beta(1/2, 1/2) over the likelihood at p
        return stats.betabinom.pmf(successes, trials, 0.5, 0.5) / stats.binom.pmf(successes, trials, p)

    for bound, edge in ((low, 0.0), (high, 1.0)):
        if bound == edge:  # the edge itself is not rejected
            assert wealth(edge) < 20
        else:
            assert wealth(bound) == pytest.approx(20, rel=1e-8)
    assert low <= successes / trials <= high


def test_the_sequences_cover_the_truth_at_every_look_in_95_percent_of_studies():
    """200 studies of 64 seeds from a skewed accuracy distribution (Beta(8, 3), mean 8/11); a study
    misses if its interval excludes the truth at any of its 64 looks."""
    rng = np.random.default_rng(20260101)
    mean, median = 8 / 11, stats.beta(8, 3).median()
    missed = {"mean": 0, "median": 0}
    for _ in range(200):
        x = rng.beta(8, 3, size=64)
        lower, upper = hedged_cs(x)
        missed["mean"] += bool(np.any((lower > mean) | (upper < mean)))
        low, high = running_median_cs(x)
        missed["median"] += not low <= median <= high
    assert missed["mean"] <= 10 and missed["median"] <= 10  # 5% of 200
    rates = [0.02, 0.1, 0.3]
    missed_rate = 0
    for p in rates * 100:
        draws = rng.random(100) < p
        counts = np.cumsum(draws)
        missed_rate += any(
            not low <= p <= high for low, high in (bernoulli_cs(int(k), t + 1) for t, k in enumerate(counts))
        )
    assert missed_rate <= 15  # 5% of 300


def test_the_hedged_cs_carries_its_capital_across_chunks(monkeypatch):
    from hfta_nas.stability import _sequential

    whole = hedged_cs(FIXED)
    monkeypatch.setattr(_sequential, "_CHUNK", 7)
    np.testing.assert_allclose(hedged_cs(FIXED), whole, atol=1e-12)


def test_the_running_median_interval_is_the_intersection_over_every_prefix():
    x = np.random.default_rng(5).beta(5, 2, size=120)
    prefixes = np.array([median_cs(x[:t]) for t in range(1, len(x) + 1)])
    assert running_median_cs(x) == (prefixes[:, 0].max(), prefixes[:, 1].min())


def test_the_median_interval_is_an_order_statistic_interval_around_the_sample_median():
    x = np.linspace(0.6, 0.8, 41)
    low, high = median_cs(x)
    assert low in x and high in x and low < np.median(x) < high
    assert median_cs(x[:3]) == (0.0, 1.0)  # three seeds cannot bound a median at 95%


def seeds_frame(values, failed=()):
    return pd.DataFrame(
        {
            "config": "a",
            "design": "all",
            "seed_index": range(len(values)),
            "status": ["failed" if i in failed else "completed" for i in range(len(values))],
            "test_acc": values,
        }
    )


def fake_study(values, failed=()):
    """train(n) for run_rounds: the first n of `values`, as a stored study would return them."""
    asked = []

    def train(n):
        asked.append(n)
        reused = asked[-2] if len(asked) > 1 else 0
        result = SimpleNamespace(seeds=seeds_frame(values[:n], failed), metadata={"reused_seeds": reused})
        return result, {}

    return train, asked


def test_the_rounds_stop_at_the_first_look_that_answers_the_question():
    values = np.full(400, 0.75) + 0.01 * np.sin(np.arange(400))  # a narrow spread: known fast
    train, asked = fake_study(values)
    result, _ = run_rounds(
        Question("precision", "mean", 0.02, "mean±2%"), train, round_seeds=8, max_seeds=400, metric="test_acc"
    )
    record = result.metadata["sequential"]
    assert record["decided"] and asked == [8 * (i + 1) for i in range(len(asked))]
    assert [look["decided"] for look in record["rounds"]] == [False] * (len(asked) - 1) + [True]
    half = (record["rounds"][-1]["answers"][0]["high"] - record["rounds"][-1]["answers"][0]["low"]) / 2
    assert half <= 0.02 + 1e-12 and result.metadata["reused_seeds"] == 0


def test_the_rounds_stop_at_max_seeds_when_the_question_stays_open():
    train, asked = fake_study(np.full(40, 0.7), failed=range(0, 40, 5))  # a 20% failure rate
    result, _ = run_rounds(
        Question("fail", None, 0.19, "fail<0.19"), train, round_seeds=16, max_seeds=40, metric="test_acc"
    )
    assert asked == [16, 32, 40] and not result.metadata["sequential"]["decided"]


def test_a_clear_failure_rate_is_decided_either_way():
    below, _ = fake_study(np.full(64, 0.7))
    above, _ = fake_study(np.full(64, 0.7), failed=range(0, 64, 2))
    for train, verdict in ((below, "below 10.00%"), (above, "not below 10.00%")):
        result, _ = run_rounds(
            Question("fail", None, 0.1, "fail<0.1"), train, round_seeds=8, max_seeds=64, metric="test_acc"
        )
        last = result.metadata["sequential"]["rounds"][-1]
        assert last["decided"] and last["answers"][0]["text"].endswith(verdict)


def test_a_half_width_equal_to_the_one_asked_decides():
    """Test accuracies are multiples of 1/n_test: [73.3%, 75.3%] is ±1% though (0.753 - 0.733) / 2 > 0.01
    in floats. The 64 seeds arrive from the outside in (smallest, largest, ...), so no prefix's
    interval is narrower than the last; 64 seeds bound the median by the 19th and 46th smallest."""
    ranked = np.round(
        np.r_[0.713 + 0.001 * np.arange(18), np.linspace(0.733, 0.753, 28), 0.754 + 0.001 * np.arange(18)], 3
    )
    values = np.ravel(np.column_stack([ranked[:32], ranked[::-1][:32]]))
    (result,) = answer(Question("precision", "median", 0.01, "median±1%"), seeds_frame(values), "test_acc", None)
    assert (result.low, result.high) == (0.733, 0.753) and result.decided


def test_run_study_takes_decided_as_text():
    assert parse_until("decided median") == decided("median") and parse_until("decided").statistic == "mean"


@pytest.mark.parametrize(
    "text,statistic,bound",
    [
        ("mean±0.5%", "mean", 0.005),
        ("mean+-0.01", "mean", 0.01),
        ("median ± 1%", "median", 0.01),
        ("fail<0.1", None, 0.1),
    ],
)
def test_until_reads_as_written(text, statistic, bound):
    question = parse_until(text)
    assert question.statistic == statistic and math.isclose(question.bound, bound)
    assert question.kind == ("fail" if statistic is None else "precision")


def test_the_median_decides_a_consistent_small_difference_the_mean_cannot_yet():
    """A better by 1 point (± 0.4) on the same seeds: the signs decide within 64 pairs, while the
    mean's sequence, which must allow any pair to differ by up to 100 points, is still open."""
    rng = np.random.default_rng(7)
    a = 0.75 + rng.normal(0, 0.01, 64)
    b = a - 0.01 + rng.normal(0, 0.004, 64)
    seeds = pd.concat([seeds_frame(a).assign(config="a"), seeds_frame(b).assign(config="b")])
    (by_median,) = answer(decided("median"), seeds, "test_acc", None)
    (by_mean,) = answer(decided("mean"), seeds, "test_acc", None)
    assert by_median.decided and by_median.low > 0 and by_median.text.endswith("a better")
    assert not by_mean.decided and by_mean.low < 0 < by_mean.high


# ----------------------------------------------------------------- commands
def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--until", "avg±1"], "--until: expected mean±X, median±X or fail<Y"),
        (["--until", "mean±1"], "below 0.5 (did you mean 1%?)"),
        (["--until", "fail<10"], "between 0 and 1 exclusive (did you mean 10%?)"),
        (["--until", "mean±1%", "--metric", "test_loss"], "need a metric bounded in [0, 1]"),
        (["--until", "fail<0.1", "--max-seeds", "1"], "--max-seeds (1) must be at least --seeds"),
        (["--until", "fail<0.1", "--decompose"], "run --decompose as a study of its own"),
    ],
)
def test_bad_until_values_are_refused_in_one_line(tmp_path, args, message):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    result = cli("stability", config, "--seeds", 2, "--storage", tmp_path / "s.journal", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "s.journal").exists()  # refused before anything is stored


def test_until_runs_rounds_and_a_rerun_resumes_the_stored_study(tmp_path):
    config, journal = tmp_path / "tiny.yaml", tmp_path / "s.journal"
    config.write_text(TINY)
    args = ("stability", config, "--seeds", 4, "--until", "fail<0.5", "--max-seeds", 12, "--storage", journal)
    first = cli(*args, "--out", tmp_path / "r", "--format", "json,md", "--json")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.output)
    record = summary["sequential"]  # 0 of 4 bounds the rate at 66%, 0 of 8 at 44%
    assert record["decided"] and [look["seeds"] for look in record["rounds"]] == [4, 8]
    report = (tmp_path / "r" / "report.md").read_text()  # the report says why the rounds stopped, look by look
    assert "## Stopping" in report and "--until fail<0.5: answered after 2 round(s), 8 seeds" in report
    assert "(0 of 4 seeds failed): undecided against 50.00%" in report and "(0 of 8 seeds failed): below" in report
    assert [a["size"] for a in summary["arrays"]] == [4, 4] and summary["reused_seeds"] == 0
    (name,) = summary["studies"].values()
    assert len(optuna.load_study(study_name=name, storage=open_storage(str(journal))[0]).trials) == 8
    again = json.loads(cli(*args, "--out", tmp_path / "r2", "--format", "json", "--json").output)
    assert again["arrays"] == [] and again["reused_seeds"] == 8 and again["sequential"] == record


def test_compare_until_decided_pairs_the_same_seeds(tmp_path):
    fast, slow, journal = tmp_path / "fast.yaml", tmp_path / "slow.yaml", tmp_path / "s.journal"
    fast.write_text(TINY)
    slow.write_text(TINY.replace("lr: 0.01", "lr: 0.0001"))
    result = cli(
        "stability", "compare", fast, slow, "--seeds", 4, "--until-decided", "--max-seeds", 8,
        "--storage", journal, "--out", tmp_path / "r", "--format", "json", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)["sequential"]
    looks = record["rounds"]
    assert record["question"] == "decided (mean)" and looks[-1]["seeds"] in (4, 8)
    (pair,) = looks[-1]["answers"]
    assert pair["subject"] == "fast vs slow" and pair["n"] == looks[-1]["seeds"]
    assert pair["decided"] == (pair["low"] > 0 or pair["high"] < 0) == record["decided"]


def test_the_stopping_benchmark_runs_in_quick_mode(tmp_path):
    from benchmarks import stopping

    out = tmp_path / "stopping.json"
    assert stopping.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["shape"] for r in result["precision"]] == list(stopping.SHAPES)
    assert [r["shape"] for r in result["null"]] == list(stopping.NULL_DIFFERENCES)
    assert len(result["savings"]) == len(stopping.EFFECTS) * len(stopping.NULL_DIFFERENCES) * 2
    assert all(0 <= r["mean_type1"] <= 1 and 0 <= r["t_peeking_type1"] <= 1 for r in result["null"])
    assert result["machine_at_start"]["threads"]["OMP_NUM_THREADS"] is not None
