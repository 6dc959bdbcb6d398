"""Every command the documentation shows runs in a test, or says in the docs why not.

A command is a line (with its `\\` continuations) of a fenced ```bash, ```console (after
`$ `) or ```sh block in README.md or in a page of the MkDocs site (mkdocs.yml's nav). Each
command is exactly one of:

- marked in the docs as not run, with the reason: a trailing comment holding
  `not run in tests: REASON`, or the block preceded by `<!-- not run in tests: REASON -->`;
- in RUN: run here as a subprocess from a temporary folder (which links the repository's
  `search_spaces/` and `examples/`), with small-budget options appended (the last value of an
  option wins, so `--seeds 32 ... --seeds 2` trains 2 seeds), and it must exit 0;
- in MAPPED: run by an existing test, named by its node id, which must exist.

A ```python block is executed (in the temporary folder) unless the line before it is such a
`<!-- not run in tests: ... -->` comment. The README must stay short, and every page of
mkdocs.yml's nav must exist.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests._rendezvous import GUARD_S

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"not run in tests:\s*\S")
BLOCK_NOT_RUN = re.compile(r"^\s*<!--\s*not run in tests:\s*\S.*-->\s*$")
SHELL = {"bash", "console", "sh", "shell"}

SMALL_SEARCH = ("--n-trials", "2", "--set", "training.epochs=1", "--set", "array.size=2", "--quiet")
SMALL_STABILITY = ("--seeds", "2", "--set", "training.epochs=1", "--format", "md", "--plot-format", "png", "--quiet")
MAIN_JOB = "hfta-nas search search_spaces/mnist1d_cnn.yaml --threads 1"
DEFAULT_STABILITY = "hfta-nas stability --seeds 32"


@dataclass(frozen=True)
class Run:
    extra: tuple[str, ...] = ()  # appended to keep the budget small
    after: tuple[str, ...] = ()  # documented commands whose output this one reads


RUN: dict[str, Run] = {
    "hfta-nas --help": Run(),
    MAIN_JOB: Run(SMALL_SEARCH),
    "hfta-nas search search_spaces/mnist1d_mlp.yaml --dry-run": Run(),
    DEFAULT_STABILITY: Run(SMALL_STABILITY),
    "hfta-nas stability --seeds 32 --threads 1": Run(SMALL_STABILITY),
    "hfta-nas stability runs/mnist1d-cnn/best_config.yaml --seeds 32": Run(SMALL_STABILITY, after=(MAIN_JOB,)),
    "hfta-nas stability search_spaces/mnist1d_cnn.yaml --params training.optimizer.lr=3e-3 --params "
    'training.optimizer.weight_decay=1e-4 --params "model.config.channels=[32, 32]" --params '
    "model.config.kernel_size=5": Run(SMALL_STABILITY),
    "hfta-nas report runs/stability/mnist1d_cnn": Run(
        ("--format", "md", "--plot-format", "png"), after=(DEFAULT_STABILITY,)
    ),
    "hfta-nas train --model cnn1d --seeds 8 --epochs 5": Run(("--seeds", "2", "--epochs", "1")),
}

MAPPED: dict[str, str] = {
    "hfta-nas search SPACE.yaml --sampler random --pruner hyperband --seed 3 --n-trials 64 --array-size 16": (
        "tests/test_search_plan.py::test_cli_overrides_sampler_pruner_and_seed"
    ),
    "hfta-nas search examples/wandb_sweep/sweep.yaml": (
        "tests/test_wandb_sweep.py::test_the_shipped_sweep_gives_the_same_trials_as_the_equivalent_space"
    ),
    "hfta-nas dashboard": "tests/test_cli.py::test_dashboard_takes_the_next_free_port_when_the_default_is_busy",
    "hfta-nas search search_spaces/mnist1d_cnn.yaml --workers 4": (
        "tests/test_workers.py::test_workers_share_one_journal_study_and_its_budget"
    ),
    "hfta-nas stability --study mnist1d-cnn --top-k 3 --seeds 16": (
        "tests/test_stability.py::test_top_k_trials_of_a_search_are_rerun_across_seeds"
    ),
    "hfta-nas search search_spaces/mnist1d_cnn_pbt.yaml": (
        "tests/test_pbt_run.py::test_hfta_nas_search_runs_a_pbt_space"
    ),
    "hfta-nas stability --study mnist1d-cnn-pbt --top-k 1 --seeds 16": (
        "tests/test_pbt_replay.py::test_stability_study_reruns_the_best_members_schedule_across_seeds"
    ),
    "hfta-nas stability compare a.yaml b.yaml --seeds 32": (
        "tests/test_stability.py::test_compare_two_configs_reports_the_comparison"
    ),
    "hfta-nas stability --vary init,data --decompose": (
        "tests/test_stability.py::test_decompose_reports_a_share_per_source"
    ),
    "hfta-nas stability --vary init,data --decompose grid": (
        "tests/test_stability.py::test_decompose_grid_reports_init_data_and_their_interaction"
    ),
    "hfta-nas stability compare examples/adam_vs_sgd/adam.yaml examples/adam_vs_sgd/sgd.yaml --seeds 16 --threads 1": (
        "tests/test_stability.py::test_the_readme_worked_example_runs"
    ),
    "python examples/cifar_shaped/make_data.py": (
        "tests/test_cifar_example.py::test_the_data_script_is_cifar_shaped_and_deterministic"
    ),
    "hfta-nas search examples/cifar_shaped/space.yaml --threads 2": (
        "tests/test_cifar_example.py::test_the_example_searches_and_seed_tests_in_a_tiny_mode"
    ),
    "hfta-nas stability runs/cifar-like-cnn/best_config.yaml --seeds 8 --threads 2": (
        "tests/test_cifar_example.py::test_the_example_searches_and_seed_tests_in_a_tiny_mode"
    ),
    "hfta-nas search search_spaces/mnist1d_cnn.yaml --log tensorboard:runs/tensorboard "
    "--log mlflow:sqlite:///mlflow.db": ("tests/test_tracking.py::test_search_and_stability_commands_log_with_log"),
    "WANDB_MODE=offline hfta-nas search search_spaces/mnist1d_cnn.yaml --log wandb:my-project": (
        "tests/test_tracking.py::test_search_and_stability_commands_log_with_log"
    ),
    "hfta-nas stability --seeds 32 --log tensorboard:runs/tensorboard --log mlflow:sqlite:///mlflow.db": (
        "tests/test_tracking.py::test_search_and_stability_commands_log_with_log"
    ),
    "hfta-nas bench --quick": "tests/test_benchmarks.py::test_quick_run_covers_every_cell",
    "hfta-nas bench search --quick": "tests/test_benchmarks.py::test_search_quick_run_has_every_method_and_seed",
}


@dataclass
class Block:
    where: str  # file:line of the opening fence
    language: str
    lines: list[str] = field(default_factory=list)
    not_run: bool = False  # preceded by <!-- not run in tests: ... -->


@dataclass(frozen=True)
class Command:
    where: str
    text: str  # without its comment, whitespace normalised
    not_run: bool


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in nav_pages())]


def nav_pages() -> list[str]:
    def walk(entries):
        for entry in entries:
            if isinstance(entry, str):
                yield entry
            elif isinstance(entry, dict):
                for value in entry.values():
                    yield from walk(value) if isinstance(value, list) else walk([value])

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [page for page in walk(config["nav"]) if not page.startswith(("http://", "https://"))]


def blocks(path: Path) -> list[Block]:
    found, current, previous = [], None, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if current is None:
            if stripped.startswith("```"):
                current = Block(f"{path.relative_to(ROOT)}:{number}", stripped[3:].strip().lower())
                current.not_run = bool(BLOCK_NOT_RUN.match(previous))
            elif stripped:
                previous = line
        elif stripped == "```":
            found.append(current)
            current, previous = None, ""
        else:
            current.lines.append(line)
    assert current is None, f"{path}: a code block is not closed"
    return found


def split_comment(line: str) -> tuple[str, str]:
    """`cmd --x "a # b"   # comment` -> (`cmd --x "a # b"`, `# comment`), quotes respected."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""


