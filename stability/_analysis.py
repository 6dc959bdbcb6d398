"""From a StabilityResult to its Analysis: the figures of `_stats`, arranged into the frames
documented on `stability._result.Analysis`.

Only completed seeds enter a figure. A seed that failed, or completed with a non-finite value
of a metric, is counted in that row's `n_failed` so the report shows it: dropping diverged
seeds silently would make a fragile configuration look stable. Every frame keeps its
documented columns even when it has no rows, so the writers never special-case.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from . import _robust, _stats
from ._result import METRICS, SOURCES, Analysis, StabilityResult

ALPHA = 0.05  # significance level of the power analysis
POWER = 0.8  # power the power analysis asks for
MODE_RULE = (
    f"two modes when the widest gap between sorted values is at least {_stats.MODE_GAP_FLOOR:g} pooled "
    f"within-mode sds and beyond the {_stats.MODE_LEVEL:.0%} quantile of that gap on normal samples of the "
    f"same size (sought from {_stats.MIN_SEEDS_FOR_MODES} seeds)"
)

SUMMARY_COLUMNS = (
    "config",
    "design",
    "metric",
    "n",
    "n_failed",
    "mean",
    "std",
    "sem",
    "ci_low",
    "ci_high",
    "ci_method",
    "few_seeds",
    "ci_t_low",
    "ci_t_high",
    "ci_bca_low",
    "ci_bca_high",
    "median",
    "median_low",
    "median_high",
    "median_level",
    "q1",
    "q3",
    "iqr",
    "iqm",
    "iqm_low",
    "iqm_high",
    "min",
    "max",
    "range",
    "cv",
    "normality_stat",
    "normality_p",
    "n_outliers",
    "outliers",
    "best_of_k",
    "noise_floor_std",
    "variance_ratio",
    "modes",
    "mode_stat",
    "mode_threshold",
    "good_mode_n",
    "good_mode_mean",
    "good_mode_std",
    "worse_mode_n",
    "worse_mode_mean",
    "worse_mode_std",
    "worse_mode_seeds",
    "bad_failed",
    "bad_below",
    "bad_cut",
    "bad_unit",
    "bad_n",
    "bad_of",
    "bad_rate",
    "bad_low",
    "bad_high",
    "bad_upper",
    "headline",
)
PER_EPOCH_COLUMNS = ("config", "design", "metric", "epoch", "n", "mean", "std", "ci_low", "ci_high", "ci_method")
COMPARISON_COLUMNS = (
    "metric",
    "a",
    "b",
    "better",
    "mean_diff",
    "welch_t",
    "welch_p",
    "welch_p_holm",
    "mwu_u",
    "mwu_p",
    "mwu_p_holm",
    "cohen_d",
    "cliff_delta",
    "p_a_better",
    "p_a_better_low",
    "p_a_better_high",
    "aso_eps_min",
    "mean_diff_low",
    "mean_diff_high",
    "paired",
    "n_pairs",
    "unpaired_slots",
    "paired_mean_diff",
    "paired_diff_std",
    "paired_diff_low",
    "paired_diff_high",
    "paired_t",
    "paired_t_p",
    "paired_t_p_holm",
    "wilcoxon_w",
    "wilcoxon_p",
    "wilcoxon_p_holm",
    "p_a_better_pairs",
    "p_a_better_pairs_low",
    "p_a_better_pairs_high",
    "good_mode_diff",
    "a_bad_n",
    "a_bad_of",
    "b_bad_n",
    "b_bad_of",
    "bad_rate_test",
    "a_only_bad",
    "b_only_bad",
    "bad_rate_p",
    "bad_rate_p_holm",
    "aso_confidence",
)
RANKING_COLUMNS = ("metric", "rank", "config", "mean", "ci_low", "ci_high")
PROFILE_COLUMNS = ("config", "design", "metric", "threshold", "share", "low", "high")
PROFILE_QUANTILES = np.linspace(0.0, 1.0, 11)  # the profile frame's thresholds: these quantiles of every seed
POWER_COLUMNS = ("config", "metric", "test", "std", "n", "min_detectable_diff")
PAIRED_TEST = "paired t (same seeds)"
TWO_SAMPLE_TEST = "two-sample t (independent seeds)"
# `config` is not in the contract's list, but a study of several configurations run with
# --decompose has one decomposition per configuration, and without it their rows would collide.
DECOMPOSITION_COLUMNS = ("config", "method", "metric", "source", "variance", "ci_low", "ci_high", "share")
MODE_SOURCE_COLUMNS = (
    "config",
    "method",
    "metric",
    "source",
    "worse_n",
    "runs",
    "levels",
    "levels_with_worse",
    "p",
    "verdict",
)


def analyse(
    result: StabilityResult,
    *,
    confidence: float = 0.95,
    bootstrap_seed: int | None = None,
    n_resamples: int = 9999,
    differences: Sequence[float] = (0.005, 0.01, 0.02),
    fail_below: Mapping[str, float] | None = None,
    fail_margin: float = _robust.FAIL_MARGIN,
) -> Analysis:
    """Every statistic of the report, computed once; `bootstrap_seed` defaults to the study's own
    (metadata "bootstrap_seed", else 0) so a report rebuilt from the saved result is identical.
    A seed goes wrong when it fails, or is below `fail_below` {metric: threshold} where given, else
    worse than its study's median by `fail_margin` of the median (see `_robust.failure_cut`)."""
    if bootstrap_seed is None:
        bootstrap_seed = result.metadata.get("bootstrap_seed") or 0
    seeds = result.seeds
    metrics = _metrics(seeds)
    common = {"confidence": confidence, "bootstrap_seed": int(bootstrap_seed), "n_resamples": n_resamples}
    rule = {"fail_below": dict(fail_below or {}), "fail_margin": fail_margin}
    summary = _summary(seeds, metrics, result.metadata, **rule, **common)
    comparisons = _comparisons(
        seeds,
        metrics,
        summary,
        confidence=confidence,
        bootstrap_seed=int(bootstrap_seed),
    )
    return Analysis(
        summary=summary,
        per_epoch=_per_epoch(result.curves, seeds, confidence),
        comparisons=comparisons,
        ranking=_ranking(summary),
        power=_power(summary, comparisons, differences),
        decomposition=_decomposition(seeds, metrics, confidence),
        mode_sources=_mode_sources(seeds, metrics, summary),
        profiles=_profiles(seeds, metrics, confidence),
        settings={
            **common,
            "alpha": ALPHA,
            "power": POWER,
            **rule,
            "gone_wrong_rule": gone_wrong_rule(rule["fail_below"], fail_margin),
            "profile_band": _robust.profile_band(confidence),
            "mode_rule": MODE_RULE,
            "seeds_to_see_1_in_10_with_90_percent": _stats.seeds_to_see_failure(0.1, 0.9),
        },
    )


