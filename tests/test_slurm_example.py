"""The Slurm job array in examples/slurm parses as bash, and every option it gives
`hfta-nas search` is one the command takes (no Slurm here to submit it to)."""

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "slurm" / "search.sbatch"


def test_the_slurm_script_parses_and_names_only_real_search_options():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    command = SCRIPT.read_text().split("exec hfta-nas search", 1)[1]
    used = set(re.findall(r"(--[a-z][a-z-]+)", command))
    help_text = CliRunner().invoke(main, ["search", "--help"], terminal_width=200).output
    assert used and used <= set(re.findall(r"(--[a-z][a-z-]+)", help_text)), used
