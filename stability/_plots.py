"""The report's figures, drawn with seaborn on matplotlib's object API.

Figures are built on `matplotlib.figure.Figure` directly, never through pyplot:
no global figure registry to leak, no GUI backend to pick, and safe on a
headless CI machine. Each figure answers one question of the report:

- distribution: how the final metric spreads over seeds (strip over a box, per config);
- ecdf:         the same distribution as an ECDF, where configs' curves can cross;
- profile:      the performance profile (share of seeds above each score) with its DKW band,
                which shows any shape of seeds (modes, tails) without assuming one;
- curves:       learning curves, every seed a thin line, the mean with its t interval as a band (labelled);
- comparison:   each config's mean with its BCa interval (the ranking, with uncertainty);
- variance:     each source's share of the variance (only with --decompose).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import matplotlib.axes
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from hfta_nas.runtime import atomic_write_bytes

from ._result import Analysis, StabilityResult
from ._robust import performance_profile, profile_band

PLOT_NAMES = ("distribution", "ecdf", "profile", "curves", "comparison", "variance")


def draw(result: StabilityResult, analysis: Analysis, metric: str) -> dict[str, Figure]:
    """Every figure that has data to show, by name (see the module docstring)."""
    values = _final_values(result, metric)
    figures: dict[str, Figure] = {}
    if not values.empty:
        figures["distribution"] = _distribution(values, metric)
        figures["ecdf"] = _ecdf(values, metric)
        figures["profile"] = _profile(values, metric, analysis.settings.get("confidence", 0.95))
    curves = _curves_of(result, metric)
    if not curves.empty:
        figures["curves"] = _curves(curves, analysis.per_epoch, metric)
    ranking = analysis.ranking[analysis.ranking["metric"] == metric].dropna(subset=["mean"])
    if len(ranking) > 1:  # one config has nothing to rank
        figures["comparison"] = _comparison(ranking, metric)
    shares = analysis.decomposition[
        (analysis.decomposition["metric"] == metric)
        & ~analysis.decomposition["source"].isin(["total", "sum_of_sources"])
    ]
    if not shares.empty:
        figures["variance"] = _variance(shares, metric)
    return figures


def save(figures: dict[str, Figure], folder: Path, formats: tuple[str, ...] | list[str]) -> list[Path]:
    """Write each figure in each format (atomically); returns the files written."""
    written = []
    for name, figure in figures.items():
        for fmt in formats:
            path = folder / f"{name}.{fmt}"
            atomic_write_bytes(path, render(figure, fmt))
            written.append(path)
    return written


def render(figure: Figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    # No date and a fixed id salt: rebuilding the report of the same result gives the same bytes.
    metadata = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.hashsalt": "hfta-nas"}):
        figure.savefig(buffer, format=fmt, dpi=110, bbox_inches="tight", metadata=metadata)
    return buffer.getvalue()


# ------------------------------------------------------------------ data


def _final_values(result: StabilityResult, metric: str) -> pd.DataFrame:
    """Completed seeds of the main design with a finite value: config, seed_index, value."""
    seeds = result.seeds
    if metric not in seeds.columns:
        return pd.DataFrame(columns=["config", "seed_index", "value"])
    rows = seeds[(seeds["design"] == "all") & (seeds["status"] == "completed")]
    values = pd.DataFrame(
        {
            "config": rows["config"].astype(str),
            "seed_index": rows["seed_index"],
            "value": pd.to_numeric(rows[metric], errors="coerce"),
        }
    )
    return values[np.isfinite(values["value"])]


def _curves_of(result: StabilityResult, metric: str) -> pd.DataFrame:
    curves = result.curves
    rows = curves[(curves["metric"] == metric) & (curves["design"] == "all")].copy()
    rows["value"] = pd.to_numeric(rows["value"], errors="coerce")
    return rows[np.isfinite(rows["value"])]


def _label(metric: str) -> str:
    split, kind = metric.rsplit("_", 1)
    return f"{split} {'accuracy' if kind == 'acc' else 'loss'}"


def _figure(width: float = 6.4, height: float = 4.0) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


# --------------------------------------------------------------- figures


def _distribution(values: pd.DataFrame, metric: str) -> Figure:
    figure = _figure(max(4.0, 1.6 * values["config"].nunique() + 2.0))
    ax = figure.add_subplot()
    order = list(pd.unique(values["config"]))
    with warnings.catch_warnings():  # seaborn 0.13 still passes matplotlib 3.11's deprecated `vert`
        warnings.simplefilter("ignore", matplotlib.MatplotlibDeprecationWarning)
        sns.boxplot(
            data=values, x="config", y="value", order=order, ax=ax, color="0.9", width=0.5, showfliers=False
        )  # the strip shows every seed, outliers included
    with _seeded_jitter():
        _strip(values, order, ax)
    ax.set(xlabel="", ylabel=_label(metric), title=f"final {_label(metric)} over seeds")
    return figure


@contextlib.contextmanager
def _seeded_jitter(seed: int = 0) -> Iterator[None]:
    """seaborn 0.13 jitters strip points with NumPy's global generator: seed it for the drawing,
    so the same result draws the same figure, and give the caller's generator state back after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _strip(values: pd.DataFrame, order: list[str], ax: matplotlib.axes.Axes) -> None:
    sns.stripplot(
        data=values,
        x="config",
        y="value",
        order=order,
        ax=ax,
        hue="config",
        hue_order=order,
        legend=False,
        size=5,
        alpha=0.8,
        jitter=0.15,
    )


