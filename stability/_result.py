"""The data a stability study produces, and what its analysis adds.

`StabilityResult` is the raw record of a run: one row per trained seed and
one row per (seed, epoch, metric). It is all `hfta-nas report` needs to
rebuild a report without retraining, so it saves to and loads from a folder
(seeds.csv, curves.csv, metadata.json), written atomically.

`Analysis` is what the statistics add to it (see `_analysis.analyse`); the
report writers (`_plots`, `_export`) only read these two objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hfta_nas.runtime import atomic_write_text

# Final metrics recorded per seed; accuracies are fractions in [0, 1].
METRICS = (
    "test_acc",
    "test_loss",
    "val_acc",
    "val_loss",
    "train_acc",
    "train_loss",
    # regression (a config with an mse, mae or huber loss); absent metrics are NaN and left out
    "test_rmse",
    "test_mae",
    "test_r2",
    "val_rmse",
    "val_mae",
    "val_r2",
    "train_rmse",
    "train_mae",
    "train_r2",
)
SOURCES = ("init", "data", "dropout", "split")  # split: the train/validation partition, re-drawn per seed
DEFAULT_VARY = ("init", "data", "dropout")  # the split stays the data's own unless asked for

# seeds.csv: one row per (config, seed_index).
#   config       str   label of the configuration ("A", a trial name, ...)
#   seed_index   int   0..S-1 within its config and design
#   design       str   "all" for the main study; with --decompose also
#                      "only_<source>" (one source varies) or "grid" (init x data)
#   seed_init, seed_data, seed_dropout   int   the seed each source used
#   seed_split   Int64 the seed of the slot's train/validation split; empty: the data's own
#   status       str   "completed" | "failed"
#   reason       str   why it failed ("" when completed)
#   epochs       int   epochs actually run
#   <metric>     float for every name in METRICS (NaN when failed)
SEED_COLUMNS = (
    "config",
    "seed_index",
    "design",
    "seed_init",
    "seed_data",
    "seed_dropout",
    "seed_split",
    "status",
    "reason",
    "epochs",
)

# curves.csv: long format, one row per (config, design, seed_index, epoch, metric).
CURVE_COLUMNS = ("config", "design", "seed_index", "epoch", "metric", "value")
SEED_STATUSES = ("completed", "failed")  # what a seed's row says of it
SEED_KEYS = ("config", "seed_index", "design", "status")  # every seed's row has these (a failed seed has no values)
CURVE_KEYS = CURVE_COLUMNS[:-1]


@dataclass
class StabilityResult:
    seeds: pd.DataFrame
    curves: pd.DataFrame
    # Protocol metadata: command, versions, device, dtype, determinism settings,
    # vary, n_test (test-set size), bootstrap_seed, configs {label: resolved config dict},
    # seeds per source, wall time, array sizes.
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "seed_split" not in self.seeds.columns:  # a result from before the split source: the data's own split
            position = list(self.seeds.columns).index("seed_dropout") + 1 if "seed_dropout" in self.seeds else 0
            self.seeds = self.seeds.copy()
            self.seeds.insert(position, "seed_split", pd.array([pd.NA] * len(self.seeds), dtype="Int64"))

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "seeds.csv", self.seeds.to_csv(index=False))
        atomic_write_text(folder / "curves.csv", self.curves.to_csv(index=False))
        # the row counts let `load` tell a whole file from one cut short (a full disk, an editor)
        rows = {"seeds.csv": len(self.seeds), "curves.csv": len(self.curves)}
        columns = {"seeds.csv": list(self.seeds.columns)}  # and the columns, one dropped from one kept
        record = {**self.metadata, "rows": rows, "columns": columns}
        atomic_write_text(folder / "metadata.json", json.dumps(record, indent=2, default=str))

    @classmethod
    def load(cls, folder: str | Path) -> StabilityResult:
        """The result `save` wrote to `folder`; HftaNasError when a file is cut short or damaged."""
        from hfta_nas.errors import HftaNasError

        folder = Path(folder)
        try:
            seeds = pd.read_csv(
                folder / "seeds.csv",
                keep_default_na=False,
                na_values=[""],
                dtype={"config": str, "design": str, "status": str, "reason": str},
            )
            seeds["reason"] = seeds["reason"].fillna("")
            if "seed_split" in seeds.columns:
                seeds["seed_split"] = seeds["seed_split"].astype("Int64")
            curves = pd.read_csv(folder / "curves.csv", dtype={"config": str, "design": str, "metric": str})
            metadata = json.loads((folder / "metadata.json").read_text())
        except (ValueError, KeyError, OSError, pd.errors.ParserError) as error:
            raise HftaNasError(
                f"cannot read the stability result in '{folder}': {type(error).__name__}: {error}"
            ) from None
        rows = metadata.pop("rows", {})
        _check_seed_columns(folder / "seeds.csv", seeds, metadata.pop("columns", {}).get("seeds.csv"))
        for name, frame, keys in (("seeds.csv", seeds, SEED_KEYS), ("curves.csv", curves, CURVE_KEYS)):
            if name in rows and len(frame) != rows[name]:
                raise HftaNasError(
                    f"'{folder / name}' holds {len(frame)} rows where the result wrote {rows[name]}: "
                    "it was cut short or edited; restore it, or re-run `hfta-nas stability`."
                )
            missing = [key for key in keys if key not in frame.columns or frame[key].isna().any()]
            if name == "seeds.csv" and not missing:  # a completed seed has every metric the others have
                completed = frame[frame["status"] == "completed"]
                missing = [
                    m
                    for m in METRICS
                    if m in frame.columns and completed[m].notna().any() and completed[m].isna().any()
                ]
            if missing:
                raise HftaNasError(
                    f"'{folder / name}' lacks values of {', '.join(missing)}: it was cut short or "
                    "edited; restore it, or re-run `hfta-nas stability`."
                )
        unknown = sorted(set(seeds["status"]) - set(SEED_STATUSES))
        if unknown:  # a report of no completed seed would otherwise be written, and exit 0
            raise HftaNasError(
                f"'{folder / 'seeds.csv'}' has seeds of status {', '.join(map(repr, unknown))}; a seed is "
                f"{' or '.join(SEED_STATUSES)}: it was edited; restore it, or re-run `hfta-nas stability`."
            )
        return cls(seeds, curves, metadata)

    @classmethod
    def combine(cls, results: list[StabilityResult]) -> StabilityResult:
        """Several studies side by side (for comparisons); configs and studies are merged,
        the first result's protocol is kept and the others' are listed under `combined`."""
        labels = [label for r in results for label in r.seeds["config"].unique()]
        duplicated = sorted({label for label in labels if labels.count(label) > 1})
        if duplicated:
            from hfta_nas.errors import HftaNasError

            raise HftaNasError(f"the same configuration label appears in several results: {', '.join(duplicated)}.")
        metadata = dict(results[0].metadata)
        for key in ("configs", "studies"):
            metadata[key] = {k: v for r in results for k, v in r.metadata.get(key, {}).items()}
        metadata["combined"] = [r.metadata for r in results[1:]]
        return cls(
            pd.concat([r.seeds for r in results], ignore_index=True),
            pd.concat([r.curves for r in results], ignore_index=True),
            metadata,
        )


_NUMBER_COLUMNS = ("seed_index", "seed_init", "seed_data", "seed_dropout", "seed_split", "epochs", *METRICS)


def _check_seed_columns(path: Path, seeds: pd.DataFrame, written: list[str] | None) -> None:
    """HftaNasError for a seeds.csv without a column it was written with (or one every result has),
    or with a value that is not a number in a column of numbers: the report would leave them out."""
    from hfta_nas.errors import HftaNasError

    expected = written or [c for c in SEED_COLUMNS if c != "seed_split"]  # older results lack seed_split
    missing = [c for c in expected if c not in seeds.columns]
    if missing:
        raise HftaNasError(
            f"'{path}' has no column {', '.join(missing)}: it was edited; restore it, or re-run `hfta-nas stability`."
        )
    for column in (c for c in _NUMBER_COLUMNS if c in seeds.columns):
        numbers = pd.to_numeric(seeds[column], errors="coerce")
        bad = numbers.isna() & seeds[column].notna()
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise HftaNasError(
                f"'{path}' row {row + 2}, column {column}: {seeds[column].iloc[row]!r} is not a number: it was "
                "edited; restore it, or re-run `hfta-nas stability`."
            )


@dataclass
class Analysis:
    """Statistics of a StabilityResult; every frame uses the columns listed.

    summary:       one row per (config, design, metric) over completed seeds;
                   columns config, design, metric, n, n_failed, mean, std, sem,
                   ci_low, ci_high (the mean's interval), ci_method ("t"),
                   few_seeds (n below 5: the interval's level rests on normality),
                   ci_t_low, ci_t_high, ci_bca_low, ci_bca_high, median, median_low,
                   median_high (exact order-statistic interval), median_level (its exact
                   level: at least the confidence from 6 seeds), q1, q3, iqr, iqm, iqm_low,
                   iqm_high (rliable's stratified percentile bootstrap), min, max, range, cv,
                   normality_stat, normality_p,
                   n_outliers, outliers (str: comma-separated seed_index values),
                   best_of_k (str: JSON {k: expected best}), noise_floor_std,
                   variance_ratio (observed var / noise-floor var; NaN for losses);
                   a description of the shape, never the basis of a bound: modes (1 or 2,
                   `_stats.find_modes`), mode_stat, mode_threshold, good_mode_n/mean/std,
                   worse_mode_n/mean/std, worse_mode_seeds (str: comma-separated seed_index
                   values); seeds gone wrong (failed, or past bad_cut: --fail-below, else the
                   median moved by --fail-margin of it): bad_failed, bad_below, bad_cut,
                   bad_unit ("seed"; "init seed" or "data seed" in a grid, where bad_n counts
                   units with a run gone wrong), bad_n of bad_of, bad_rate, bad_low, bad_high
                   (Clopper-Pearson), bad_upper (one-sided); headline (str: "median m [low,
                   high]; k of n seeds gone wrong", then "; a gap: ..." where two modes show).
                   ci_method is "crossed init x data" for the grid design
    per_epoch:     config, design, metric, epoch, n, mean, std, ci_low, ci_high (t interval),
                   ci_method (the band's statistic in words, as the plot's legend names it)
    comparisons:   one row per (metric, a, b) pair of configs (design "all"):
                   metric, a, b, better ("higher" or "lower": the metric's direction),
                   mean_diff (A - B), welch_t, welch_p, welch_p_holm, mwu_u, mwu_p,
                   mwu_p_holm (Holm across the pairs of that metric, per test),
                   cohen_d, cliff_delta (positive: A better), p_a_better,
                   p_a_better_low, p_a_better_high (Newcombe's interval),
                   aso_eps_min (below 0.5: A tends to be better), mean_diff_low,
                   mean_diff_high (Welch), paired (both configs ran the same seeds
                   slot for slot), n_pairs, unpaired_slots (str: the slots the pairs leave
                   out, "3 (A); 5 (A, B)": seed_index and the configs without a value there),
                   paired_mean_diff (A - B over the pairs: the point of the paired interval,
                   computed on the same pairs), paired_diff_std, paired_diff_low/high, paired_t,
                   paired_t_p(_holm), wilcoxon_w, wilcoxon_p(_holm), p_a_better_pairs
                   with its Clopper-Pearson interval (NaN when not paired),
                   good_mode_diff, a_bad_n, a_bad_of, b_bad_n, b_bad_of, bad_rate_test
                   ("McNemar exact (paired)" on shared seeds, else "Fisher exact"),
                   a_only_bad, b_only_bad (McNemar's discordant slots; NaN when not
                   paired), bad_rate_p(_holm), aso_confidence (Bonferroni-adjusted
                   across the pairs)
    ranking:       metric, rank, config, mean, ci_low, ci_high (the mean's interval)
    power:         config ("A - B" for a pair), metric, test ("paired t (same seeds)": one row per
                   paired comparison, std the sd of the differences, n the pairs; "two-sample t
                   (independent seeds)": one row per config in no paired comparison), std, n,
                   min_detectable_diff (at the current n, alpha 0.05, power 0.8), seeds_needed_<d>
                   for a few differences d, note ("withheld: two modes found ..." with the figures
                   NaN where the summary finds two modes; else "")
    decomposition: config, metric, source, variance, ci_low, ci_high, share  (empty without
                   --decompose; per config, one row per source plus source "total"
                   (design "all") and "sum_of_sources")
    mode_sources:  which seed source moves runs into the worse mode (empty without
                   --decompose or without a worse mode): config, method ("grid": one
                   row per source, init and data, with the exact test of the worse-mode
                   runs crowding into some of its levels, `_stats.mode_follows_levels`;
                   "sources": one row per only_<source> design, its runs below the
                   main design's split), metric, source, worse_n, runs, levels,
                   levels_with_worse, p (grid only), verdict (str: "the worse mode
                   follows the init seed: ...")
    profiles:      performance profiles: config, design, metric, threshold (the deciles 0%, 10%,
                   ..., 100% of every configuration's completed seeds pooled), share (of completed
                   seeds above it), low, high (the DKW band, simultaneous over thresholds)
    settings:      confidence, bootstrap_seed, n_resamples, alpha, power, fail_below
                   ({metric: threshold}), fail_margin, gone_wrong_rule, profile_band,
                   mode_rule, seeds_to_see_1_in_10_with_90_percent
    """

    summary: pd.DataFrame
    per_epoch: pd.DataFrame
    comparisons: pd.DataFrame
    ranking: pd.DataFrame
    power: pd.DataFrame
    decomposition: pd.DataFrame
    mode_sources: pd.DataFrame = field(default_factory=pd.DataFrame)
    profiles: pd.DataFrame = field(default_factory=pd.DataFrame)
    settings: dict[str, Any] = field(default_factory=dict)
