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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hfta_nas.errors import HftaNasError
from hfta_nas.runtime import atomic_write_text
from stability import _plots
from stability._formats import FORMATS, PLOT_FORMATS
from stability._result import Analysis, StabilityResult


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
    }
    written = []
    for name, frame in frames.items():
        if name in ("comparisons", "decomposition") and frame.empty:
            continue  # only meaningful with several configs / --decompose
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
        row["outliers"] = [int(i) for i in row["outliers"].split(",")] if row.get("outliers") else []
    document = {
        "metric": report.metric,
        "protocol": report.result.metadata,
        "settings": analysis.settings,
        "summary": summary,
        "comparisons": _records(analysis.comparisons),
        "ranking": _records(analysis.ranking),
        "power": _records(analysis.power),
        "decomposition": _records(analysis.decomposition),
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
            lines += [section.table.to_markdown(index=False), ""]
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
            body.append(section.table.to_html(index=False, border=0, na_rep="n/a", escape=True))
    document = _HTML_PAGE.format(title=html.escape(f"hfta-nas stability: {report.metric}"), body="\n".join(body))
    path = out / "report.html"
    atomic_write_text(path, document)
    return [path]


def _write_latex(report: _Report, out: Path) -> list[Path]:
    """A booktabs table of the metric per configuration (and the comparisons, when any),
    ready for \\input{} in a paper (needs \\usepackage{booktabs,graphicx})."""
    parts = [
        _latex(
            _distribution_table(report),
            caption=f"Final {report.metric.replace('_', ' ')} over seeds (mean $\\pm$ std, 95\\% intervals).",
            label="tab:stability",
        )
    ]
    comparisons = _comparison_table(report)
    if not comparisons.empty:
        parts.append(
            _latex(
                comparisons,
                caption="Pairwise comparisons (p-values Holm-adjusted per test across pairs).",
                label="tab:stability-comparisons",
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
        _Section(
            "Distribution over seeds",
            "Completed seeds only; failed or diverged seeds are counted in 'failed'. The interval is the 95% "
            "t interval of the mean (measured at 93-97% coverage from 5 seeds on normal, skewed and "
            "heavy-tailed data; 'few seeds' marks n below 5, where its level rests on normality; the BCa "
            "bootstrap interval is in the CSV/JSON). The noise floor sqrt(p(1-p)/n_test) is the standard "
            "error with which one seed's test accuracy p estimates its accuracy on the population the "
            "test set was drawn from: differences between seeds of about that size cannot be told apart "
            "from the luck of which examples are in the test set. 'var / noise var' well above 1: the "
            "seeds differ by more than that.",
            _distribution_table(report),
            "distribution",
        ),
        _Section("Empirical distribution", "Fraction of seeds at or below each final value.", None, "ecdf"),
        _Section(
            "Learning curves", "Every seed as a thin line; the mean with its 95% t interval as a band.", None, "curves"
        ),
    ]
    if len(failed):
        sections.append(
            _Section(
                f"Failed seeds ({len(failed)} of {len(seeds)})",
                "These seeds are counted, not dropped: they did not finish or diverged.",
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
                ],
            )
        )
    comparisons = _comparison_table(report)
    if not comparisons.empty:
        sections.append(
            _Section(
                "Comparisons",
                "'Better' follows the metric's direction (higher accuracy, lower loss). Welch's t and "
                "Mann-Whitney U p-values, each Holm-adjusted across the pairs (in brackets); Cohen's d and Cliff's "
                "delta (positive: A better); P(A better than B), ties counted half, with Newcombe's 95% score "
                "interval; almost-stochastic-order epsilon_min at a Bonferroni-adjusted confidence (below 0.5: A "
                "tends to be better; 0 is strict dominance).",
                comparisons,
            )
        )
    ranking = analysis.ranking[analysis.ranking["metric"] == report.metric]
    if len(ranking) > 1:
        sections.append(
            _Section(
                "Ranking with intervals",
                "Best first; overlapping intervals mean the order may be a matter of seeds.",
                _ranking_table(report, ranking),
                "comparison",
            )
        )
    sections.append(
        _Section(
            "Power",
            "Smallest difference of means these seeds detect (two-sided Welch, alpha 0.05, power 0.8) and "
            "the seeds per configuration each difference would need, at the observed seed-to-seed std.",
            _power_table(report),
        )
    )
    decomposition = analysis.decomposition[analysis.decomposition["metric"] == report.metric]
    if not decomposition.empty:
        sections.append(
            _Section(
                "Sources of variance",
                "Method 'sources' (--decompose): each source varied alone (the others fixed), "
                "each design with seeds of its own; its variance, 95% chi-square interval and share of the sum of the "
                "sources' variances, beside the total when all vary (a total below the sum: the sources "
                "interact, each one-at-a-time design counting their "
                "interaction once more). "
                "Method 'grid' (--decompose grid): init seeds crossed with data seeds, one run per cell; two-way "
                "random-effects ANOVA components with 95% intervals (modified large-sample for init and data, "
                "chi-square for their interaction, which holds the residual: dropout and what seeds leave "
                "unexplained).",
                _round(decomposition),
                "variance",
            )
        )
    sections.append(
        _Section(
            "All metrics",
            "Every recorded metric, every design.",
            _round(analysis.summary.drop(columns=["outliers", "best_of_k"])),
        )
    )
    return sections


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
        ("device", f"{metadata.get('device')} ({metadata.get('device_name')})"),
        ("dtype", metadata.get("dtype")),
        ("test-set size", metadata.get("n_test")),
        ("torch threads", determinism.get("torch_threads")),
        ("deterministic algorithms", determinism.get("deterministic_algorithms")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("wall time (s)", round(metadata["seconds"], 1) if isinstance(metadata.get("seconds"), (int, float)) else None),
    ]
    return pd.DataFrame([(k, "" if v is None else str(v)) for k, v in rows], columns=["setting", "value"])


def _short_list(values: list[Any], keep: int = 6) -> str:
    shown = ", ".join(map(str, values[:keep]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > keep else "")


# ----------------------------------------------------------------- tables


def _scale(report: _Report) -> tuple[float, str]:
    return (100.0, "%") if report.is_accuracy else (1.0, "")


def _fmt(value: Any, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{scale * float(value):.{digits}f}{unit}"


def _p(value: Any) -> str:
    """A p-value: three decimals, or scientific notation below 0.001 (never a bare 0)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{float(value):.3f}" if float(value) >= 1e-3 else f"{float(value):.1e}"


def _distribution_table(report: _Report) -> pd.DataFrame:
    scale, unit = _scale(report)
    digits = 2 if report.is_accuracy else 4
    summary = report.analysis.summary
    rows = summary[summary["metric"] == report.metric]
    several_designs = rows["design"].nunique() > 1
    f = lambda v: _fmt(v, scale, unit, digits)
    table = []
    for _, r in rows.iterrows():
        best = json.loads(r["best_of_k"]) if r["best_of_k"] else {}
        row = {
            "config": r["config"],
            **({"design": r["design"]} if several_designs else {}),
            "n": int(r["n"]),
            "failed": int(r["n_failed"]),
            "mean ± std": f"{f(r['mean'])} ± {f(r['std'])}",
            "95% CI (t)": f"[{f(r['ci_low'])}, {f(r['ci_high'])}]" + (" (few seeds)" if r["few_seeds"] else ""),
            "median [IQR]": f"{f(r['median'])} [{f(r['iqr'])}]",
            "IQM": f(r["iqm"]),
            "min – max": f"{f(r['min'])} – {f(r['max'])}",
            "CV": _fmt(r["cv"], 1, "", 4),
            "Shapiro p": _p(r["normality_p"]),
            "outliers": r["outliers"] or "none",
            "best of k": ", ".join(f"{k}: {f(v)}" for k, v in best.items()) or "n/a",
        }
        if report.is_accuracy:
            row["noise floor sd"] = f(r["noise_floor_std"])
            row["var / noise var"] = _fmt(r["variance_ratio"], 1, "", 2)
        table.append(row)
    return pd.DataFrame(table)


def _comparison_table(report: _Report) -> pd.DataFrame:
    scale, unit = _scale(report)
    rows = report.analysis.comparisons[report.analysis.comparisons["metric"] == report.metric]
    return pd.DataFrame(
        [
            {
                "A": r["a"],
                "B": r["b"],
                "mean A - B": _fmt(r["mean_diff"], scale, unit, 2 if report.is_accuracy else 4),
                "Welch p (Holm)": f"{_p(r['welch_p'])} ({_p(r['welch_p_holm'])})",
                "MWU p (Holm)": f"{_p(r['mwu_p'])} ({_p(r['mwu_p_holm'])})",
                "Cohen d": _fmt(r["cohen_d"]),
                "Cliff delta": _fmt(r["cliff_delta"]),
                "P(A better) [95% CI]": (
                    f"{_fmt(r['p_a_better'])} [{_fmt(r['p_a_better_low'])}, {_fmt(r['p_a_better_high'])}]"
                ),
                "ASO eps_min": _fmt(r["aso_eps_min"], digits=3),
            }
            for _, r in rows.iterrows()
        ]
    )


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
    scale, unit = _scale(report)
    power = report.analysis.power[report.analysis.power["metric"] == report.metric]
    needed = [c for c in power.columns if c.startswith("seeds_needed_")]
    rows = []
    for _, r in power.iterrows():
        row = {
            "config": r["config"],
            "n": int(r["n"]),
            "std": _fmt(r["std"], scale, unit, 2 if report.is_accuracy else 4),
            "min detectable diff": _fmt(r["min_detectable_diff"], scale, unit, 2 if report.is_accuracy else 4),
        }
        for column in needed:
            difference = float(column.removeprefix("seeds_needed_"))
            row[f"seeds for {_fmt(difference, scale, unit, 1 if report.is_accuracy else 3)}"] = _fmt(
                r[column], digits=0
            )
        rows.append(row)
    return pd.DataFrame(rows)


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


def _latex(table: pd.DataFrame, *, caption: str, label: str) -> str:
    """A booktabs table scaled to the text width (\\resizebox, package graphicx), ASCII and math only."""
    styler = table.style.hide(axis="index").format(escape="latex")
    styler = styler.format_index(escape="latex", axis="columns")
    text = styler.to_latex(hrules=True, caption=caption, label=label, position="htbp", position_float="centering")
    for symbol, replacement in _LATEX_SYMBOLS.items():
        text = text.replace(symbol, replacement)
    text = text.replace("\\begin{tabular}", "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}")
    return text.replace("\\end{tabular}", "\\end{tabular}%\n}")


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
