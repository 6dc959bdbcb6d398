"""The Slurm job array in examples/slurm parses as bash, every option it gives
`hfta-nas search` is one the command takes, and its time limit ends it with a SIGTERM that
reaches hfta-nas (no Slurm here to submit it to)."""

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from hfta_nas.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "slurm" / "search.sbatch"


def test_the_slurm_script_parses_and_names_only_real_search_options():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    command = SCRIPT.read_text().split("exec hfta-nas search", 1)[1]
    used = set(re.findall(r"(--[a-z][a-z-]+)", command))
    help_text = CliRunner().invoke(main, ["search", "--help"], terminal_width=200).output
    assert used and used <= set(re.findall(r"(--[a-z][a-z-]+)", help_text)), used


def test_the_slurm_script_asks_for_a_sigterm_that_reaches_hfta_nas_before_the_time_limit():
    """`--signal=B:TERM@...` signals only the batch shell (without B:, only srun job steps, and
    the script starts none): the shell must `exec` hfta-nas so that the SIGTERM is hfta-nas's."""
    text = SCRIPT.read_text()
    signal = re.findall(r"^#SBATCH --signal=B:TERM@(\d+)$", text, flags=re.MULTILINE)
    assert signal and int(signal[0]) >= 60, "no '#SBATCH --signal=B:TERM@SECONDS' line"
    assert re.search(r"^exec hfta-nas search ", text, flags=re.MULTILINE)
    assert "srun" not in text.split("exec hfta-nas search", 1)[1]  # no job step to signal instead
