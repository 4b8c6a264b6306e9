"""The package as a user installs it: the wheel with the ``sim`` extra in a fresh virtual
environment runs ``mrcnic demo`` (a short transfer, 2 planes) to the end, plot included.
In ``make soak``: the install and the Verilator build of the two NICs take minutes."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak
def test_the_wheel_with_the_sim_extra_runs_a_short_demo(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          f"{ROOT}[sim]"], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    run = tmp_path / "run"
    demo = subprocess.run([str(venv / "bin" / "mrcnic"), "demo", "--planes", "2", "--qps", "2",
                           "--ev-count", "8", "--size", "16384", "--out", str(run)],
                          capture_output=True, text=True, cwd=tmp_path)
    print(demo.stdout[-3000:])
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "all data arrived intact" in demo.stdout
    assert (run / "metrics.json").exists() and (run / "goodput.png").exists()
