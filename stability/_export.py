"""Writing a stability report: CSV, strict JSON, Markdown, self-contained HTML, LaTeX.

The Markdown and HTML reports show the same sections (`_sections`), each a
heading, a sentence and a table, so the two never drift apart. The HTML embeds
its figures as base64 PNG and needs no other file; the Markdown links the plot
files written beside it. Every file is written atomically (write, then rename):
a killed run never leaves a half-written report that looks complete.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hfta_nas.errors import HftaNasError
from hfta_nas.runtime import atomic_write_text

from . import _plots
from ._formats import FORMATS, PLOT_FORMATS
from ._result import Analysis, StabilityResult


def write_report(
    result: StabilityResult,
    analysis: Analysis,
    out: str | Path,
    *,
    formats: Sequence[str] = FORMATS,
    plot_formats: Sequence[str] = PLOT_FORMATS,
    metric: str = "test_acc",
) -> dict[str, list[Path]]:
    """Write the report in each format to `out`; returns {format: files}, plus "plots" when plot files were written."""
    _check(formats, FORMATS, "--format")
    _check(plot_formats, PLOT_FORMATS, "--plot-format")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figures = _plots.draw(result, analysis, metric) if plot_formats or {"html", "md"} & set(formats) else {}
        files: dict[str, list[Path]] = {}
        if plot_formats and figures:
            files["plots"] = _plots.save(figures, out / "plots", plot_formats)
        report = _Report(result, analysis, metric, figures, plot_formats)
        for fmt in formats:
            files[fmt] = _WRITERS[fmt](report, out)
    except OSError as error:
        raise HftaNasError(f"cannot write the report folder '{out}': {error.strerror or error}") from None
    return files


# A value the analysis could not compute (a failed seed's metric, a p-value of too few seeds) is
# written as this dash in Markdown, HTML and LaTeX, left empty in CSV and null in JSON: never "nan".
MISSING = "—"


def _check(chosen: Sequence[str], known: Sequence[str], option: str) -> None:
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise HftaNasError(
            f"{option}: unknown {', '.join(map(repr, unknown))}; "
            f"expected a comma-separated subset of {', '.join(known)}."
        )


@dataclass
class _Report:
    result: StabilityResult
    analysis: Analysis
    metric: str
    figures: dict[str, Any]
    plot_formats: Sequence[str]

    @property
    def is_accuracy(self) -> bool:
        return self.metric.endswith("_acc")


# ---------------------------------------------------------------- writers


def _write_csv(report: _Report, out: Path) -> list[Path]:
    """The per-seed table (every metric, each source's seed) and every analysis frame."""
    frames = {
        "seeds": report.result.seeds,
        "summary": report.analysis.summary,
        "per_epoch": report.analysis.per_epoch,
        "comparisons": report.analysis.comparisons,
        "ranking": report.analysis.ranking,
        "power": report.analysis.power,
        "decomposition": report.analysis.decomposition,
        "mode_sources": report.analysis.mode_sources,
        "profiles": report.analysis.profiles,
    }
    written = []
    for name, frame in frames.items():
        if name in ("comparisons", "decomposition", "mode_sources", "profiles") and frame.empty:
            continue  # only meaningful with several configs / --decompose (and a worse mode)
        path = out / f"{name}.csv"
        atomic_write_text(path, frame.to_csv(index=False))
        written.append(path)
    return written


def _write_json(report: _Report, out: Path) -> list[Path]:
    """Strict JSON (no NaN: missing figures are null) with the protocol to reproduce the study."""
    analysis = report.analysis
    summary = _records(analysis.summary)
    for row in summary:
        row["best_of_k"] = json.loads(row["best_of_k"]) if row.get("best_of_k") else {}
        for key in ("outliers", "worse_mode_seeds"):  # seed_index values
            row[key] = [int(i) for i in row[key].split(",")] if row.get(key) else []
    document = {
        "metric": report.metric,
        "protocol": report.result.metadata,
        "settings": analysis.settings,
        "summary": summary,
        "comparisons": _records(analysis.comparisons),
        "ranking": _records(analysis.ranking),
        "power": _records(analysis.power),
        "decomposition": _records(analysis.decomposition),
        "mode_sources": _records(analysis.mode_sources),
        "profiles": _records(analysis.profiles),
        "per_epoch": _records(analysis.per_epoch),
        "seeds": _records(report.result.seeds),
    }
    path = out / "report.json"
    atomic_write_text(path, json.dumps(_strict(document), indent=2, allow_nan=False) + "\n")
    return [path]


def _write_markdown(report: _Report, out: Path) -> list[Path]:
    lines = [f"# Stability report: {report.metric}", ""]
    for section in _sections(report):
        lines += [f"## {section.title}", "", section.text, ""]
        if section.table is not None and not section.table.empty:
            lines += [_markdown_table(section.table), ""]
        if section.figure is not None and section.figure in report.figures and report.plot_formats:
            fmt = "png" if "png" in report.plot_formats else report.plot_formats[0]
            lines += [f"![{section.figure}](plots/{section.figure}.{fmt})", ""]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return [path]


def _write_html(report: _Report, out: Path) -> list[Path]:
    """One file that opens anywhere: styles inline, figures as base64 PNG."""
    body = [f"<h1>Stability report: {html.escape(report.metric)}</h1>"]
    for section in _sections(report):
        body += [f"<h2>{html.escape(section.title)}</h2>", f"<p>{html.escape(section.text)}</p>"]
        if section.figure is not None and section.figure in report.figures:
            png = base64.b64encode(_plots.render(report.figures[section.figure], "png")).decode("ascii")
            body.append(f'<img alt="{section.figure}" src="data:image/png;base64,{png}">')
        if section.table is not None and not section.table.empty:
            body.append(section.table.to_html(index=False, border=0, na_rep=MISSING, escape=True))
    document = _HTML_PAGE.format(title=html.escape(f"hfta-nas stability: {report.metric}"), body="\n".join(body))
    path = out / "report.html"
    atomic_write_text(path, document)
    return [path]


def _write_latex(report: _Report, out: Path) -> list[Path]:
    """Booktabs tables of the metric per configuration, split into tables of a few columns, and the
    comparisons when any; each in \\footnotesize, its long cells wrapped to fit the text width (never
    scaled: no \\resizebox). For \\input{} in a paper (needs \\usepackage{booktabs}, nothing else)."""
    name = report.metric.replace("_", " ")
    parts = [
        _latex(
            _distribution_table(report),
            caption=_latex_escape(f"Final {name} over seeds. {INTERVALS_CAPTION}"),
            label="tab:stability",
        ),
        _latex(
            _modes_table(report),
            caption=_latex_escape(
                f"Seeds gone wrong ({report.analysis.settings.get('gone_wrong_rule', '')}), with exact 95% "
                f"Clopper-Pearson intervals, and the modes of the final {name} (a description only)."
            ),
            label="tab:stability-modes",
        ),
        _latex(
            _profile_table(report),
            caption=_latex_escape(
                f"Performance profile of the final {name}: the share of seeds scoring above each value, with its "
                f"{report.analysis.settings.get('profile_band', 'DKW band')}."
            ),
            label="tab:stability-profile",
        ),
        _latex(
            _shape_table(report),
            caption=f"Shape of the final {name} over seeds (outliers by seed index).",
            label="tab:stability-shape",
        ),
    ]
    differences, failures = _comparison_tables(report)
    if not differences.empty:
        parts.append(
            _latex(
                differences,
                caption="Pairwise comparisons (paired figures when the configurations share seeds; "
                "p-values Holm-adjusted per test across pairs).",
                label="tab:stability-comparisons",
            )
        )
        parts.append(
            _latex(
                failures,
                caption="Seeds gone wrong per configuration, compared by McNemar's exact test when the seeds "
                "are shared, else Fisher's exact test (Holm-adjusted).",
                label="tab:stability-failures",
            )
        )
    power = _power_table(report)
    if not power.empty:
        parts.append(
            _latex(
                power,
                caption=_latex_escape(_power_caption(report.analysis)),
                label="tab:stability-power",
            )
        )
    decomposition = report.analysis.decomposition
    decomposition = decomposition[decomposition["metric"] == report.metric]
    if not decomposition.empty:
        parts.append(
            _latex(
                _decomposition_table(report, decomposition),
                caption=f"Sources of variance of the final {name}: each source's variance with its 95\\% interval "
                "(method 'sources': normal-theory chi-square, "
                f"{_latex_escape(MEASURED['variance'])}; 'grid': two-way random-effects ANOVA, "
                f"{_latex_escape(MEASURED['grid init and data'])}) and its share "
                "(a point estimate, without interval).",
                label="tab:stability-decomposition",
            )
        )
    path = out / "report.tex"
    atomic_write_text(path, "\n".join(parts))
    return [path]


_WRITERS = {"csv": _write_csv, "json": _write_json, "md": _write_markdown, "html": _write_html, "tex": _write_latex}


# --------------------------------------------------------------- sections


@dataclass
class _Section:
    title: str
    text: str
    table: pd.DataFrame | None = None
    figure: str | None = None


def _sections(report: _Report) -> list[_Section]:
    metadata, analysis = report.result.metadata, report.analysis
    seeds = report.result.seeds
    failed = seeds[seeds["status"] != "completed"]
    sections = [
        _Section("Protocol", _protocol_text(metadata, analysis), _protocol_table(metadata)),
        _Section("Distribution over seeds", DISTRIBUTION_TEXT, _distribution_table(report), "distribution"),
        _Section("Seeds gone wrong, and modes", _modes_text(analysis), _modes_table(report)),
        _Section("Performance profile", _profile_text(analysis), _profile_table(report), "profile"),
        _Section("Shape and noise", _shape_text(report), _shape_table(report)),
        _Section("Empirical distribution", "Fraction of seeds at or below each final value.", None, "ecdf"),
        _Section(
            "Learning curves",
            f"Every seed as a thin line; the band: {_band_label(analysis)}, per epoch.",
            None,
            "curves",
        ),
    ]
    if metadata.get("sequential"):
        sequential = metadata["sequential"]
        sections.insert(1, _Section("Stopping", stopping_text(sequential), _stopping_table(sequential)))
    if len(failed):
        sections.append(
            _Section(
                f"Failed seeds ({len(failed)} of {len(seeds)})",
                "These seeds are counted, not dropped: they did not finish or diverged.",
                _missing_as_blank(
                    failed[
                        [
                            "config",
                            "design",
                            "seed_index",
                            "seed_init",
                            "seed_data",
                            "seed_dropout",
                            "seed_split",
                            "epochs",
                            "reason",
                        ]
                    ]
                ),
            )
        )
    differences, failure_rates = _comparison_tables(report)
    if not differences.empty:
        sections += [
            _Section("Comparisons", COMPARISON_TEXT, differences),
            _Section("Failure rates compared", FAILURE_COMPARISON_TEXT, failure_rates),
        ]
    ranking = analysis.ranking[analysis.ranking["metric"] == report.metric]
    if len(ranking) > 1:
        sections.append(
            _Section(
                "Ranking with intervals",
                "Best first by mean, with each mean's 95% t interval. Overlap of two intervals is not a test "
                "(intervals can overlap while the difference is significant): read the comparisons for that.",
                _ranking_table(report, ranking),
                "comparison",
            )
        )
    sections.append(_Section("Power", _power_text(analysis), _power_table(report)))
    decomposition = analysis.decomposition[analysis.decomposition["metric"] == report.metric]
    if not decomposition.empty:
        sections.append(
            _Section(
                "Sources of variance",
                _decomposition_text(metadata),
                _decomposition_table(report, decomposition),
                "variance",
            )
        )
    mode_sources = analysis.mode_sources
    mode_sources = mode_sources[mode_sources["metric"] == report.metric] if not mode_sources.empty else mode_sources
    if not mode_sources.empty:
        sections.append(
            _Section("Which seed moves runs between modes", MODE_SOURCES_TEXT, _mode_sources_table(mode_sources))
        )
    sections.append(
        _Section(
            "All metrics",
            "Every recorded metric, every design (rounded to six decimals; the intervals are in the sections above "
            "and in the CSV/JSON).",
            _round(analysis.summary.drop(columns=["outliers", "best_of_k", "worse_mode_seeds"])),
        )
    )
    return sections


# What benchmarks/coverage.py measured of each interval on seeds of any shape (normal, t3, t2, log-normal, two
# modes, three modes, seeds between two clusters; n 5-64): benchmarks/results/coverage_shapes.json, the table in
# docs/stability.md; tests/test_stability_report.py checks these figures against that file.
MEASURED = {
    "median": "exact: at least 95% from 6 seeds, for any continuous shape; 93.8% at 5 seeds, the most 5 allow",
    "iqm": "measured 82-96% across shapes at n = 5-64: 82-91% at 5 seeds, 93-96% from 8",
    "mean": "measured 42-97% across shapes at n = 5-64: 42-83% at 5 seeds with modes or a tail of bad seeds",
    "gone wrong": "exact: at least 95% for any shape; measured 96-100%",
    "profile": "at least 95% for any shape; measured 95-98%",
    "p better": "measured 92-97% across shapes at n = 5-64",
    # the intervals of a difference, of a variance and of a crossed grid (`--differences-only`):
    # benchmarks/results/coverage_differences.json, checked against that file by the same test module
    "paired t": "measured 94-99% across shapes at n = 5-64 when both configurations' seeds share the shape",
    "paired t, A alone": "measured 56-97% when only one configuration's seeds go wrong: 56-58% at 5-8 seeds "
    "with two modes",
    "welch": "measured 94-99% across shapes at n = 5-64 when both share the shape",
    "welch, A alone": "measured 53-97% when only one goes wrong: 53-57% at 5-8 seeds with two modes",
    "variance": "measured 0-96% across shapes at n = 5-64: 95% on normal seeds, 33-93% with heavy tails or modes, "
    "0% on t2 seeds, which have no variance",
    "crossed mean": "measured 56-98% on crossed 3x3 to 8x8 grids: 94-98% with normal or t3 effects, 56-81% "
    "when failures follow the init seed",
    "grid init and data": "measured 59-96% on the same grids: 93-96% with normal effects, 81-92% with t3 "
    "effects, 59-82% for init when failures follow it",
    "grid residual": "measured 57-95% on the same grids: 94-95% with normal effects, 57-88% with t3 effects",
}
INTERVALS_CAPTION = (
    "The headline: the median with its exact order-statistic 95% interval, and the seeds gone wrong. Beside it: "
    f"the IQM with rliable's stratified percentile bootstrap interval ({MEASURED['iqm']}) and the mean with "
    f"Student's t interval ({MEASURED['mean']})."
)
DISTRIBUTION_TEXT = (
    "Completed seeds only; failed or diverged seeds are counted in 'failed'. The headline holds whatever the shape "
    "of the seeds (normal, heavy-tailed, two or three modes): the median with its exact order-statistic 95% "
    f"interval ({MEASURED['median']}; its exact level beside it), and the seeds gone wrong (next section). The "
    f"IQM (interquartile mean) has rliable's stratified percentile bootstrap interval ({MEASURED['iqm']}). The "
    f"mean has Student's t interval ({MEASURED['mean']}); 'few seeds' marks n below 5. The grid design's interval "
    "of the mean is the crossed design's (runs sharing an init or a data seed are not independent; "
    f"{MEASURED['crossed mean']}). The BCa "
    "bootstrap interval of the mean is in the CSV/JSON."
)
COMPARISON_TEXT = (
    "'Better' follows the metric's direction (higher accuracy, lower loss). Paired ('same seeds': both "
    "configurations trained the same seeds slot for slot, as `compare` does): the mean difference with the "
    "paired-t interval, the paired t-test and the Wilcoxon signed-rank test, and P(A better) over the pairs "
    "(ties half) with its exact interval. Independent (different seeds): Welch's interval and t-test, "
    "Mann-Whitney U, and P(A better) over all pairs of seeds with Newcombe's score interval "
    f"({MEASURED['p better']}). The t intervals of a difference are not distribution-free: paired t "
    f"{MEASURED['paired t']}, {MEASURED['paired t, A alone']}; Welch {MEASURED['welch']}, "
    f"{MEASURED['welch, A alone']}. Every p-value is "
    "Holm-adjusted per test across the pairs (in brackets). Cohen's d and Cliff's delta (positive: A better) "
    "and almost-stochastic-order epsilon_min (Bonferroni-adjusted confidence; below 0.5: A tends to be better) "
    "treat the seeds as independent."
)
FAILURE_COMPARISON_TEXT = (
    "Seeds gone wrong (failed, or past the gone-wrong cut of its study) per configuration, and an exact test of "
    "the difference between the two rates (Holm-adjusted across the pairs). With shared seeds the outcomes are "
    "paired: McNemar's exact test (a binomial test on the discordant slots, those wrong under one configuration "
    "only; 'A only / B only' counts them). With independent seeds: Fisher's exact test."
)


# What benchmarks/coverage.py measured of the mode rule (docs/stability.md has the table).
MODE_RULE_MEASURED = (
    "On simulated unimodal studies of 5 to 64 seeds it splits at most 1.1% of normal ones, 2.8% of skewed "
    "(gamma 4), 5.0% of gamma-2 and 9.3% of heavy-tailed (t, 3 df) ones, and 8-19% of very skewed (log-normal) "
    "ones; on studies with seeds in a mode 35 sd lower it finds exactly those seeds in 99.8-100% from 5 seeds"
)


def _modes_text(analysis: Analysis) -> str:
    settings = analysis.settings
    return (
        f"A seed 'went wrong' when it {settings.get('gone_wrong_rule', 'failed')} (the cut is in the table; "
        "--fail-below sets a threshold, --fail-margin the distance). No mode is found first: the count holds "
        "whatever the shape of the seeds. Its rate has an exact (Clopper-Pearson) 95% interval "
        f"({MEASURED['gone wrong']}) over independent units "
        "(seeds; init seeds in a grid, where runs sharing one are not independent); with none gone wrong, "
        "the one-sided 95% bound says what rate is still possible. To see at least one failure of a 1-in-10 kind "
        f"with 90% probability takes {settings.get('seeds_to_see_1_in_10_with_90_percent', 22)} seeds. The modes "
        f"describe the values and bound nothing. Mode rule: {settings.get('mode_rule', '')}. {MODE_RULE_MEASURED} "
        "(docs/stability.md has the table); it looks for one gap, so three modes may read as one: the performance "
        "profile shows every shape."
    )


def _profile_text(analysis: Analysis) -> str:
    return (
        "The share of seeds scoring above each value (rliable's performance profile, run by run), with its "
        f"{analysis.settings.get('profile_band', 'DKW band')} ({MEASURED['profile']}): its half-width is "
        "sqrt(log(2 / 0.05) / (2 n)), "
        "0.48 at 8 seeds and 0.17 at 64. Completed seeds only (a failed seed is in the count gone wrong). Every "
        "shape shows in it: a second or third mode is a step down. The table reads it at the deciles of every "
        "configuration's seeds pooled (0% to 100%); the figure and the CSV/JSON hold the whole of it."
    )


def _shape_text(report: _Report) -> str:
    text = (
        "Coefficient of variation, Shapiro-Wilk p (normality), the seeds outside Tukey's fences (by seed_index), "
        "and the expected best of k seeds."
    )
    if not report.is_accuracy:
        return text
    return text + (
        " The noise floor sqrt(p(1-p)/n_test) is the binomial standard error of one seed's accuracy p as an "
        "estimate of its accuracy on the population the test set was drawn from. It is not a floor on "
        "seed-to-seed differences: every seed is scored on the same test set, so differences between seeds can "
        "be smaller than it. 'var / noise var' sets the seed-to-seed variance beside it: well above 1, the seeds "
        "vary more than the test set measures any one of them precisely."
    )


def _power_text(analysis: Analysis) -> str:
    return (
        "Smallest true difference of means the seeds detect, and the seeds each difference would need (two-sided "
        "alpha 0.05, power 0.8), in the test the design calls for. Configurations that trained the same seeds "
        "(paired): the paired t-test (n - 1 degrees of freedom) at the sd of the differences over the pairs both "
        "completed, a row per pair, seeds counted in pairs. Independent seeds: Student's two-sample t-test with "
        "pooled variance (2n - 2 degrees of freedom) at the configuration's seed-to-seed sd, seeds per "
        "configuration. Both assume one mode: where the report finds two, the figures are withheld (a worse mode "
        "inflates the sd, and the t-test does not describe such seeds; read the failure rate). To see one failure "
        "of a 1-in-10 kind with 90% probability takes "
        f"{analysis.settings.get('seeds_to_see_1_in_10_with_90_percent', 22)} seeds."
    )


def _power_caption(analysis: Analysis) -> str:
    return (
        "Power: smallest detectable difference and seeds needed (two-sided alpha 0.05, power 0.8); paired t on the "
        "differences where the configurations share seeds, two-sample t otherwise; withheld where two modes are "
        "found."
    )


def _band_label(analysis: Analysis) -> str:
    """The learning curves' band in words: the statistic the analysis computed per epoch."""
    from ._analysis import band_label

    methods = analysis.per_epoch["ci_method"].dropna() if "ci_method" in analysis.per_epoch else pd.Series()
    return str(methods.iloc[0]) if len(methods) else band_label(analysis.settings.get("confidence", 0.95))


def _decomposition_text(metadata: dict[str, Any]) -> str:
    dropout = "dropout" in metadata.get("vary", [])
    residual = (
        "dropout (varied per cell) and what the seeds leave unexplained"
        if dropout
        else "what the seeds leave unexplained (dropout kept one seed: it adds nothing here)"
    )
    return (
        "Method 'sources' (--decompose): each source varied alone (the others fixed), each design with seeds of "
        "its own; its variance with a normal-theory chi-square 95% interval (not distribution-free: "
        f"{MEASURED['variance']}; see docs/stability.md), and its "
        "share of the sum of the sources' variances (a point estimate, without interval), beside the total when "
        "all vary. If the sources interact, each one-at-a-time design counts their interaction once more and the "
        "total falls below the sum; the report does not test this, and a total below the sum within the "
        "intervals may be noise. Method 'grid' (--decompose grid): init seeds crossed with data seeds, one run "
        "per cell; two-way random-effects ANOVA components with 95% intervals (modified large-sample for init "
        f"and data, {MEASURED['grid init and data']}; chi-square for their interaction, which holds the residual: "
        f"{residual}; {MEASURED['grid residual']})."
    )


MODE_SOURCES_TEXT = (
    "When a decomposition design splits into two modes: which source of randomness sends runs to the worse one. "
    "Grid: the worse-mode runs against the grid's init seeds and its data seeds; an exact permutation test "
    "(Fisher-Freeman-Halton, with the chi-square statistic) asks whether they crowd into some seeds of a source "
    "more than runs placed at random would (p below 0.05: the mode follows that source; one worse run gives p = 1, "
    "as it cannot crowd anywhere). Sources: each one-at-a-time design's runs on the worse side of the main "
    "design's split; a source whose design has runs in both modes moves runs between modes by itself, and a "
    "design with every run in the worse mode says the other sources' fixed seeds put them there."
)


def _mode_sources_table(mode_sources: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "config": r["config"],
                "method": r["method"],
                "source": r["source"],
                "worse-mode runs": f"{int(r['worse_n'])} of {int(r['runs'])}",
                "its seeds holding them": (
                    f"{int(r['levels_with_worse'])} of {int(r['levels'])}" if r["method"] == "grid" else ""
                ),
                "exact p": _p(r["p"]) if np.isfinite(r["p"]) else "",
                "verdict": r["verdict"],
            }
            for _, r in mode_sources.iterrows()
        ]
    )


