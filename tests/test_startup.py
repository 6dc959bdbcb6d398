"""Start-up imports only what the command needs.

`hfta-nas --help` and every command's --help import neither torch nor the
statistics and plots of `stability` (nor pandas, matplotlib, scipy); a search
imports no statistics or plots; `import hfta_nas` for the engine imports no
Optuna, and the search names still load on first use. Each check runs in a
fresh interpreter and looks at `sys.modules` when it is done: what was loaded,
never how long it took.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._rendezvous import GUARD_S

ROOT = Path(__file__).resolve().parents[1]
# the engine is every hfta_nas module but the package itself (its names load on first use), the
# command line and the stability commands' click objects (LIGHT_STABILITY)
HEAVY = ("torch", "optuna", "pandas", "matplotlib", "seaborn", "scipy", "hfta_nas.array")
HEAVY += ("hfta_nas.data", "hfta_nas.models", "hfta_nas.optim", "hfta_nas.training", "hfta_nas.search")
STATS_AND_PLOTS = ("matplotlib", "seaborn", "pandas", "scipy.stats")
LIGHT_STABILITY = {
    "hfta_nas.stability",
    "hfta_nas.stability._cli",
    "hfta_nas.stability._formats",
}  # the click objects of its commands
LIGHT_SEARCH = {
    "hfta_nas.search_spaces",
    "hfta_nas.search_spaces._cli",
    "hfta_nas.search_spaces._search_output",
}  # the search command's click objects and what it prints, not the schema, pydantic or the engine


def loaded_after(code: str, cwd: Path = ROOT) -> dict:
    """Run `code` in a fresh interpreter; return the JSON its last line prints (it sets `result`) and `modules`."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json as _json, sys as _sys
        print(_json.dumps({"result": result, "modules": sorted(_sys.modules)}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=GUARD_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_cli(*args: str, cwd: Path = ROOT) -> dict:
    """`hfta-nas ARGS` in a fresh interpreter (cli.main as the console script runs it): exit code, stdout,
    stderr and the modules loaded."""
    return loaded_after(
        f"""
        import contextlib, io
        from hfta_nas.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main({list(args)!r}, prog_name="hfta-nas")
                code = 0
            except SystemExit as exit:
                code = exit.code
        result = {{"code": code, "output": out.getvalue(), "errors": err.getvalue()}}
    """,
        cwd=cwd,
    )


def present(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    """The names in `roots` that are loaded (a root counts when it or any submodule of it is)."""
    return [root for root in roots if any(m == root or m.startswith(root + ".") for m in modules)]


# `bench` is not here: its --help is the benchmark script's own (argparse), which imports torch.
HELPS = [
    (),
    ("train",),
    ("search",),
    ("dashboard",),
    ("stability",),
    ("stability", "run"),
    ("stability", "compare"),
    ("report",),
]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "hfta-nas")
def test_help_imports_no_engine_statistics_or_plots(command):
    done = run_cli(*command, "--help")
    assert done["result"]["code"] == 0 and "Usage: hfta-nas" in done["result"]["output"]
    assert present(done["modules"], HEAVY) == []
    stability = {m for m in done["modules"] if m == "hfta_nas.stability" or m.startswith("hfta_nas.stability.")}
    if command[:1] in (("stability",), ("report",)):
        assert stability <= LIGHT_STABILITY  # the command's click objects, not the statistics or plots
    else:
        assert stability == set()
    spaces = {m for m in done["modules"] if m == "hfta_nas.search_spaces" or m.startswith("hfta_nas.search_spaces.")}
    assert spaces <= (LIGHT_SEARCH if command == ("search",) else set())


def test_the_command_list_shows_lazy_commands_as_their_own_help_would():
    """`hfta-nas --help` lists the lazy commands (search, stability, report) without importing them, as they would."""
    done = loaded_after("""
        import click
        from hfta_nas.cli import _LAZY_COMMANDS, main

        def listing():
            with click.Context(main, info_name="hfta-nas") as ctx:
                return main.get_help(ctx)

        before = listing()
        unloaded = sorted(set(_LAZY_COMMANDS) - set(main.commands))
        with click.Context(main, info_name="hfta-nas") as ctx:
            summaries = {name: [line, main.get_command(ctx, name).get_short_help_str(10**6)]
                         for name, (line, _) in _LAZY_COMMANDS.items()}
        result = {"before": before, "after": listing(), "unloaded": unloaded, "summaries": summaries}
    """)
    result = done["result"]
    assert result["unloaded"] == ["report", "search", "stability"]  # listed before loading, ...
    assert result["before"] == result["after"]  # ... exactly as when loaded
    for name, (line, own) in result["summaries"].items():
        assert line == own, f"cli._LAZY_COMMANDS[{name!r}] lists {line!r}; the command's help starts {own!r}"
    assert {"report", "search", "stability"} <= set(result["before"].split())


def test_a_user_error_before_the_engine_is_imported_is_still_a_clear_line(tmp_path):
    """`_friendly_errors` finds HftaNasError without importing the engine itself; one raised later is still caught."""
    done = run_cli("report", str(tmp_path / "missing"))
    assert done["result"]["code"] == 2
    assert done["result"]["errors"].startswith("error: ") and "Traceback" not in done["result"]["errors"]


def test_search_dry_run_imports_no_statistics_or_plots(tmp_path):
    # Generated once into the session's file cache (generating it imports mnist1d's plotting), in a
    # process of its own: in this one an earlier test may have it in memory only, with no file written.
    generate = "from hfta_nas.data import load_dataset; load_dataset('mnist1d')"
    subprocess.run([sys.executable, "-c", generate], check=True)
    space = ROOT / "search_spaces" / "mnist1d_cnn.yaml"
    done = run_cli(
        "search",
        str(space),
        "--dry-run",
        "--json",
        "--storage",
        str(tmp_path / "s.journal"),
        "--n-trials",
        "2",
        "--set",
        "training.epochs=1",
        "--set",
        "array.size=2",
        cwd=tmp_path,
    )
    assert done["result"]["code"] == 0, done["result"]["output"]
    assert sum(len(a["trials"]) for a in json.loads(done["result"]["output"])["arrays"]) == 2
    assert present(done["modules"], ("hfta_nas.stability", *STATS_AND_PLOTS)) == []
    assert not (tmp_path / "s.journal").exists()


def test_import_hfta_nas_imports_no_optuna_and_the_search_loads_on_first_use():
    done = loaded_after("""
        import sys
        from pathlib import Path

        import hfta_nas

        root = Path(hfta_nas.__file__).parent
        for path in sorted(root.rglob("*.py")):  # every engine module outside the search core
            parts = path.relative_to(root).with_suffix("").parts
            if parts[0] not in ("search", "tracking"):  # tracking logs a search's events: the search side
                __import__(".".join(("hfta_nas", *(parts[:-1] if parts[-1] == "__init__" else parts))))
        engine = sorted(sys.modules)

        from hfta_nas import Candidate, SearchSummary, optimize, plan  # noqa: F401 - importing them is the test
        import hfta_nas.search

        result = {
            "engine": engine,
            "same": [hfta_nas.optimize is hfta_nas.search.optimize, hfta_nas.plan is hfta_nas.search.plan,
                     hfta_nas.Candidate is hfta_nas.search.Candidate, Candidate is hfta_nas.search.Candidate,
                     SearchSummary is hfta_nas.search.SearchSummary],
            "all": [name for name in hfta_nas.__all__ if not hasattr(hfta_nas, name)],
            "dir": sorted({"optimize", "plan", "Candidate", "SearchSummary", "search"} - set(dir(hfta_nas))),
        }
    """)
    assert (
        present(done["result"]["engine"], ("optuna", "hfta_nas.search", "hfta_nas.stability", *STATS_AND_PLOTS)) == []
    )
    assert "optuna" in done["modules"] and all(done["result"]["same"])
    assert done["result"]["all"] == [] and done["result"]["dir"] == []


def test_import_hfta_nas_search_names_and_unknown_names():
    import hfta_nas
    import hfta_nas.stability as stability

    assert callable(hfta_nas.optimize) and "optimize" in hfta_nas.__all__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hfta_nas.nope  # noqa: B018 - the attribute access is what raises
    assert all(hasattr(stability, name) for name in stability.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stability.nope  # noqa: B018 - the attribute access is what raises
    import hfta_nas.search_spaces as search_spaces

    # every listed name loads from the module the lazy table names, and the table lists no other
    assert sorted(search_spaces.__all__) == sorted(["SHIPPED_SPACES", *search_spaces._MODULE_OF])
    assert all(hasattr(search_spaces, name) for name in search_spaces.__all__)
    assert search_spaces.search_command.name == "search"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        search_spaces.nope  # noqa: B018 - the attribute access is what raises


def test_import_stability_alone_imports_nothing_heavy():
    done = loaded_after("""
        import hfta_nas.stability as stability

        result = sorted(stability.__all__)
    """)
    assert present(done["modules"], HEAVY) == []
    assert {m for m in done["modules"] if m.startswith("hfta_nas.stability")} == {"hfta_nas.stability"}