# --------------------------------------------------------------------------- helpers


def _metrics(seeds: pd.DataFrame) -> list[str]:
    """The metrics this study recorded: the standard ones first, then any other train_* / val_* / test_*
    column (user metrics). A metric no completed seed has a value for (val_* without a validation
    split, *_acc of a regression) is left out."""
    extra = [c for c in seeds.columns if c.startswith(("train_", "val_", "test_")) and c not in METRICS]
    completed = seeds[seeds["status"] == "completed"]
    return [
        m
        for m in (*METRICS, *extra)
        if m in seeds.columns
        and np.isfinite(pd.to_numeric(completed[m], errors="coerce").to_numpy(dtype=np.float64)).any()
    ]


def _values(rows: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(finite values of completed seeds, their seed_index, how many seeds gave no value), by seed_index."""
    rows = rows.sort_values("seed_index", kind="stable")
    values = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=np.float64)
    usable = (rows["status"].to_numpy() == "completed") & np.isfinite(values)
    return values[usable], rows["seed_index"].to_numpy()[usable], int((~usable).sum())


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


def _higher_is_better(metric: str) -> bool:
    """Losses and errors are better lower; accuracy, R^2 and other (user) metrics higher."""
    return not metric.endswith(("_loss", "_rmse", "_mae", "_error", "_err"))


def _grid(rows: pd.DataFrame, metric: str, confidence: float) -> list[dict[str, Any]]:
    """The grid's components; none when a seed failed (the ANOVA needs every cell of the grid)."""
    values = pd.to_numeric(rows[metric], errors="coerce")
    if (rows["status"] != "completed").any() or not np.isfinite(values.to_numpy(dtype=np.float64)).all():
        return []
    frame = pd.DataFrame(
        {
            "init": rows["seed_init"].to_numpy(),
            "data": rows["seed_data"].to_numpy(),
            metric: values.to_numpy(dtype=np.float64),
        }
    )
    return _stats.grid_decomposition(frame, ["init", "data"], metric, confidence)


# --------------------------------------------------------------------------- frames


def _summary(
    seeds: pd.DataFrame,
    metrics: list[str],
    metadata: dict[str, Any],
    *,
    confidence: float,
    bootstrap_seed: int,
    n_resamples: int,
    fail_below: dict[str, float],
    fail_margin: float,
) -> pd.DataFrame:
    """One row per (config, design, metric). The noise floor of an accuracy needs the size of the
    split it was measured on: n_test for test_acc (likewise n_val, n_train when recorded). The
    grid design's interval of the mean is the crossed design's (its runs share init and data seeds),
    and its seeds gone wrong are counted per init (or data) seed, `_grid_failures`."""
    rows = []
    for (config, design), group in seeds.groupby(["config", "design"], sort=False):
        for metric in metrics:
            values, seed_index, n_failed = _values(group, metric)
            split = metric.rsplit("_", 1)[0]
            row = _stats.summarize(
                values,
                n_failed=n_failed,
                n_test=metadata.get(f"n_{split}"),
                is_accuracy=metric.endswith("_acc"),
                higher_is_better=_higher_is_better(metric),
                fail_below=fail_below.get(metric),
                fail_margin=fail_margin,
                confidence=confidence,
                bootstrap_seed=bootstrap_seed,
                n_resamples=n_resamples,
            )
            row["outliers"] = ",".join(str(seed_index[i]) for i in row["outliers"])
            row["worse_mode_seeds"] = ",".join(str(seed_index[i]) for i in row["worse_mode_seeds"])
            row["best_of_k"] = json.dumps({str(k): v for k, v in row["best_of_k"].items()})
            if design == "grid":
                row.update(_grid_interval(group, metric, confidence))
                row.update(_grid_failures(group, metric, row["bad_cut"], confidence))
            row["headline"] = headline(row, metric)
            rows.append({"config": config, "design": design, "metric": metric, **row})
    return _frame(rows, SUMMARY_COLUMNS)


def _grid_interval(rows: pd.DataFrame, metric: str, confidence: float) -> dict[str, Any]:
    """The crossed design's interval of the grid's mean; t (labelled as treating runs as
    independent) when a seed failed and the grid is incomplete."""
    values = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=np.float64)
    if (rows["status"] != "completed").any() or not np.isfinite(values).all():
        return {"ci_method": "t (grid incomplete: runs taken as independent)"}
    frame = pd.DataFrame({"init": rows["seed_init"].to_numpy(), "data": rows["seed_data"].to_numpy(), metric: values})
    low, high = _stats.crossed_mean_interval(frame, ["init", "data"], metric, confidence)
    return {"ci_low": low, "ci_high": high, "ci_method": "crossed init x data"}