def commands(block: Block) -> list[Command]:
    logical, pending = [], ""
    for line in block.lines:
        if block.language == "console":
            if not pending and not line.lstrip().startswith("$ "):
                continue  # output, not a command
            line = line.lstrip()[2:] if not pending else line
        text, comment = split_comment(line)
        if text.rstrip().endswith("\\"):  # continued on the next line
            pending += text.rstrip()[:-1] + " "
            continue
        logical.append((pending + text, comment))
        pending = ""
    found = []
    for text, comment in logical:
        text = " ".join(text.split())
        if text:
            found.append(Command(block.where, text, block.not_run or bool(NOT_RUN.search(comment))))
    return found


def documented_commands() -> list[Command]:
    return [c for path in doc_files() for b in blocks(path) if b.language in SHELL for c in commands(b)]


def python_blocks() -> list[Block]:
    found, seen = [], set()
    for path in doc_files():
        for block in blocks(path):
            text = "\n".join(block.lines)
            if block.language == "python" and not block.not_run and text not in seen:
                seen.add(text)
                found.append(block)
    return found


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/"


def test_every_page_of_the_nav_exists():
    pages = nav_pages()
    assert "index.md" in pages and "api.md" in pages
    missing = [page for page in pages if not (ROOT / "docs" / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a plain heading."""
    import unicodedata

    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readmes_links_reach_existing_files_and_headings():
    readme = (ROOT / "README.md").read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#{1,6} +(.+?) *$", file.read_text(), flags=re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"README.md links to missing files or headings: {broken}"


def test_every_documented_command_is_run_mapped_or_marked_not_run():
    found = documented_commands()
    assert any(c.text == MAIN_JOB for c in found)
    problems = []
    for command in found:
        places = [command.not_run, command.text in RUN, command.text in MAPPED]
        if sum(places) != 1:
            kind = "marked not run and also listed here" if sum(places) else "neither run, mapped nor marked"
            problems.append(f"{command.where}: {command.text!r}: {kind}")
    texts = {c.text for c in found}
    stale = [text for text in (*RUN, *MAPPED) if text not in texts]
    assert not problems, "\n".join(problems)
    assert not stale, f"listed here but no longer in the docs: {stale}"


def test_the_mapped_tests_exist():
    missing = []
    for node in sorted(set(MAPPED.values())):
        file, _, name = node.partition("::")
        tree = ast.parse((ROOT / file).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name.split("[")[0] not in names:
            missing.append(node)
    assert not missing, f"mapped to tests that do not exist: {missing}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder to run the documented commands from; what one writes (runs/) the next reads."""
    folder = tmp_path_factory.mktemp("docs-commands")
    for name in ("search_spaces", "examples"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    return {"folder": folder, "done": set()}


def hfta_nas_command() -> list[str]:
    script = Path(sys.executable).with_name("hfta-nas")  # the installed console script, else the same entry point
    return [str(script)] if script.exists() else [sys.executable, "-m", "hfta_nas.cli"]


def run_documented(text: str, workspace) -> None:
    if text in workspace["done"]:
        return
    for earlier in RUN[text].after:
        run_documented(earlier, workspace)
    argv = shlex.split(text) + list(RUN[text].extra)
    if argv[0] == "hfta-nas":
        argv = hfta_nas_command() + argv[1:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        argv, cwd=workspace["folder"], env=env, capture_output=True, text=True, timeout=GUARD_S, check=False
    )
    assert completed.returncode == 0, f"{text}\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    workspace["done"].add(text)


@pytest.mark.parametrize("text", list(RUN), ids=lambda text: re.sub(r"[^\w.=/,-]+", "_", text)[:80])
def test_documented_command_runs(text, workspace):
    run_documented(text, workspace)


@pytest.mark.parametrize("block", python_blocks(), ids=lambda block: block.where)
def test_documented_python_runs(block, workspace, monkeypatch):
    monkeypatch.chdir(workspace["folder"])
    code = textwrap.dedent("\n".join(block.lines))  # a block inside a list item is indented
    exec(compile(code, block.where, "exec"), {"__name__": "__docs__"})


SET_UP_VENV = "python3 -m venv .venv && . .venv/bin/activate"
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_set_up_is_two_commands_a_venv_cpu_torch_and_the_main_job(page):
    """The set-up holds on any Linux machine: a virtual environment, torch from PyTorch's CPU
    index (PyPI's Linux torch is the multi-GB CUDA build), then the package and the main job.
    Both set-up commands are marked not run: they install into an environment. What they do is
    run elsewhere: .ci/run makes the venv and installs the package the same way, but takes
    torch==2.13.0 from PyPI because CI's machine reaches no other index (so the index URL itself
    is not exercised here), and the main job they end with is in RUN above."""
    lines = (ROOT / page).read_text().splitlines()
    start = lines.index("## Set up") + 1
    end = next((n for n in range(start, len(lines)) if lines[n].startswith("## ")), len(lines))
    inside = [b for b in blocks(ROOT / page) if start < int(b.where.rsplit(":", 1)[1]) <= end]
    set_up = [c for b in inside if b.language in SHELL for c in commands(b)]
    assert len(set_up) == 2, f"{page}: the set-up shows {len(set_up)} commands, not two: {set_up}"
    install, tests = (c.text for c in set_up)
    assert install == f"{SET_UP_VENV} && {CPU_TORCH} && pip install -e . && {MAIN_JOB}"
    assert tests == '. .venv/bin/activate && pip install -e ".[dev]" && python -m pytest'
    assert all(c.not_run for c in set_up)