def stopping_text(sequential: dict[str, Any]) -> str:
    """Why the rounds of `--until` stopped: the question answered, or --max-seeds reached with it open."""
    rounds = sequential["rounds"]
    how = "answered" if sequential["decided"] else f"still open at --max-seeds {sequential['max_seeds']}"
    return (
        f"--until {sequential['question']}: {how} after {len(rounds)} round(s), {rounds[-1]['seeds']} seeds "
        f"per configuration ({sequential['confidence']:.0%} anytime-valid confidence sequences)"
    )


def _stopping_table(sequential: dict[str, Any]) -> pd.DataFrame:
    """Every look of the rounds: each configuration's (or pair's) answer after each round."""
    rows = [
        {"round": number, "seeds": look["seeds"], "answer": a["text"], "decided": "yes" if a["decided"] else "no"}
        for number, look in enumerate(sequential["rounds"], start=1)
        for a in look["answers"]  # each answer's text names its configuration or pair
    ]
    return pd.DataFrame(rows, columns=["round", "seeds", "answer", "decided"])


def _protocol_text(metadata: dict[str, Any], analysis: Analysis) -> str:
    command = metadata.get("command", "")
    return (
        f"Reproduce with: {command}. Bootstrap: {analysis.settings.get('n_resamples')} resamples, "
        f"seed {analysis.settings.get('bootstrap_seed')}."
    )