def _grid_failures(rows: pd.DataFrame, metric: str, cut: float, confidence: float) -> dict[str, Any]:
    """A grid's seeds gone wrong, counted per independent unit: runs that share an init seed are not
    independent, so a unit is an init seed, one with a run gone wrong counting as gone wrong; the
    data seed instead when the exact test (`_stats.mode_follows_levels`) finds the runs gone wrong
    crowding into some data seeds and not into some init seeds. The per-unit share bounds the
    per-run share from above (benchmarks/coverage.py: per run, the interval covers 45-90% when
    failures follow the init seed; per init seed, at least 95%)."""
    values = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=np.float64)
    usable = (rows["status"].to_numpy() == "completed") & np.isfinite(values)
    past = _robust.past_cut(np.where(usable, values, np.nan), cut, _higher_is_better(metric))
    wrong = ~usable | past
    follows = {s: _stats.mode_follows_levels(wrong, rows[f"seed_{s}"].to_numpy())["p"] for s in ("init", "data")}
    source = "data" if follows["data"] < ALPHA <= follows["init"] else "init"
    bad, units = _robust.wrong_units(wrong, rows[f"seed_{source}"].to_numpy())
    return {"bad_unit": f"{source} seed", **_stats.failure_rate(bad, units, confidence)}


def gone_wrong_rule(fail_below: Mapping[str, float], fail_margin: float) -> str:
    """What "gone wrong" means in this report, in words every export uses."""
    rule = f"failed, or worse than the median by more than {fail_margin:.0%} of it"
    given = "; ".join(f"{metric}: below {value:g}" for metric, value in fail_below.items())
    return f"{rule}{f' ({given} instead, as asked)' if given else ''}; in a grid, counted per init seed"


