"""The stability report writers: every format parses, says what the analysis says,
embeds its figures, counts failures, and is reproducible from the stored result."""

import base64
import json
import re
import xml.etree.ElementTree as ElementTree

import numpy as np
import pandas as pd
import pytest

from hfta_nas.errors import HftaNasError
from hfta_nas.stability._analysis import analyse
from hfta_nas.stability._export import write_report
from hfta_nas.stability._result import METRICS, StabilityResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_result(decompose: bool = False, failed: int = 1) -> StabilityResult:
    """Two configs of 8 seeds (one config better by ~2 points), known values, a failed seed."""
    rng = np.random.default_rng(7)
    seeds, curves = [], []
    designs = ["all"] + (["only_init", "only_data"] if decompose else [])
    for config, centre in (("A", 0.80), ("B_wide", 0.78)):
        for design in designs:
            for index in range(8):
                status = "failed" if design == "all" and config == "A" and index < failed else "completed"
                row = {
                    "config": config,
                    "seed_index": index,
                    "design": design,
                    "seed_init": 100 + index,
                    "seed_data": 200 + index,
                    "seed_dropout": 300,
                    "status": status,
                    "reason": "diverged: loss is nan" if status == "failed" else "",
                    "epochs": 3,
                }
                for metric in METRICS:
                    value = centre + rng.normal(0, 0.01) if metric.endswith("_acc") else 0.5 + rng.normal(0, 0.05)
                    row[metric] = np.nan if status == "failed" else value
                seeds.append(row)
                for epoch in (1, 2, 3):
                    for metric in METRICS:
                        curves.append(
                            {
                                "config": config,
                                "design": design,
                                "seed_index": index,
                                "epoch": epoch,
                                "metric": metric,
                                "value": row[metric] if status == "completed" else np.nan,
                            }
                        )
    metadata = {
        "command": "hfta-nas stability compare a.yaml b.yaml --seeds 8",
        "n_seeds": 8,
        "n_test": 1000,
        "vary": ["init", "data", "dropout"],
        "device": "cpu",
        "dtype": "float32",
        "bootstrap_seed": 3,
        "configs": {"A": {}, "B_wide": {}},
        "seeds_per_source": {"init": list(range(100, 108))},
        "versions": {"torch": "x"},
        "determinism": {"torch_threads": 1},
    }
    return StabilityResult(pd.DataFrame(seeds), pd.DataFrame(curves), metadata)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    result = synthetic_result(decompose=True)
    out = tmp_path_factory.mktemp("report")
    analysis = analyse(result, n_resamples=500)
    files = write_report(result, analysis, out)
    return result, analysis, out, files


def test_every_format_and_plot_is_written(written):
    _, _, out, files = written
    assert set(files) == {"html", "md", "csv", "json", "tex", "plots"}
    assert all(path.exists() and path.stat().st_size > 0 for paths in files.values() for path in paths)
    names = {p.name for p in files["plots"]}
    for figure in ("distribution", "ecdf", "curves", "comparison", "variance"):
        assert {f"{figure}.png", f"{figure}.svg"} <= names
    for path in files["plots"]:
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG_MAGIC)
        else:
            assert ElementTree.parse(path).getroot().tag.endswith("svg")


def test_json_is_strict_and_carries_the_analysis_and_protocol(written):
    result, analysis, out, _ = written

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    document = json.loads((out / "report.json").read_text(), parse_constant=refuse)
    assert document["protocol"]["command"] == result.metadata["command"]
    assert document["protocol"]["n_test"] == 1000
    rows = {(r["config"], r["design"], r["metric"]): r for r in document["summary"]}
    reference = analysis.summary.set_index(["config", "design", "metric"])
    a = rows[("A", "all", "test_acc")]
    assert a["mean"] == reference.loc[("A", "all", "test_acc"), "mean"]
    assert a["n"] == 7 and a["n_failed"] == 1
    assert set(a["best_of_k"]) == {"1", "2", "4"} and isinstance(a["outliers"], list)
    assert len(document["seeds"]) == len(result.seeds)
    assert [s for s in document["seeds"] if s["status"] == "failed"][0]["test_acc"] is None  # NaN -> null
    assert {c["a"] for c in document["comparisons"]} == {"A"}
    assert {d["source"] for d in document["decomposition"]} >= {"init", "data"}