def _protocol_table(metadata: dict[str, Any]) -> pd.DataFrame:
    determinism = metadata.get("determinism", {})
    versions = metadata.get("versions", {})
    seeds = metadata.get("seeds_per_source", {})
    rows = [
        ("configurations", ", ".join(metadata.get("configs", {}))),
        ("seeds per configuration", metadata.get("n_seeds")),
        ("varied sources", ", ".join(metadata.get("vary", []))),
        *[(f"{source} seeds", _short_list(values)) for source, values in seeds.items()],
        ("device", _device(metadata)),
        ("dtype", metadata.get("dtype")),
        ("test-set size", metadata.get("n_test")),
        ("torch threads", determinism.get("torch_threads")),
        ("deterministic algorithms", determinism.get("deterministic_algorithms")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("wall time (s)", round(metadata["seconds"], 1) if isinstance(metadata.get("seconds"), (int, float)) else None),
    ]
    return pd.DataFrame([(k, "" if v is None else str(v)) for k, v in rows], columns=["setting", "value"])


def _device(metadata: dict[str, Any]) -> str | None:
    """ "cuda (NVIDIA H200)"; None (an empty cell) when the result did not record it."""
    device, name = metadata.get("device"), metadata.get("device_name")
    return None if device is None else f"{device}" + (f" ({name})" if name else "")


def _short_list(values: list[Any], keep: int = 6) -> str:
    shown = ", ".join(map(str, values[:keep]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > keep else "")


# ----------------------------------------------------------------- tables


def _scale(report: _Report) -> tuple[float, str]:
    return (100.0, "%") if report.is_accuracy else (1.0, "")


def _fmt(value: Any, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return f"{scale * float(value):.{digits}f}{unit}"


def _p(value: Any) -> str:
    """A p-value: three decimals, or scientific notation below 0.001 (never a bare 0)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return f"{float(value):.3f}" if float(value) >= 1e-3 else f"{float(value):.1e}"


def _metric_rows(report: _Report) -> tuple[pd.DataFrame, bool]:
    summary = report.analysis.summary
    rows = summary[summary["metric"] == report.metric]
    return rows, rows["design"].nunique() > 1


def _value_format(report: _Report) -> Any:
    scale, unit = _scale(report)
    digits = 2 if report.is_accuracy else 4
    return lambda v: _fmt(v, scale, unit, digits)


def _keys(r: pd.Series, several_designs: bool) -> dict[str, Any]:
    return {"config": r["config"], **({"design": r["design"]} if several_designs else {})}


def _distribution_table(report: _Report) -> pd.DataFrame:
    """The headline per configuration (median, seeds gone wrong), then the IQM and the mean, each
    interval labelled with its method and what it was measured to cover."""
    rows, several_designs = _metric_rows(report)
    f = _value_format(report)
    table = []
    for _, r in rows.iterrows():
        method = "crossed" if str(r["ci_method"]).startswith("crossed") else "t"
        level = f"{r['median_level']:.1%}" if np.isfinite(r["median_level"]) else MISSING
        table.append(
            {
                **_keys(r, several_designs),
                "n": int(r["n"]),
                "failed": int(r["n_failed"]),
                "headline": r["headline"],
                "median [exact CI] (its level)": f"{f(r['median'])} [{f(r['median_low'])}, {f(r['median_high'])}] "
                f"({level})",
                "IQM [95% bootstrap CI]": f"{f(r['iqm'])} [{f(r['iqm_low'])}, {f(r['iqm_high'])}]",
                f"mean [95% {method} CI; not distribution-free]": f"{f(r['mean'])} [{f(r['ci_low'])}, "
                f"{f(r['ci_high'])}]" + (" (few seeds)" if r["few_seeds"] else ""),
                "min – max": f"{f(r['min'])} – {f(r['max'])}",
            }
        )
    return pd.DataFrame(table)


def gone_wrong(r: pd.Series | dict[str, Any]) -> str:
    """ "0 of 8 seeds (still possible: up to 31%, one-sided 95%)" or "2 of 8 seeds = 25% [3.2%, 65%]"
    (units: "init seeds" in a grid)."""
    if not r["bad_of"]:
        return "no seeds"
    units = f"{int(r['bad_of'])} {r.get('bad_unit', 'seed') or 'seed'}s"
    if r["bad_n"] == 0:
        return f"0 of {units} (still possible: up to {r['bad_upper']:.0%}, one-sided 95%)"
    return f"{int(r['bad_n'])} of {units} = {r['bad_rate']:.1%} [{r['bad_low']:.1%}, {r['bad_high']:.1%}]"


def _what_went_wrong(r: pd.Series) -> str:
    """The runs behind the count (in a grid, runs; the count is of units)."""
    parts = [
        f"{int(r['bad_failed'])} failed" if r["bad_failed"] else "",
        f"{int(r['bad_below'])} past the cut" if r["bad_below"] else "",
    ]
    return ", ".join(p for p in parts if p) or "none"


def _modes_table(report: _Report) -> pd.DataFrame:
    rows, several_designs = _metric_rows(report)
    f = _value_format(report)
    table = []
    from ._analysis import _higher_is_better

    side = "below" if _higher_is_better(report.metric) else "above"
    for _, r in rows.iterrows():
        split = r["modes"] == 2
        spread = lambda mean, std: f(mean) + (f" ± {f(std)}" if np.isfinite(std) else "")  # noqa: E731 (local helper)
        table.append(
            {
                **_keys(r, several_designs),
                "gone wrong [95% exact CI]": gone_wrong(r),
                "cut": f"{side} {f(r['bad_cut'])}",
                "runs behind it": _what_went_wrong(r),
                "modes (description)": int(r["modes"]),
                "a gap: lower group n, mean ± sd": (
                    f"{int(r['worse_mode_n'])}, {spread(r['worse_mode_mean'], r['worse_mode_std'])}" if split else ""
                ),
                "its seeds (seed_index)": ", ".join(f"#{i}" for i in str(r["worse_mode_seeds"]).split(",") if i),
            }
        )
    return pd.DataFrame(table)


def _profile_table(report: _Report) -> pd.DataFrame:
    """The profile of the main design read at its eleven thresholds: one row per threshold, one
    column per configuration, "share [band]"."""
    profiles = report.analysis.profiles
    if profiles.empty:
        return profiles
    f = _value_format(report)
    rows = profiles[(profiles["metric"] == report.metric) & (profiles["design"] == "all")]
    table: dict[str, dict[str, str]] = {}
    for _, r in rows.iterrows():
        cell = f"{r['share']:.0%} [{r['low']:.0%}, {r['high']:.0%}]"
        table.setdefault(f(r["threshold"]), {})[str(r["config"])] = cell
    return pd.DataFrame([{"above": threshold, **cells} for threshold, cells in table.items()])


def _shape_table(report: _Report) -> pd.DataFrame:
    rows, several_designs = _metric_rows(report)
    f = _value_format(report)
    table = []
    for _, r in rows.iterrows():
        best = json.loads(r["best_of_k"]) if r["best_of_k"] else {}
        row = {
            **_keys(r, several_designs),
            "CV": _fmt(r["cv"], 1, "", 4),
            "Shapiro p": _p(r["normality_p"]),
            "outlier seeds (seed_index)": ", ".join(f"#{i}" for i in str(r["outliers"]).split(",") if i) or "none",
            "expected best of k seeds": ", ".join(f"k={k}: {f(v)}" for k, v in best.items()) or MISSING,
        }
        if report.is_accuracy:
            row["noise floor sd"] = f(r["noise_floor_std"])
            row["var / noise var"] = _fmt(r["variance_ratio"], 1, "", 2)
        table.append(row)
    return pd.DataFrame(table)


def _comparison_tables(report: _Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(differences, failure rates): one row per pair, each in the figures its design calls for."""
    f = _value_format(report)
    rows = report.analysis.comparisons[report.analysis.comparisons["metric"] == report.metric]
    differences, failures = [], []
    for _, r in rows.iterrows():
        paired = bool(r["paired"])
        # the point and its interval are computed on the same seeds: the pairs both configurations
        # completed when paired (slots left out are named), every completed seed of each when not
        interval = ("paired_diff_low", "paired_diff_high") if paired else ("mean_diff_low", "mean_diff_high")
        point = r["paired_mean_diff"] if paired else r["mean_diff"]
        low, high = r[interval[0]], r[interval[1]]
        better = ("p_a_better_pairs", "p_a_better_pairs_low", "p_a_better_pairs_high")
        better = better if paired else ("p_a_better", "p_a_better_low", "p_a_better_high")
        t_test, rank_test = ("paired_t_p", "wilcoxon_p") if paired else ("welch_p", "mwu_p")
        differences.append(
            {
                "A": r["a"],
                "B": r["b"],
                "seeds": f"same ({pairs_text(r['n_pairs'], r['unpaired_slots'])})" if paired else "independent",
                "mean A - B [95% CI]": f"{f(point)} [{f(low)}, {f(high)}]",
                "t-test p (Holm)": f"{'paired' if paired else 'Welch'} {_p(r[t_test])} ({_p(r[t_test + '_holm'])})",
                "rank test p (Holm)": (
                    f"{'Wilcoxon' if paired else 'MWU'} {_p(r[rank_test])} ({_p(r[rank_test + '_holm'])})"
                ),
                "P(A better) [95% CI]": f"{_fmt(r[better[0]])} [{_fmt(r[better[1]])}, {_fmt(r[better[2]])}]",
                "Cohen d / Cliff delta": f"{_fmt(r['cohen_d'])} / {_fmt(r['cliff_delta'])}",
                "ASO eps_min": _fmt(r["aso_eps_min"], digits=3),
            }
        )
        failures.append(
            {
                "A": r["a"],
                "B": r["b"],
                "gone wrong A": f"{int(r['a_bad_n'])} of {int(r['a_bad_of'])}",
                "gone wrong B": f"{int(r['b_bad_n'])} of {int(r['b_bad_of'])}",
                "A only / B only": (
                    f"{int(r['a_only_bad'])} / {int(r['b_only_bad'])}" if np.isfinite(r["a_only_bad"]) else MISSING
                ),
                "test p (Holm)": f"{_rate_test_name(r)} {_p(r['bad_rate_p'])} ({_p(r['bad_rate_p_holm'])})",
            }
        )
    return pd.DataFrame(differences), pd.DataFrame(failures)


def pairs_text(n_pairs: Any, unpaired_slots: Any) -> str:
    """ "7 pairs; left out: #0 (no value: A)": the pairs the paired figures use, and the slots they
    leave out because a configuration gave no value there (failed, or a non-finite metric)."""
    text = f"{int(n_pairs)} pairs"
    left_out = [part.strip() for part in str(unpaired_slots or "").split(";") if part.strip()]
    if left_out:
        slots = ", ".join(f"#{part.replace(' (', ' (no value: ', 1)}" for part in left_out)
        text += f"; left out: {slots}"
    return text


def _rate_test_name(row: Any) -> str:
    return "McNemar" if str(row.get("bad_rate_test", "")).startswith("McNemar") else "Fisher"


def _ranking_table(report: _Report, ranking: pd.DataFrame) -> pd.DataFrame:
    scale, unit = _scale(report)
    f = lambda v: _fmt(v, scale, unit, 2 if report.is_accuracy else 4)
    return pd.DataFrame(
        [
            {
                "rank": "" if pd.isna(r["rank"]) else int(r["rank"]),
                "config": r["config"],
                "mean": f(r["mean"]),
                "95% CI (t)": f"[{f(r['ci_low'])}, {f(r['ci_high'])}]",
            }
            for _, r in ranking.iterrows()
        ]
    )


def _power_table(report: _Report) -> pd.DataFrame:
    """One row per paired comparison (the paired t-test at the sd of the differences) and per
    configuration compared on independent seeds (two-sample t); withheld where modes were found."""
    scale, unit = _scale(report)
    power = report.analysis.power[report.analysis.power["metric"] == report.metric]
    needed = [c for c in power.columns if c.startswith("seeds_needed_")]
    f = lambda v: _fmt(v, scale, unit, 2 if report.is_accuracy else 4)  # noqa: E731 (local helper)
    rows = []
    for _, r in power.iterrows():
        paired = str(r.get("test", "")).startswith("paired")
        row = {
            "config": r["config"],
            "test": r.get("test", ""),
            "n": f"{int(r['n'])} pairs" if paired else int(r["n"]),
            "std": f(r["std"]) + (" (of the differences)" if paired else ""),
            "min detectable diff": f(r["min_detectable_diff"]),
        }
        for column in needed:
            difference = float(column.removeprefix("seeds_needed_"))
            row[f"seeds for {_fmt(difference, scale, unit, 1 if report.is_accuracy else 3)}"] = _fmt(
                r[column], digits=0
            )
        if str(r.get("note", "") or ""):
            row["note"] = r["note"]
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.fillna("") if "note" in table else table


def _decomposition_table(report: _Report, decomposition: pd.DataFrame) -> pd.DataFrame:
    """Variances with their intervals (three significant digits, in the metric's units squared) and
    shares as whole percentages: a share is a point estimate without an interval."""
    g = lambda v: MISSING if not np.isfinite(v) else f"{v:.3g}"  # noqa: E731 (local helper)
    return pd.DataFrame(
        [
            {
                "config": r["config"],
                "method": r["method"],
                "source": r["source"],
                "variance [95% CI]": f"{g(r['variance'])} [{g(r['ci_low'])}, {g(r['ci_high'])}]",
                "share (point estimate)": MISSING if not np.isfinite(r["share"]) else f"{r['share']:.0%}",
            }
            for _, r in decomposition.iterrows()
        ]
    )


def _markdown_table(frame: pd.DataFrame) -> str:
    """A pipe table whose missing cells (NaN, None, pd.NA) read as a dash, never "nan"."""
    cells = frame.astype(object).where(frame.notna(), None)
    return cells.to_markdown(index=False, missingval=MISSING)


def _missing_as_blank(frame: pd.DataFrame) -> pd.DataFrame:
    """A table of identifiers (seed numbers, reasons) whose missing cells are blank: an empty
    seed_split means "the data's own split", not a value that could not be computed."""
    return frame.astype(object).where(frame.notna(), "")


def _round(frame: pd.DataFrame, digits: int = 6) -> pd.DataFrame:
    return frame.round({c: digits for c in frame.columns if pd.api.types.is_float_dtype(frame[c])})


# Characters of the tables that plain LaTeX (no inputenc tricks) cannot typeset, in math or text mode.
_LATEX_SYMBOLS = {
    "±": "$\\pm$",
    "–": "--",
    "—": "---",
    "×": "$\\times$",
    "≥": "$\\geq$",
    "≤": "$\\leq$",
    "≈": "$\\approx$",
    "ε": "$\\varepsilon$",
}


# The tables are set in \footnotesize with narrow gaps between columns; a column whose longest cell
# would make the table wider than the text width wraps its text (ragged right) in a p{} column.
_LATEX_SIZE = "\\footnotesize"
_LATEX_TABCOLSEP_PT = (4.0, 3.0, 2.0)  # half the gap between columns: the widest that lets every word fit
_LATEX_TEXT_WIDTH_PT = 345.0  # an article's \textwidth: the widths are written as fractions of \linewidth
# Advance widths in points of \footnotesize text (cmr8, from its metrics), and of the math symbols that
# _LATEX_SYMBOLS writes; other characters count as 4.5pt. The estimate is only used to choose where text
# wraps: _LATEX_MARGIN makes it err towards wrapping rather than overhanging.
_LATEX_CHAR_PT = {
    **dict.fromkeys("ijl.,:;[]'!`", 2.36),
    **dict.fromkeys("f", 2.6),
    **dict.fromkeys(" -", 2.83),
    **dict.fromkeys("I", 3.06),
    "_": 3.8,
    **dict.fromkeys("rst()", 3.35),
    **dict.fromkeys("cez", 3.78),
    **dict.fromkeys("0123456789ago/J", 4.25),
    **dict.fromkeys("kqvxy", 4.49),
    **dict.fromkeys("bdhnpuS", 4.72),
    **dict.fromkeys("LZ", 5.31),
    **dict.fromkeys("EFP", 5.78),
    **dict.fromkeys("w", 6.14),
    **dict.fromkeys("ABCDGHKNOQRTUVXY", 6.67),
    **dict.fromkeys("m%#=+", 7.08),
    **dict.fromkeys("MW", 8.73),
    **dict.fromkeys("±×≥≤≈", 7.0),
    "–": 4.25,
    "—": 8.5,
}
_LATEX_MARGIN = 1.05


def _latex_width(text: str) -> float:
    """Estimated width in points of `text` set in one line."""
    return _LATEX_MARGIN * sum(_LATEX_CHAR_PT.get(c, 4.5) for c in text)


def _latex_words(text: str) -> list[str]:
    """The pieces of `text` that cannot be broken across lines (it breaks at spaces, hyphens and underscores)."""
    return re.split(r"[ ]+|(?<=_)|(?<=-)(?!\d)", text.strip()) or [""]


def _latex_escape(text: str) -> str:
    """Plain text as LaTeX: special characters escaped, the symbols of _LATEX_SYMBOLS in math mode."""
    special = {
        "\\": "\\textbackslash{}",
        "&": "\\&",
        "%": "\\%",
        "$": "\\$",
        "#": "\\#",
        "_": "\\_\\allowbreak{}",  # long configuration names (resnet18_sgd_lr0.1) may wrap after an underscore
        "{": "\\{",
        "}": "\\}",
        "~": "\\textasciitilde{}",
        "^": "\\textasciicircum{}",
    }
    text = "".join(special.get(c, c) for c in text)
    text = re.sub(r"-(?=\d)", r"\\mbox{-}", text)  # a minus sign (-5.97%, 4.8e-06) never ends a line
    for symbol, replacement in _LATEX_SYMBOLS.items():
        text = text.replace(symbol, replacement)
    return text


def _latex_column_widths(natural: list[float], least: list[float], room: float) -> list[float]:
    """Widths in points: every column at its natural width when they fit in `room`, else the widest
    capped at one common width (never below a column's longest word) so that they fill `room`."""
    if sum(natural) <= room:
        return natural
    low, high = 0.0, max(natural)
    for _ in range(60):
        cap = (low + high) / 2
        if sum(min(n, max(cap, m)) for n, m in zip(natural, least)) > room:
            high = cap
        else:
            low = cap
    return [min(n, max(low, m)) for n, m in zip(natural, least)]


def _latex(table: pd.DataFrame, *, caption: str, label: str) -> str:
    """A booktabs table in \\footnotesize that fits the text width without scaling: the columns whose
    text is too long for one line wrap it (ragged right, numbers ragged left), each column a p{}
    column written as a fraction of \\linewidth; ASCII and math only, and no package beyond booktabs."""
    cells = [[(MISSING if pd.isna(v) else str(v)) for v in row] for row in table.itertuples(index=False)]
    headers = [str(c) for c in table.columns]
    numeric = [pd.api.types.is_numeric_dtype(table[c]) for c in table.columns]
    longest = [max([_latex_width(row[i]) for row in cells], default=0.0) for i in range(len(headers))]
    least = [
        max(_latex_width(word) for text in [*(row[i] for row in cells), header] for word in _latex_words(text))
        for i, header in enumerate(headers)
    ]
    gap = next(
        (g for g in _LATEX_TABCOLSEP_PT if sum(least) <= _LATEX_TEXT_WIDTH_PT - 2 * g * len(headers)),
        _LATEX_TABCOLSEP_PT[-1],
    )
    room = _LATEX_TEXT_WIDTH_PT - 2 * gap * len(headers)
    # The headers wrap first, then the longest cells; room left over goes back to the wrapped headers.
    widths = _latex_column_widths([max(n, m) for n, m in zip(longest, least)], least, room)
    natural = [max(w, _latex_width(header)) for w, header in zip(widths, headers)]
    widths = _latex_column_widths(natural, widths, room)
    spec = "".join(
        f"p{{\\dimexpr {(w + 2 * gap) / _LATEX_TEXT_WIDTH_PT:.4f}\\linewidth-2\\tabcolsep\\relax}}" for w in widths
    )

    def row(texts: list[str]) -> str:
        # \tabularnewline, not \\, ends a row whose last cell is ragged (\raggedright redefines \\)
        aligned = [
            ("\\raggedleft " if right else "\\raggedright ") + _latex_escape(t) for t, right in zip(texts, numeric)
        ]
        return " & ".join(aligned) + " \\tabularnewline"

    lines = [
        "\\begin{table}[htbp]",
        "\\centering",
        f"\\caption{{{caption}}}",
        f"\\label{{{label}}}",
        _LATEX_SIZE,
        f"\\setlength{{\\tabcolsep}}{{{gap:g}pt}}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        row(headers),
        "\\midrule",
        *[row(r) for r in cells],
        "\\bottomrule",
        "\\end{tabular}",
        "\\end{table}",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------- JSON


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _strict(value: Any) -> Any:
    """NaN and infinities become null; numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


_HTML_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
th, td {{ padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; text-align: right; }}
th {{ background: #f4f4f4; }}
img {{ max-width: 100%; display: block; margin: 0.5em 0; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