def headline(row: Mapping[str, Any], metric: str) -> str:
    """The summary's one-line answer, true whatever the shape of the seeds: the median with its
    exact interval, and how many seeds (or grid units) went wrong; a gap between two modes, when
    the mode rule finds one, is described after them, never used for a bound."""
    accuracy = metric.endswith("_acc")
    number = (lambda v: f"{100 * v:.2f}%") if accuracy else (lambda v: f"{v:.4g}")
    if row["n"] == 0:
        return "no completed seed"
    text = f"median {number(row['median'])}"
    if row["n"] >= 2:
        text += f" [{number(row['median_low'])}, {number(row['median_high'])}]"
    text += f"; {int(row['bad_n'])} of {int(row['bad_of'])} {row['bad_unit']}s gone wrong"
    if row["modes"] == 2:
        gap = abs(row["good_mode_mean"] - row["worse_mode_mean"])
        gap_text = f"{100 * gap:.1f} points" if accuracy else f"{gap:.3g}"
        side = "lower" if _higher_is_better(metric) else "higher"
        text += f"; a gap: {row['worse_mode_n']} of {row['n']} seeds {gap_text} {side}"
    return text


def _per_epoch(curves: pd.DataFrame, seeds: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Mean curve with a t interval per epoch, over the seeds that completed (a failed seed's curve
    stops early and would bias the late epochs towards the survivors' values anyway)."""
    keys = ["config", "design", "seed_index"]
    completed = seeds.loc[seeds["status"] == "completed", keys].drop_duplicates()
    points = curves.merge(completed, on=keys, how="inner")
    points = points[np.isfinite(pd.to_numeric(points["value"], errors="coerce"))]
    if points.empty:
        return _frame([], PER_EPOCH_COLUMNS)
    table = (
        points.groupby(["config", "design", "metric", "epoch"], sort=False)["value"]
        .agg(n="count", mean="mean", std=lambda v: v.std(ddof=1))
        .reset_index()
    )
    table["n"] = table["n"].astype(int)
    half = stats.t.ppf((1 + confidence) / 2, table["n"] - 1) * table["std"] / np.sqrt(table["n"])
    table["ci_low"], table["ci_high"] = table["mean"] - half, table["mean"] + half
    table["ci_method"] = band_label(confidence)
    return table[list(PER_EPOCH_COLUMNS)]


def band_label(confidence: float = 0.95) -> str:
    """What the learning curves' band is, in the words the plot's legend and every export use."""
    return f"mean ± {confidence:.0%} t interval over seeds (completed seeds; assumes one mode)"


def _comparisons(
    seeds: pd.DataFrame,
    metrics: list[str],
    summary: pd.DataFrame,
    *,
    confidence: float,
    bootstrap_seed: int,
) -> pd.DataFrame:
    """Every pair of configurations on the main design, "better" read in the metric's direction.

    When the two configurations ran the same seeds slot for slot (what `compare` does), the
    paired figures (paired t, Wilcoxon signed-rank, P(A better) over pairs) are the ones that
    fit the design; `paired` says so. The independent-sample figures are kept beside them.
    Failure rates (from the summary) are compared by McNemar's exact test when the seeds are
    paired (it uses which slots went wrong under each), else by Fisher's exact test; `bad_rate_test`
    names the one used.

    One correction policy, per metric over its pairs (the family a reader scans when asking
    "which configs differ?"): Holm adjusts each test's p-values separately; ASO, which has no
    p-value, is computed at the Bonferroni-adjusted confidence 1 - (1 - confidence) / pairs, as
    its authors recommend for several comparisons.
    """
    main = seeds[seeds["design"] == "all"]
    configs = list(pd.unique(main["config"]))
    pairs = list(itertools.combinations(configs, 2))
    aso_confidence = 1.0 - (1.0 - confidence) / max(len(pairs), 1)
    by_config = summary[summary["design"] == "all"].set_index(["config", "metric"])
    rows = []
    for metric in metrics:
        family = []
        for a, b in pairs:
            rows_a, rows_b = main[main["config"] == a], main[main["config"] == b]
            better = _higher_is_better(metric)
            values_a, values_b = _values(rows_a, metric)[0], _values(rows_b, metric)[0]
            figures = _stats.compare(
                values_a,
                values_b,
                confidence=confidence,
                bootstrap_seed=bootstrap_seed,
                higher_is_better=better,
                aso_confidence=aso_confidence,
            )
            low, high = _stats.welch_interval(values_a, values_b, confidence)
            paired = _shares_seeds(rows_a, rows_b)
            paired_a, paired_b, dropped = _paired_values(rows_a, rows_b, metric) if paired else ([], [], "")
            pair_figures = _stats.compare_paired(paired_a, paired_b, confidence=confidence, higher_is_better=better)
            pair_figures["unpaired_slots"] = dropped
            summary_a, summary_b = by_config.loc[(a, metric)], by_config.loc[(b, metric)]
            family.append(
                {
                    "metric": metric,
                    "a": a,
                    "b": b,
                    "better": "higher" if better else "lower",
                    **figures,
                    "mean_diff_low": low,
                    "mean_diff_high": high,
                    "paired": paired,
                    **pair_figures,
                    "good_mode_diff": float(summary_a["good_mode_mean"] - summary_b["good_mode_mean"]),
                    "a_bad_n": int(summary_a["bad_n"]),
                    "a_bad_of": int(summary_a["bad_of"]),
                    "b_bad_n": int(summary_b["bad_n"]),
                    "b_bad_of": int(summary_b["bad_of"]),
                    **_rate_test(rows_a, rows_b, metric, summary_a, summary_b, paired),
                    "aso_confidence": aso_confidence,
                }
            )
        for test in ("welch_p", "mwu_p", "paired_t_p", "wilcoxon_p", "bad_rate_p"):
            for row, adjusted in zip(family, _stats.holm([r[test] for r in family])):
                row[f"{test}_holm"] = float(adjusted)
        rows += family
    return _frame(rows, COMPARISON_COLUMNS)


_SEED_SOURCES = ("seed_init", "seed_data", "seed_dropout", "seed_split")


def _rate_test(
    rows_a: pd.DataFrame,
    rows_b: pd.DataFrame,
    metric: str,
    summary_a: Mapping[str, Any],
    summary_b: Mapping[str, Any],
    paired: bool,
) -> dict[str, Any]:
    """The test of two failure rates that fits the design: McNemar's exact test on the slots of
    shared seeds, Fisher's exact test on independent seeds."""
    if paired:
        wrong_a = _gone_wrong(rows_a, metric, summary_a)
        wrong_b = _gone_wrong(rows_b, metric, summary_b)
        slots = sorted(wrong_a)
        figures = _stats.compare_paired_rates([wrong_a[i] for i in slots], [wrong_b[i] for i in slots])
        return {"bad_rate_test": "McNemar exact (paired)", **figures}
    p = _stats.compare_rates(summary_a["bad_n"], summary_a["bad_of"], summary_b["bad_n"], summary_b["bad_of"])
    return {"bad_rate_test": "Fisher exact", "a_only_bad": np.nan, "b_only_bad": np.nan, "bad_rate_p": p}


def _gone_wrong(rows: pd.DataFrame, metric: str, summary: Mapping[str, Any]) -> dict[int, bool]:
    """seed_index -> whether that seed went wrong, by the summary's rule (so the counts agree with
    bad_n): it gave no value (failed, diverged) or is past the summary's cut."""
    values, index, _ = _values(rows, metric)
    past = dict(zip(index.tolist(), _robust.past_cut(values, summary["bad_cut"], _higher_is_better(metric)).tolist()))
    return {int(i): past.get(i, True) for i in rows["seed_index"]}


def _seed_plan(rows: pd.DataFrame) -> list[tuple[Any, ...]]:
    columns = [c for c in _SEED_SOURCES if c in rows.columns]
    plan = rows.sort_values("seed_index", kind="stable")[["seed_index", *columns]].astype(object)
    return [tuple(None if pd.isna(v) else v for v in r) for r in plan.itertuples(index=False)]


def _shares_seeds(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> bool:
    """Whether two configurations trained the same seeds slot for slot (every source's seed equal)."""
    return len(rows_a) > 0 and _seed_plan(rows_a) == _seed_plan(rows_b)


def _paired_values(rows_a: pd.DataFrame, rows_b: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The values of the slots where both configurations completed, aligned by seed_index, and the
    slots left out ("3 (A); 5 (A, B)": seed_index and the configurations without a value there).
    Every paired figure (the mean difference, its interval, the tests) uses these pairs only."""
    values_a, index_a, _ = _values(rows_a, metric)
    values_b, index_b, _ = _values(rows_b, metric)
    both, in_a, in_b = np.intersect1d(index_a, index_b, return_indices=True)
    slots = sorted(set(rows_a["seed_index"].tolist()) | set(rows_b["seed_index"].tolist()))
    dropped = [
        f"{int(i)} ({', '.join(name for name, index in (('A', index_a), ('B', index_b)) if i not in index)})"
        for i in slots
        if i not in both
    ]
    return values_a[in_a], values_b[in_b], "; ".join(dropped)


def _ranking(summary: pd.DataFrame) -> pd.DataFrame:
    """Configurations by mean on the main design, best first (higher accuracy, lower loss);
    ties share the better rank, a configuration without values comes last without a rank."""
    rows = []
    main = summary[summary["design"] == "all"]
    for metric, group in main.groupby("metric", sort=False):
        ascending = not _higher_is_better(metric)
        ordered = group.sort_values("mean", ascending=ascending, na_position="last", kind="stable")
        ranks = ordered["mean"].rank(method="min", ascending=ascending)
        rows += [
            {
                "metric": metric,
                "rank": rank,
                "config": r["config"],
                "mean": r["mean"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
            }
            for rank, (_, r) in zip(ranks, ordered.iterrows())
        ]
    frame = _frame(rows, RANKING_COLUMNS)
    frame["rank"] = frame["rank"].astype("Int64")
    return frame


def _power(summary: pd.DataFrame, comparisons: pd.DataFrame, differences: Sequence[float]) -> pd.DataFrame:
    """How small a difference the study can see with its seeds, and how many seeds each of a few
    differences would need (alpha 0.05, power 0.8), in the test its design calls for.

    Paired (two configurations that trained the same seeds slot for slot): one row per pair, the
    paired t-test at the sd of the differences over the pairs both completed. Independent: one row
    per configuration not in a paired comparison, Student's two-sample t at its seed-to-seed sd.
    Both assume one mode: where the summary finds two (in a configuration, or in either of a pair),
    the figures are withheld (NaN) and `note` says why; the failure rate answers that study."""
    needed = {d: f"seeds_needed_{d:g}" for d in differences}
    modes = summary[summary["design"] == "all"].set_index(["config", "metric"])["modes"]
    rows = []

    def row(config: str, metric: str, test: str, std: float, n: int, bimodal: list[str]) -> dict[str, Any]:
        if bimodal:
            note = f"withheld: two modes found ({', '.join(bimodal)}); the t-test's power assumes one"
            figures = {"min_detectable_diff": np.nan, **dict.fromkeys(needed.values(), np.nan)}
        else:
            paired = test.startswith("paired")
            note = ""
            figures = {
                "min_detectable_diff": _stats.min_detectable_difference(std, n, ALPHA, POWER, paired=paired),
                **{c: _stats.seeds_needed(d, std, ALPHA, POWER, paired=paired) for d, c in needed.items()},
            }
        return {"config": config, "metric": metric, "test": test, "std": std, "n": n, **figures, "note": note}

    in_pairs: set[tuple[str, str]] = set()
    for _, r in comparisons[comparisons["paired"].astype(bool)].iterrows():
        a, b, metric = r["a"], r["b"], r["metric"]
        in_pairs |= {(a, metric), (b, metric)}
        bimodal = [c for c in (a, b) if modes.get((c, metric)) == 2]
        rows.append(row(f"{a} - {b}", metric, PAIRED_TEST, float(r["paired_diff_std"]), int(r["n_pairs"]), bimodal))
    for _, r in summary[summary["design"] == "all"].iterrows():
        if (r["config"], r["metric"]) in in_pairs:
            continue
        bimodal = [r["config"]] if r["modes"] == 2 else []
        rows.append(row(r["config"], r["metric"], TWO_SAMPLE_TEST, float(r["std"]), int(r["n"]), bimodal))
    return _frame(rows, [*POWER_COLUMNS, *needed.values(), "note"])


def _decomposition(seeds: pd.DataFrame, metrics: list[str], confidence: float) -> pd.DataFrame:
    """Per configuration that ran --decompose: method "sources", each source's variance from its
    only_<source> design, their sum, and the "all" design's total; method "grid", the init x data
    grid's variance components (init, data, their interaction with the residual)."""
    rows = []
    for config, group in seeds.groupby("config", sort=False):
        designs = set(group["design"])
        sources = [s for s in SOURCES if f"only_{s}" in designs]
        for metric in metrics:
            if sources:
                by_source = {s: _values(group[group["design"] == f"only_{s}"], metric)[0] for s in sources}
                total = _values(group[group["design"] == "all"], metric)[0] if "all" in designs else None
                rows += [
                    {"config": config, "method": "sources", "metric": metric, **row}
                    for row in _stats.decompose_one_at_a_time(by_source, total, confidence)
                ]
            if "grid" in designs:
                rows += [
                    {"config": config, "method": "grid", "metric": metric, **row}
                    for row in _grid(group[group["design"] == "grid"], metric, confidence)
                ]
    frame = _frame(rows, DECOMPOSITION_COLUMNS)
    return frame.astype({c: float for c in ("variance", "ci_low", "ci_high", "share")}) if rows else frame


def _profiles(seeds: pd.DataFrame, metrics: list[str], confidence: float) -> pd.DataFrame:
    """Performance profiles: per (config, design, metric), the share of completed seeds scoring
    above each threshold, with the DKW band. The thresholds are the deciles (PROFILE_QUANTILES) of
    every configuration's completed seeds pooled: where the seeds are, whatever their spread, and
    the same for every configuration so that they read side by side."""
    rows = []
    for metric in metrics:
        everything = _values(seeds, metric)[0]
        if everything.size == 0:
            continue
        thresholds = np.quantile(everything, PROFILE_QUANTILES)
        for (config, design), group in seeds.groupby(["config", "design"], sort=False):
            values = _values(group, metric)[0]
            rows += [
                {"config": config, "design": design, "metric": metric, **point}
                for point in _robust.describe_profile(values, thresholds, confidence)
            ]
    return _frame(rows, PROFILE_COLUMNS)


# --------------------------------------------------------------------------- which source moves seeds between modes


def _mode_sources(seeds: pd.DataFrame, metrics: list[str], summary: pd.DataFrame) -> pd.DataFrame:
    """Per configuration that ran --decompose and found a worse mode: which seed source moves runs
    into it. Grid: are the worse-mode runs concentrated in some init (or data) seeds, by the exact
    test `_stats.mode_follows_levels`. Sources: how many runs of each one-at-a-time design fall on
    the worse side of the main design's split (a design with runs in both modes shows that its
    source moves runs between modes by itself)."""
    rows = []
    by_design = summary.set_index(["config", "design", "metric"])
    for config, group in seeds.groupby("config", sort=False):
        designs = set(group["design"])
        sources = [s for s in SOURCES if f"only_{s}" in designs]
        for metric in metrics:
            found = []
            if "grid" in designs and by_design.loc[(config, "grid", metric), "modes"] == 2:
                found += _grid_mode_rows(
                    group[group["design"] == "grid"], metric, by_design.loc[(config, "grid", metric)]
                )
            if sources and "all" in designs and by_design.loc[(config, "all", metric), "modes"] == 2:
                found += _sources_mode_rows(group, sources, metric)
            rows += [{"config": config, "metric": metric, **row} for row in found]
    frame = _frame(rows, MODE_SOURCE_COLUMNS)
    return frame.astype({"p": float}) if rows else frame


def _grid_mode_rows(grid: pd.DataFrame, metric: str, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The grid's worse-mode runs against its init seeds and its data seeds, and the verdict."""
    _, index, _ = _values(grid, metric)
    completed = grid.set_index("seed_index").loc[index]
    worse = np.isin(index, [int(i) for i in str(summary["worse_mode_seeds"]).split(",") if i.strip()])
    tests = {
        source: _stats.mode_follows_levels(worse, completed[f"seed_{source}"].to_numpy()) for source in ("init", "data")
    }
    verdict = _grid_verdict(tests)
    return [{"method": "grid", "source": source, **figures, "verdict": verdict} for source, figures in tests.items()]


def _grid_verdict(tests: Mapping[str, Mapping[str, Any]]) -> str:
    """ "the worse mode follows the init seed: ..." in words, from the two exact tests at ALPHA."""
    init, data = tests["init"], tests["data"]
    where = (
        f"its {init['worse_n']} of {init['runs']} runs lie in {init['levels_with_worse']} of {init['levels']} init "
        f"seeds (exact p = {_p_text(init['p'])}) and {data['levels_with_worse']} of {data['levels']} data seeds "
        f"(p = {_p_text(data['p'])})"
    )
    follows = [source for source in ("init", "data") if tests[source]["p"] < ALPHA]
    if follows == ["init", "data"]:
        return f"the worse mode follows both the init and the data seed: {where}"
    if follows:
        return f"the worse mode follows the {follows[0]} seed: {where}"
    return (
        f"the worse mode follows neither seed on its own: {where}; an interaction of the two, dropout, or too few "
        "worse runs to tell"
    )


def _sources_mode_rows(group: pd.DataFrame, sources: Sequence[str], metric: str) -> list[dict[str, Any]]:
    """Each only_<source> design's runs on the worse side of the main design's split (the midpoint of
    the gap between its modes): a source whose design has runs in both modes moves runs by itself."""
    higher = _higher_is_better(metric)
    values, _, _ = _values(group[group["design"] == "all"], metric)
    split = _stats.find_modes(values, higher)
    good, worse = values[split["good"]], values[split["worse"]]
    cut = (np.min(good) + np.max(worse)) / 2 if higher else (np.max(good) + np.min(worse)) / 2
    counts = {}
    for source in sources:
        runs, _, _ = _values(group[group["design"] == f"only_{source}"], metric)
        counts[source] = (int(np.sum(runs < cut if higher else runs > cut)), int(runs.size))
    moving = [s for s, (w, n) in counts.items() if 0 < w < n]
    told = "; ".join(f"{s} alone: {w} of {n} runs in the worse mode" for s, (w, n) in counts.items())
    verdict = f"no source moves runs between modes by itself: {told}"
    if moving:
        verdict = f"the worse mode follows {' and '.join(moving)} (runs in both modes when it alone varies): {told}"
    return [
        {"method": "sources", "source": s, "worse_n": w, "runs": n, "levels": n, "levels_with_worse": w}
        | {"p": np.nan, "verdict": verdict}
        for s, (w, n) in counts.items()
    ]


def _p_text(p: float) -> str:
    return "n/a" if not np.isfinite(p) else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"
