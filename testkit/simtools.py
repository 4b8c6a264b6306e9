"""Small base for tests on Amaranth's simulator.

``run(dut, *testbenches)`` clocks ``dut`` at 100 MHz and runs async testbenches
(``async def tb(ctx)``) until all of them return; with ``WAVES=1`` in the environment it writes
``build/waves/<test>.vcd``. ``soak(n)`` scales a randomized test's length by ``MRCNIC_SOAK``
(``make soak``). ``seeded()`` gives a ``random.Random`` whose seed is printed, and
taken from ``SEED`` when set, so that any failure can be replayed.
"""

import os
import random
import re

from amaranth.sim import Simulator

__all__ = ["run", "seeded", "soak"]


def _test_name():
    name = os.environ.get("PYTEST_CURRENT_TEST", "sim").split(" ")[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run(dut, *testbenches, processes=(), clock=1e-8, deadline=None):
    sim = Simulator(dut)
    if clock:                       # None for purely combinational designs
        sim.add_clock(clock)
    for tb in testbenches:
        sim.add_testbench(tb)
    for p in processes:
        sim.add_process(p)
    if os.environ.get("WAVES"):
        os.makedirs("build/waves", exist_ok=True)
        with sim.write_vcd(f"build/waves/{_test_name()}.vcd"):
            sim.run_until(deadline) if deadline else sim.run()
    else:
        sim.run_until(deadline) if deadline else sim.run()


def seeded():
    seed = int(os.environ.get("SEED", random.randrange(1 << 32)))
    print(f"seed: {seed} (rerun with SEED={seed})")
    return random.Random(seed)


def soak(count):
    """``count`` times the soak factor (``MRCNIC_SOAK``, 1 by default)."""
    return count * max(1, int(os.environ.get("MRCNIC_SOAK", "1")))


def sibling(name):
    """The Amaranth-simulator test module ``name`` (its path under ``sim/``, without
    ``.py``: ``"rx/test_roce_rx"``), loaded by its path, for a test that reuses another's
    runner: the tests are not a package, and cocotb_tests holds modules of the same names."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "sim" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"sibling_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def netlist_cell(kind, ins, outs):
    """A cell of a Yosys ``write_json`` netlist: ``ins``/``outs`` map port -> net bits."""
    return {"type": kind, "connections": {**ins, **outs},
            "port_directions": {**{p: "input" for p in ins}, **{p: "output" for p in outs}}}
