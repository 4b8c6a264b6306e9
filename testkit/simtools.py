"""Small base for tests on Amaranth's simulator.

``run(dut, *testbenches)`` clocks ``dut`` at 100 MHz and runs async testbenches
(``async def tb(ctx)``) until all of them return; with ``WAVES=1`` in the environment it writes
``build/waves/<test>.vcd``. ``soak(n)`` scales a randomized test's length by ``MRCNIC_SOAK``
(``make soak``). ``seeded()`` gives a ``random.Random`` whose seed is printed, and
taken from ``SEED`` when set, so that any failure can be replayed.

For a register command written while records are in flight, where the testbenches share a
dict ``st`` (``st["cycle"]``, counted by a sink each tick; ``st["on"]``, the traffic offered;
``st["ready_at"]``, the cycle from which the outputs are ready): ``command_cases`` gives the
cases, ``offer`` drives the records in, ``start_traffic`` starts each case, ``until_clear``
polls a busy bit under a bound in cycles and ``until_moved`` checks that the block keeps
working.
"""

import os
import random
import re

from amaranth.sim import Simulator

__all__ = ["run", "seeded", "soak", "command_cases", "offer", "start_traffic", "until_clear",
           "until_moved"]


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


def command_cases(hold, late=20, phases=6):
    """The (case, hold, lead, phase) of a command written ``lead + phase`` cycles into the
    traffic, ``phase`` from 0 to ``phases - 1``, in three cases: 0, the outputs always
    ready (hold 0, lead 0); 1, the outputs held not ready for ``hold`` cycles from the start
    (lead 0); 2, held so, the command ``late`` cycles later (lead ``late``)."""
    for case, (h, lead) in enumerate([(0, 0), (hold, 0), (hold, late)]):
        for phase in range(phases):
            yield case, h, lead, phase


async def offer(ctx, st, port, make, taken, queue=()):
    """Offers records on ``port`` (``valid``, ``payload``, ``ready``) until ``st["stop"]``:
    first those put in ``queue`` (a list), else, while ``st["on"]``, ``make(i)`` for ``i`` =
    0, 1, ...; each is held until taken, then appended to ``taken``."""
    i, r = 0, None
    while not st["stop"]:
        if r is None and queue:
            r = queue.pop(0)
        elif r is None and st["on"]:
            r = make(i)
            i += 1
        ctx.set(port.valid, r is not None)
        if r is not None:
            ctx.set(port.payload, r)
        _, _, ready = await ctx.tick().sample(port.ready)
        if r is not None and ready:
            taken.append(r)
            r = None
    ctx.set(port.valid, 0)


async def start_traffic(ctx, st, hold, cycles):
    """Turns the traffic on (``st["on"]``) with the outputs held not ready for ``hold``
    cycles from now (``st["ready_at"]``), then lets ``cycles`` cycles pass."""
    st["ready_at"] = st["cycle"] + hold
    st["on"] = True
    for _ in range(cycles):
        await ctx.tick()


async def until_clear(st, busy, since, bound, what):
    """Awaits ``busy()`` (an async read of a busy bit) until it reads 0; fails with
    ``"<what> still set <bound> cycles after the write"`` once ``st["cycle"]`` is ``bound``
    cycles past ``since`` (the cycle of the write)."""
    while await busy():
        assert st["cycle"] - since < bound, f"{what} still set {bound} cycles after the write"


async def until_moved(ctx, st, counts, within, what):
    """Ticks until every count of ``counts()`` (a tuple) is past its value at the call, up to
    ``within`` cycles after now or after the outputs' release (``st["ready_at"]``),
    whichever is later; fails with ``what``, the counts before and after, otherwise."""
    seen = counts()

    def moved():
        return all(a > b for a, b in zip(counts(), seen))

    limit = max(st["cycle"], st["ready_at"]) + within
    while st["cycle"] < limit and not moved():
        await ctx.tick()
    assert moved(), f"{what} ({seen} -> {counts()})"