def test_csv_holds_every_seed_and_every_summary_row(written):
    result, analysis, out, _ = written
    seeds = pd.read_csv(out / "seeds.csv", keep_default_na=False, na_values=[""])
    assert len(seeds) == len(result.seeds)
    assert {"seed_init", "seed_data", "seed_dropout", *METRICS} <= set(seeds.columns)
    np.testing.assert_allclose(seeds["test_acc"], result.seeds["test_acc"], rtol=1e-15)
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == len(analysis.summary)
    np.testing.assert_allclose(summary["ci_bca_low"], analysis.summary["ci_bca_low"], rtol=1e-12)


def test_markdown_and_html_show_the_same_sections(written):
    _, _, out, _ = written
    markdown = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    for heading in (
        "Protocol",
        "Distribution over seeds",
        "Comparisons",
        "Ranking with intervals",
        "Power",
        "Sources of variance",
        "Failed seeds (1 of 48)",
    ):
        assert f"## {heading}" in markdown
        assert f"<h2>{heading}</h2>" in page
    assert "](plots/distribution.png)" in markdown
    assert "diverged: loss is nan" in markdown and "diverged: loss is nan" in page


def test_html_is_self_contained_with_decodable_images(written):
    _, _, out, _ = written
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 6  # distribution, profile, ecdf, curves, comparison, variance
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    assert not re.search(r'src="(?!data:)', page)  # nothing to fetch: no external images or scripts
    assert "<script" not in page


def test_latex_table_escapes_names_and_uses_booktabs(written):
    _, _, out, _ = written
    tex = (out / "report.tex").read_text()
    # distribution, gone wrong, profile, shape; comparisons and failure rates; power and sources of variance
    assert tex.count("\\begin{table}") == 8 and "\\toprule" in tex and "\\bottomrule" in tex
    # escaped, and free to wrap after the underscore in a narrow column
    assert "B\\_\\allowbreak{}wide" in tex and "B_wide" not in tex.replace("B\\_\\allowbreak{}wide", "")
    assert "\\label{tab:stability}" in tex


