"""Run a cocotb module on a block's exported Verilog, in Icarus Verilog or Verilator.

``run_cocotb(block, params, module, simulator)`` exports ``block`` at ``params`` (one Verilog
file per parameter set, the parameters in the module name), builds it once per simulator into
``build/cocotb/<module>/<simulator>``, and runs the cocotb test module ``module`` (a file of
this folder) on it. The testbench gets the parameters as JSON in ``MRCNIC_PARAMS``
(``tbutil.params()``).

* Seeds: ``SEED=<n>`` replays a run; otherwise a fresh seed is drawn. cocotb seeds Python's
  ``random`` with it, and every failure message names it.
* Waves: ``WAVES=1`` writes an FST (Verilator) or VCD/FST (Icarus) in the build folder.
* ``COCOTB_SIMS=icarus`` (or ``verilator``) narrows the simulators ``SIMULATORS`` offers.
"""

import os
from pathlib import Path

import pytest

from mrcnic.flow import registry
from mrcnic.flow.export import export_verilog, verilog_text
from mrcnic.flow.simrun import run as _simrun

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cocotb"

SIMULATORS = [s for s in os.environ.get("COCOTB_SIMS", "icarus,verilator").split(",") if s]


def width_cases(widths, soak_on_verilator=()):
    """``(simulator, data_width)`` parameters for every selected simulator and width; the
    widths in ``soak_on_verilator`` run on Verilator in ``make soak`` only (each is a
    minute of Verilator build that the Icarus run of the same width already covers)."""
    return [pytest.param(sim, w, id=f"{w}-{sim}",
                         marks=[pytest.mark.soak] if sim == "verilator" and
                         w in soak_on_verilator else [])
            for w in widths for sim in SIMULATORS]


def run_cocotb(block, params, module, simulator, **kwargs):
    """Run cocotb module ``module`` on registered block ``block`` at ``params``."""
    params = registry.parse_params(block) | dict(params)
    top = registry.module_name(block, params)
    source, _ = export_verilog(block, params, BUILD / top / f"{top}.v")
    return _run(top, source, params, module, simulator, **kwargs)


def run_cocotb_component(top, component, params, module, simulator, **kwargs):
    """The same for a component that is not a catalogued block (test tops, examples)."""
    source = BUILD / top / f"{top}.v"
    source.parent.mkdir(parents=True, exist_ok=True)
    text = verilog_text(component, top)
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    return _run(top, source, params, module, simulator, **kwargs)


def _run(top, source, params, module, simulator, **kwargs):
    return _simrun(top, source, params, module, simulator, BUILD / top / simulator, **kwargs)