def _ecdf(values: pd.DataFrame, metric: str) -> Figure:
    figure = _figure()
    ax = figure.add_subplot()
    sns.ecdfplot(data=values, x="value", hue="config", ax=ax)
    ax.set(xlabel=f"final {_label(metric)}", ylabel="fraction of seeds", title="empirical CDF over seeds")
    return figure


def _profile(values: pd.DataFrame, metric: str, confidence: float) -> Figure:
    """Each configuration's share of seeds scoring above every value (a step at each seed) and the
    DKW band around it, named in the caption as the exports name it."""
    figure = _figure()
    ax = figure.add_subplot()
    low, high = float(values["value"].min()), float(values["value"].max())
    margin = 0.05 * (high - low) or 0.01
    thresholds = np.linspace(low - margin, high + margin, 400)
    palette = sns.color_palette(n_colors=values["config"].nunique())
    for color, (config, group) in zip(palette, values.groupby("config", sort=False)):
        profile = performance_profile(group["value"].to_numpy(), thresholds, confidence)
        ax.step(thresholds, profile["share"], where="post", color=color, linewidth=1.8, label=str(config))
        ax.fill_between(thresholds, profile["low"], profile["high"], step="post", color=color, alpha=0.2, linewidth=0)
    ax.set(
        xlabel=f"final {_label(metric)}",
        ylabel="share of seeds scoring above",
        ylim=(-0.02, 1.02),
        title="performance profile over seeds",
    )
    figure.supxlabel(f"band: {profile_band(confidence)}", fontsize="x-small")
    ax.legend(fontsize="small")
    return figure


def _curves(curves: pd.DataFrame, per_epoch: pd.DataFrame, metric: str) -> Figure:
    figure = _figure()
    ax = figure.add_subplot()
    palette = dict(zip(pd.unique(curves["config"]), sns.color_palette(n_colors=curves["config"].nunique())))
    for (config, _seed), seed_curve in curves.groupby(["config", "seed_index"], sort=False):
        ax.plot(seed_curve["epoch"], seed_curve["value"], color=palette[config], linewidth=0.6, alpha=0.35)
    mean = per_epoch[(per_epoch["metric"] == metric) & (per_epoch["design"] == "all")]
    statistic = ""
    for config, band in mean.groupby("config", sort=False):
        if config not in palette:
            continue
        statistic = str(band["ci_method"].iloc[0]) if "ci_method" in band else "mean ± 95% t interval over seeds"
        ax.plot(band["epoch"], band["mean"], color=palette[config], linewidth=2.0, label=f"{config} mean")
        ax.fill_between(
            band["epoch"],
            band["ci_low"],
            band["ci_high"],
            color=palette[config],
            alpha=0.25,
            linewidth=0,
            label=f"{config}: {statistic.split(' (')[0]}",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel=_label(metric), title=f"{_label(metric)} per epoch (thin: one seed)")
    # the caption under the axes names the band's statistic in full, what it counts and what it assumes
    if statistic:
        figure.supxlabel(f"band: {statistic}", fontsize="x-small")
    ax.legend(fontsize="small")
    return figure


def _comparison(ranking: pd.DataFrame, metric: str) -> Figure:
    figure = _figure(6.4, max(2.0, 0.6 * len(ranking) + 1.2))
    ax = figure.add_subplot()
    ranking = ranking.reset_index(drop=True)
    positions = np.arange(len(ranking))[::-1]  # best at the top
    low = (ranking["mean"] - ranking["ci_low"]).clip(lower=0).fillna(0)
    high = (ranking["ci_high"] - ranking["mean"]).clip(lower=0).fillna(0)
    ax.errorbar(ranking["mean"], positions, xerr=[low, high], fmt="o", capsize=4, color="C0")
    ax.set_yticks(
        positions, [f"{int(r)}. {c}" if pd.notna(r) else str(c) for r, c in zip(ranking["rank"], ranking["config"])]
    )
    ax.set(xlabel=f"mean final {_label(metric)} (95% t interval of the mean)", title="ranking with intervals")
    return figure


def _variance(shares: pd.DataFrame, metric: str) -> Figure:
    figure = _figure(max(4.0, 1.2 * shares["source"].nunique() + 2.5))
    ax = figure.add_subplot()
    hue = "config" if shares["config"].nunique() > 1 else None
    sns.barplot(data=shares, x="source", y="share", hue=hue, ax=ax)
    ax.set(
        xlabel="source of randomness",
        ylabel="share of the summed variance",
        title=f"where the variance of {_label(metric)} comes from",
    )
    return figure