def test_latex_tables_fit_the_page_and_are_plain_ascii(written, tmp_path):
    """Split into tables of at most 9 columns in \\footnotesize, never scaled (a 14-column table scaled to the
    text width printed at ~3pt), symbols in math mode; compiled when pdflatex is installed."""
    import shutil
    import subprocess

    _, _, out, _ = written
    tex = (out / "report.tex").read_text()
    assert tex.isascii(), sorted({c for c in tex if not c.isascii()})
    assert "\\resizebox" not in tex and "\\scalebox" not in tex and tex.count("\\begin{tabular}") == 8
    assert tex.count("\\footnotesize") == 8 and not re.search(r"\\(scriptsize|tiny)\b", tex)
    specs = re.findall(r"^\\begin\{tabular\}\{(.*)\}$", tex, flags=re.M)
    assert len(specs) == 8
    for spec in specs:  # wrapped columns, each a fraction of the line width
        widths = [float(f) for f in re.findall(r"p\{\\dimexpr ([\d.]+)\\linewidth-2\\tabcolsep\\relax\}", spec)]
        assert 0 < len(widths) <= 9 and spec.count("p{") == len(widths), spec
        assert sum(widths) <= 1.0001, spec
    assert "95\\% intervals" not in tex  # the caption names the interval it shows
    assert "$\\pm$" in tex
    if shutil.which("pdflatex") is None:
        return
    (tmp_path / "doc.tex").write_text(
        f"\\documentclass{{article}}\\usepackage{{booktabs,graphicx}}\\begin{{document}}\n{tex}\n\\end{{document}}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "doc.tex"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:]


def compiled_latex(tex: str, folder) -> tuple[int, str]:
    """pdflatex's exit status and log for the export inside a plain article (skipped without pdflatex
    or booktabs: `apt-get install texlive-latex-recommended` brings both)."""
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None or shutil.which("kpsewhich") is None:
        pytest.skip("pdflatex is not installed")
    found = subprocess.run(["kpsewhich", "booktabs.sty"], capture_output=True, text=True, check=False)
    if not found.stdout.strip():
        pytest.skip("booktabs.sty is not installed")
    (folder / "report.tex").write_text(tex)
    (folder / "doc.tex").write_text(
        "\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n\\input{report.tex}\n\\end{document}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, (folder / "doc.log").read_text(errors="replace")


def test_the_latex_export_compiles_without_errors(written, tmp_path):
    _, _, out, _ = written
    status, log = compiled_latex((out / "report.tex").read_text(), tmp_path)
    assert status == 0 and not re.search(r"^! ", log, flags=re.M), log[-3000:]
    assert "Undefined control sequence" not in log and "Missing $ inserted" not in log


@pytest.mark.parametrize("study", ["written", "bimodal"])
def test_the_latex_tables_fit_an_article_text_width(study, request, tmp_path):
    """No table, and no cell of one, overhangs an article's 345pt text width (before the columns wrapped
    their text, 147-512pt did); the long headlines of a bimodal study wrap as well."""
    fixture = request.getfixturevalue(study)
    out = fixture[2] if study == "written" else fixture
    status, log = compiled_latex((out / "report.tex").read_text(), tmp_path)
    assert status == 0, log[-3000:]
    too_wide = [float(points) for points in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert max(too_wide, default=0.0) <= 5.0, too_wide  # a few points of overhang would not show


def test_a_rebuilt_report_is_identical(written, tmp_path):
    result, _, out, _ = written
    result.save(tmp_path / "saved")
    again = StabilityResult.load(tmp_path / "saved")
    write_report(again, analyse(again, n_resamples=500), tmp_path / "again", formats=("json", "md", "tex"))
    for name in ("report.json", "report.md", "report.tex"):
        assert (tmp_path / "again" / name).read_text() == (out / name).read_text(), name
    for plot in ("ecdf.svg", "distribution.svg"):  # the strip plot's jitter is seeded
        assert (tmp_path / "again" / "plots" / plot).read_bytes() == (out / "plots" / plot).read_bytes(), plot


def test_drawing_the_distribution_leaves_numpys_global_generator_alone(tmp_path):
    result = synthetic_result()
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    write_report(result, analyse(result, n_resamples=100), tmp_path, formats=("md",), plot_formats=("svg",))
    assert np.random.random() == expected


@pytest.mark.parametrize("file", ["seeds.csv", "curves.csv"])
@pytest.mark.parametrize("cut", ["half", "header only", "mid-row"])
def test_a_result_file_cut_short_is_refused_not_reported_empty(tmp_path, file, cut):
    synthetic_result().save(tmp_path)
    text = (tmp_path / file).read_text()
    lines = text.splitlines(keepends=True)
    kept = {
        "half": "".join(lines[: len(lines) // 2]),
        "header only": lines[0],
        "mid-row": "".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 3],
    }[cut]
    (tmp_path / file).write_text(kept)
    with pytest.raises(HftaNasError, match=f"{file}' (holds|lacks)"):
        StabilityResult.load(tmp_path)


def test_a_seed_status_that_is_neither_completed_nor_failed_is_refused(tmp_path):
    """An edited seeds.csv ('status: bogus' everywhere) gave an empty report and exit 0."""
    synthetic_result().save(tmp_path)
    text = (tmp_path / "seeds.csv").read_text()
    (tmp_path / "seeds.csv").write_text(text.replace(",completed,", ",bogus,"))
    with pytest.raises(HftaNasError, match="has seeds of status 'bogus'; a seed is completed or failed"):
        StabilityResult.load(tmp_path)


def test_a_single_config_without_decomposition_skips_what_it_cannot_show(tmp_path):
    result = synthetic_result(failed=0)
    only_a = StabilityResult(
        result.seeds[result.seeds["config"] == "A"], result.curves[result.curves["config"] == "A"], result.metadata
    )
    files = write_report(
        only_a, analyse(only_a, n_resamples=200), tmp_path, formats=("md", "csv"), plot_formats=("png",)
    )
    names = {p.name for p in files["plots"]}
    assert names == {"distribution.png", "ecdf.png", "profile.png", "curves.png"}
    markdown = (tmp_path / "report.md").read_text()
    assert "## Comparisons" not in markdown and "## Failed seeds" not in markdown
    assert not (tmp_path / "comparisons.csv").exists()


def test_every_seed_failed_still_gives_a_report(tmp_path):
    result = synthetic_result(failed=8)
    only_a = StabilityResult(
        result.seeds[result.seeds["config"] == "A"], result.curves[result.curves["config"] == "A"], result.metadata
    )
    files = write_report(only_a, analyse(only_a, n_resamples=200), tmp_path, formats=("json", "html"))
    assert "plots" not in files  # nothing completed: no distribution to draw
    document = json.loads((tmp_path / "report.json").read_text())
    assert all(row["status"] == "failed" for row in document["seeds"])
    assert "Failed seeds (8 of 8)" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(
    "formats,plot_formats,message",
    [
        (("pdf",), ("png",), "--format: unknown 'pdf'; expected a comma-separated subset of html, md, csv, json, tex"),
        (("md",), ("jpg",), "--plot-format: unknown 'jpg'"),
    ],
)
def test_unknown_formats_are_refused(tmp_path, formats, plot_formats, message):
    result = synthetic_result()
    with pytest.raises(HftaNasError, match=re.escape(message)):
        write_report(result, analyse(result, n_resamples=100), tmp_path, formats=formats, plot_formats=plot_formats)


def test_an_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = synthetic_result()
    with pytest.raises(HftaNasError, match="cannot write the report folder"):
        write_report(result, analyse(result, n_resamples=100), blocker / "out", formats=("md",))


def test_report_files_get_the_usual_permissions(written):
    import os
    import stat

    _, _, out, files = written
    mask = os.umask(0)
    os.umask(mask)
    assert {stat.S_IMODE(p.stat().st_mode) for paths in files.values() for p in paths} == {0o666 & ~mask}


# ---------------------------------------------------------------- modes and seeds gone wrong


def with_a_bad_seed(result: StabilityResult) -> StabilityResult:
    """Config B_wide's seed 5 lands in a basin 35 points lower."""
    seeds = result.seeds.copy()
    bad = (seeds["config"] == "B_wide") & (seeds["design"] == "all") & (seeds["seed_index"] == 5)
    seeds.loc[bad, "test_acc"] = 0.43
    return StabilityResult(seeds, result.curves, result.metadata)


@pytest.fixture(scope="module")
def bimodal(tmp_path_factory):
    result = with_a_bad_seed(synthetic_result())
    out = tmp_path_factory.mktemp("bimodal")
    write_report(result, analyse(result, n_resamples=200), out, plot_formats=())
    return out


def test_the_report_words_modes_no_failure_and_some_failures(bimodal):
    markdown = (bimodal / "report.md").read_text()
    # B_wide's headline: the median's exact interval and the count, the gap described after them
    assert "median 77.77% [43.00%, 79.44%]; 1 of 8 seeds gone wrong; a gap: 1 of 8 seeds 35.0 points lower" in markdown
    assert "1 of 8 seeds = 12.5% [0.3%, 52.7%]" in markdown  # A: one failed seed, exact interval
    assert "1 past the cut" in markdown and "1 failed" in markdown and "#5" in markdown
    only_a = synthetic_result(failed=0)
    out = bimodal.parent / "clean"
    write_report(only_a, analyse(only_a, n_resamples=100), out, formats=("md",), plot_formats=())
    clean = (out / "report.md").read_text()
    assert "0 of 8 seeds (still possible: up to 31%, one-sided 95%)" in clean
    assert "; 0 of 8 seeds gone wrong |" in clean and "; a gap:" not in clean


def test_every_export_format_carries_the_modes_and_the_failure_rate(bimodal):
    fields = ("modes", "worse_mode_n", "good_mode_mean", "bad_n", "bad_of", "bad_low", "bad_high", "bad_upper")
    summary = pd.read_csv(bimodal / "summary.csv")
    row = summary[(summary["config"] == "B_wide") & (summary["metric"] == "test_acc")].iloc[0]
    assert set(fields) <= set(summary.columns) and row["modes"] == 2 and str(row["worse_mode_seeds"]) in ("5", "5.0")
    comparisons = pd.read_csv(bimodal / "comparisons.csv")
    assert {"paired", "paired_t_p", "wilcoxon_p", "a_bad_n", "b_bad_n", "bad_rate_p"} <= set(comparisons.columns)
    document = json.loads((bimodal / "report.json").read_text())
    b_wide = next(r for r in document["summary"] if r["config"] == "B_wide" and r["metric"] == "test_acc")
    assert b_wide["worse_mode_seeds"] == [5] and b_wide["headline"].startswith("median 77.77% [43.00%, 79.44%]")
    assert all(field in b_wide for field in fields)
    for name in ("report.md", "report.html", "report.tex"):
        text = (bimodal / name).read_text()
        assert "a gap: 1 of 8 seeds" in text and "Clopper-Pearson" in text and "DKW" in text, name
        assert "1 of 8 seeds = 12.5" in text and "McNemar" in text, name  # shared seeds: the paired test


def test_comparisons_of_shared_seeds_are_paired_in_the_report(bimodal):
    markdown = (bimodal / "report.md").read_text()
    assert "same (7 pairs; left out: #0 (no value: A))" in markdown
    assert "paired " in markdown and "Wilcoxon " in markdown
    # A's seed 0 failed, B_wide's seed 5 is in its worse mode: one discordant slot each way
    row = next(line for line in markdown.splitlines() if line.startswith("| A ") and "McNemar" in line)
    assert [cell.strip() for cell in row.split("|")[3:7]] == ["1 of 8", "1 of 8", "1 / 1", "McNemar 1.000 (1.000)"]


def test_fail_below_counts_seeds_under_a_threshold(tmp_path):
    from hfta_nas.stability._study import check_fail_below

    result = synthetic_result(failed=0)
    analysis = analyse(result, n_resamples=100, fail_below={"test_acc": 0.80})
    row = analysis.summary.set_index(["config", "design", "metric"]).loc[("A", "all", "test_acc")]
    values = result.seeds.query("config == 'A' and design == 'all'")["test_acc"]
    assert row["bad_below"] == row["bad_n"] == int((values < 0.80).sum()) > 0
    write_report(result, analysis, tmp_path, formats=("md",), plot_formats=())
    assert "(test_acc: below 0.8 instead, as asked)" in (tmp_path / "report.md").read_text()
    for threshold, metric, message in (
        (60.0, "test_acc", "accuracies are fractions from 0 to 1 (did you mean 0.6?)"),
        (0.5, "test_loss", "test_loss is better lower"),
        (float("nan"), "test_acc", "must be a finite number"),
    ):
        with pytest.raises(HftaNasError, match=re.escape(message)):
            check_fail_below(threshold, metric)


def test_the_report_says_which_seed_the_worse_mode_follows(tmp_path):
    from tests.test_stability_stats import grid_result

    result = grid_result({(1, j) for j in range(5)})  # init seed 1 sends all its runs to the worse mode
    write_report(result, analyse(result, n_resamples=100), tmp_path, formats=("md", "csv", "json"), plot_formats=())
    markdown = (tmp_path / "report.md").read_text()
    assert "## Which seed moves runs between modes" in markdown
    assert "the worse mode follows the init seed: its 5 of 25 runs lie in 1 of 5 init seeds" in markdown
    frame = pd.read_csv(tmp_path / "mode_sources.csv")
    assert set(frame["source"]) == {"init", "data"} and (frame["method"] == "grid").all()
    document = json.loads((tmp_path / "report.json").read_text())
    assert {r["source"] for r in document["mode_sources"]} == {"init", "data"}


# ---------------------------------------------------------------- issue 42: the statistics audit


def shared_slot_result(failed_slot: int = 0) -> StabilityResult:
    """A and B trained the same 8 seeds; each slot's seeds move both configs alike (sd 5 points),
    A is better by 1 point give or take 0.1, and A's slot `failed_slot` (the best slot) failed. The
    independent means then differ by about -0.3 points, while the paired difference is +1."""
    rng = np.random.default_rng(5)
    slot = np.array([0.12, -0.03, 0.02, -0.05, 0.04, -0.06, 0.01, -0.05])
    rows = []
    for config, shift in (("A", 0.01), ("B", 0.0)):
        for index in range(8):
            failed = config == "A" and index == failed_slot
            row = {
                "config": config,
                "seed_index": index,
                "design": "all",
                "seed_init": 100 + index,
                "seed_data": 200 + index,
                "seed_dropout": 300,
                "status": "failed" if failed else "completed",
                "reason": "train_loss became non-finite (NaN/inf) in epoch 2" if failed else "",
                "epochs": 2 if failed else 3,
            }
            for metric in METRICS:
                value = 0.8 + slot[index] + shift + rng.normal(0, 0.001)
                row[metric] = np.nan if failed or not metric.endswith("_acc") else value
            row["test_loss"] = np.nan if failed else 0.5 + rng.normal(0, 0.01)
            rows.append(row)
    curves = [
        {"config": r["config"], "design": "all", "seed_index": r["seed_index"], "epoch": e, "metric": m, "value": v}
        for r in rows
        for e in range(1, r["epochs"] + 1)
        for m, v in (("test_acc", r["test_acc"] if r["status"] == "completed" else 0.5), ("test_loss", 0.5))
    ]
    metadata = {"command": "hfta-nas stability compare a.yaml b.yaml --seeds 8", "n_test": 1000, "bootstrap_seed": 1}
    return StabilityResult(pd.DataFrame(rows), pd.DataFrame(curves), metadata)


def test_the_paired_point_lies_in_its_interval_and_both_use_the_same_pairs(tmp_path):
    """Audit: 'the printed point (-0.29%) lies outside its own interval [+0.59, +1.30]' when a seed failed
    in one configuration: the point was the difference of the two configs' own means (7 against 8 seeds),
    the interval the paired one (7 pairs). Both are now on the pairs, and the report names the slot left out."""
    from hfta_nas.stability._cli import _comparison_line

    result = shared_slot_result()
    analysis = analyse(result, n_resamples=100)
    row = analysis.comparisons.query("metric == 'test_acc'").iloc[0]
    a = result.seeds.query("config == 'A' and seed_index > 0")["test_acc"].to_numpy()
    b = result.seeds.query("config == 'B' and seed_index > 0")["test_acc"].to_numpy()
    assert bool(row["paired"]) and row["n_pairs"] == 7 and row["unpaired_slots"] == "0 (A)"
    assert row["paired_mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-12)
    assert row["paired_mean_diff"] == pytest.approx((row["paired_diff_low"] + row["paired_diff_high"]) / 2, rel=1e-9)
    assert row["paired_diff_std"] == pytest.approx(np.std(a - b, ddof=1), rel=1e-12)
    assert row["mean_diff"] < row["paired_diff_low"]  # the independent means' difference: not the paired point
    write_report(result, analysis, tmp_path, formats=("md", "html", "tex"), plot_formats=())
    markdown = (tmp_path / "report.md").read_text()
    line = next(line for line in markdown.splitlines() if line.startswith("| A ") and "paired" in line)
    cells = [cell.strip() for cell in line.split("|")]
    assert cells[3] == "same (7 pairs; left out: #0 (no value: A))"
    point, low, high = (float(v) for v in re.findall(r"(-?[\d.]+)%", cells[4]))
    assert low <= point <= high and point == pytest.approx(100 * row["paired_mean_diff"], abs=0.006)
    printed = _comparison_line({k: (None if pd.isna(v) else v) for k, v in row.items()}, 100.0, "%")
    point, low, high = (
        float(v) for v in re.findall(r"diff ([+-][\d.]+)% \[([+-][\d.]+)%, ([+-][\d.]+)%\]", printed)[0]
    )
    assert low <= point <= high and "7 pairs; left out: #0 (no value: A)" in printed


def test_power_is_paired_for_shared_seeds_and_withheld_where_modes_are_found(tmp_path):
    """Audit: 'the power table is printed for a study the same report calls bimodal, and unpaired for a
    paired compare'."""
    from hfta_nas.stability import _stats

    result = shared_slot_result()
    analysis = analyse(result, n_resamples=100)
    compared = analysis.comparisons.query("metric == 'test_acc'").iloc[0]
    (row,) = analysis.power.query("metric == 'test_acc'").to_dict("records")
    assert (row["config"], row["test"], row["n"]) == ("A - B", "paired t (same seeds)", 7)
    assert row["std"] == compared["paired_diff_std"] and row["note"] == ""
    assert row["min_detectable_diff"] == _stats.min_detectable_difference(row["std"], 7, paired=True)
    assert row["seeds_needed_0.01"] == _stats.seeds_needed(0.01, row["std"], paired=True)
    # the same seeds taken as independent would need far more: the slot effect is shared
    assert row["min_detectable_diff"] < 0.2 * _stats.min_detectable_difference(0.05, 7)
    # independent seeds: one two-sample row per configuration
    independent = result.seeds.copy()
    independent.loc[independent["config"] == "B", "seed_init"] += 50
    power = analyse(StabilityResult(independent, result.curves, result.metadata), n_resamples=100).power
    acc = power.query("metric == 'test_acc'").set_index("config")
    assert list(acc.index) == ["A", "B"] and set(acc["test"]) == {"two-sample t (independent seeds)"}
    assert acc.loc["A", "min_detectable_diff"] == _stats.min_detectable_difference(acc.loc["A", "std"], 7)
    # a configuration the report calls bimodal: withheld, with the reason, in every format
    bimodal = with_a_bad_seed(synthetic_result())
    analysis = analyse(bimodal, n_resamples=100)
    (row,) = analysis.power.query("metric == 'test_acc'").to_dict("records")
    assert row["test"] == "paired t (same seeds)" and np.isnan(row["min_detectable_diff"])
    assert np.isnan(row["seeds_needed_0.01"]) and row["note"].startswith("withheld: two modes found (B_wide)")
    write_report(bimodal, analysis, tmp_path, plot_formats=())
    for name in ("report.md", "report.html", "report.tex"):
        assert "withheld: two modes found (B" in (tmp_path / name).read_text(), name
    assert pd.read_csv(tmp_path / "power.csv")["note"].str.startswith("withheld").any()


def test_the_learning_curve_band_is_labelled_in_the_plot_and_every_export(tmp_path):
    """Audit: 'the learning-curve band is an unlabelled t interval'."""
    from hfta_nas.stability import _plots

    result = shared_slot_result()
    analysis = analyse(result, n_resamples=100)
    label = "mean ± 95% t interval over seeds"
    assert (analysis.per_epoch["ci_method"] == f"{label} (completed seeds; assumes one mode)").all()
    figure = _plots.draw(result, analysis, "test_acc")["curves"]
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert f"A: {label}" in legend and f"B: {label}" in legend
    assert figure.get_supxlabel() == f"band: {label} (completed seeds; assumes one mode)"
    write_report(result, analysis, tmp_path, formats=("md", "html", "csv", "json"), plot_formats=())
    for name in ("report.md", "report.html"):
        assert f"the band: {label} (completed seeds; assumes one mode), per epoch" in (tmp_path / name).read_text()
    assert pd.read_csv(tmp_path / "per_epoch.csv")["ci_method"].str.startswith(label).all()
    assert json.loads((tmp_path / "report.json").read_text())["per_epoch"][0]["ci_method"].startswith(label)


# a missing value as pandas, numpy or Python would print it; "NaN/inf" in a failure reason is words
MISSING_WORDS = re.compile(r"(?<![\w/])(?:nan|NaN|NAN|<NA>|None|n/a)(?![\w/])")


def test_no_export_writes_nan_for_a_missing_value(tmp_path):
    """Audit: 'a literal nan appears in the markdown table'. A failed seed (every metric undefined), a
    metric undefined for a completed seed too (test_loss of slot 3), and figures undefined for few
    pairs: dashes in md/html/tex, empty cells in CSV, null in JSON."""
    import csv

    result = shared_slot_result()
    result.seeds.loc[(result.seeds["config"] == "B") & (result.seeds["seed_index"] == 3), "test_loss"] = np.nan
    write_report(result, analyse(result, n_resamples=100), tmp_path, plot_formats=())
    for name in ("report.md", "report.html", "report.tex"):
        text = (tmp_path / name).read_text()
        assert not MISSING_WORDS.findall(text), (name, sorted(set(MISSING_WORDS.findall(text))))
    assert "| —" in (tmp_path / "report.md").read_text() and "<td>—</td>" in (tmp_path / "report.html").read_text()
    csv_files = sorted(tmp_path.glob("*.csv"))
    assert {p.name for p in csv_files} >= {"seeds.csv", "summary.csv", "comparisons.csv", "power.csv"}
    for path in csv_files:
        cells = [cell for line in csv.reader(path.open()) for cell in line]
        assert not [c for c in cells if MISSING_WORDS.fullmatch(c.strip())], path.name
    assert "" in [cell for line in csv.reader((tmp_path / "seeds.csv").open()) for cell in line]

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    document = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)

    def strings(value):
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert not [s for s in strings(document) if MISSING_WORDS.fullmatch(s.strip())]
    failed = next(s for s in document["seeds"] if s["status"] == "failed")
    assert failed["test_acc"] is None and failed["seed_split"] is None


def test_the_latex_export_carries_the_power_and_decomposition_tables(written, tmp_path):
    """Audit: 'the TeX export still lacks the power and decomposition tables'."""
    _, analysis, out, _ = written
    tex = (out / "report.tex").read_text()
    for label in ("tab:stability-power", "tab:stability-decomposition"):
        assert f"\\label{{{label}}}" in tex, label
    power = tex[tex.index("\\label{tab:stability-power}") :]
    assert "paired t (same seeds)" in power and "A - B\\_\\allowbreak{}wide" in power
    decomposition = tex[tex.index("\\label{tab:stability-decomposition}") :]
    assert (
        "sum\\_\\allowbreak{}of\\_\\allowbreak{}sources" in decomposition and "share (point estimate)" in decomposition
    )
    # without --decompose: no decomposition table, the power table still
    result = synthetic_result()
    write_report(result, analyse(result, n_resamples=100), tmp_path, formats=("tex",), plot_formats=())
    tex = (tmp_path / "report.tex").read_text()
    assert "tab:stability-decomposition" not in tex and "\\label{tab:stability-power}" in tex


def test_the_reports_coverage_labels_are_the_committed_measurements():
    """Every 'measured a-b%' beside an interval is the range over shapes and n in the committed run of
    `python -m benchmarks.coverage --shapes-only` (benchmarks/results/coverage_shapes.json)."""
    from pathlib import Path

    from hfta_nas.stability._export import MEASURED

    path = Path(__file__).parents[1] / "benchmarks" / "results" / "coverage_shapes.json"
    cells = json.loads(path.read_text())["shapes"]
    for label, column in (
        ("iqm", "iqm_bootstrap"),
        ("mean", "mean_t"),
        ("gone wrong", "bad_exact"),
        ("profile", "profile_dkw"),
        ("p better", "p_better"),
    ):
        values = [100 * cell[column] for cell in cells]
        assert f"measured {min(values):.0f}-{max(values):.0f}%" in MEASURED[label], label
    exact = [cell for cell in cells if cell["n"] >= 6]
    assert min(cell["median_exact"] for cell in exact) >= 0.95  # "at least 95% from 6 seeds"


def test_the_reports_difference_and_grid_labels_are_the_committed_measurements():
    """The same for the intervals of a difference, of a variance and of a crossed grid: the range over
    shapes, n and grids in the committed run of `python -m benchmarks.coverage --differences-only`
    (benchmarks/results/coverage_differences.json)."""
    from pathlib import Path

    from hfta_nas.stability._export import MEASURED

    path = Path(__file__).parents[1] / "benchmarks" / "results" / "coverage_differences.json"
    result = json.loads(path.read_text())
    shapes, grids = result["differences"], result["grid_intervals"]
    for label, cells, columns in (
        ("paired t", shapes, ("paired_t",)),
        ("paired t, A alone", shapes, ("paired_t_a_only",)),
        ("welch", shapes, ("welch",)),
        ("welch, A alone", shapes, ("welch_a_only",)),
        ("variance", shapes, ("variance_chi2",)),
        ("crossed mean", grids, ("crossed_mean",)),
        ("grid init and data", grids, ("init_mls", "data_mls")),
        ("grid residual", grids, ("residual_chi2",)),
    ):
        values = [100 * cell[column] for cell in cells for column in columns]
        assert f"measured {min(values):.0f}-{max(values):.0f}%" in MEASURED[label], label


def test_fail_margin_sets_the_distance_below_the_median_that_counts_as_gone_wrong(tmp_path):
    """`hfta-nas report FOLDER --fail-margin M`: seeds worse than the median by more than M of it
    count; a negative margin is refused in one line (exit 2)."""
    from click.testing import CliRunner

    from hfta_nas.cli import main

    result = synthetic_result(failed=0)
    result.save(tmp_path / "study" / "result")
    values = result.seeds.query("config == 'A' and design == 'all'")["test_acc"].to_numpy()
    margin = 0.005
    expected = int(np.sum(values < np.median(values) * (1 - margin)))
    done = CliRunner().invoke(
        main, ["report", str(tmp_path / "study"), "--fail-margin", str(margin), "--format", "json", "--json"]
    )
    assert done.exit_code == 0, done.output
    summary = json.loads((tmp_path / "study" / "report.json").read_text())["summary"]
    row = next(r for r in summary if (r["config"], r["design"], r["metric"]) == ("A", "all", "test_acc"))
    assert row["bad_n"] == row["bad_below"] == expected > 0
    refused = CliRunner().invoke(main, ["report", str(tmp_path / "study"), "--fail-margin", "-1"])
    assert refused.exit_code == 2 and "--fail-margin" in refused.output and "Traceback" not in refused.output
