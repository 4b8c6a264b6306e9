"""The spray self-test top (:class:`mrcnic.boards.spraytest.SprayTest`) in simulation, read
through its serial port as a person at the board would: the script loads the path
selector, frames are sprayed evenly over the planes at the encapsulator's full rate, a
plane failed by command stops receiving frames at once while the others carry the
traffic, loss is counted, and once paused every frame sent is accounted for."""

import random

import cocotb
from cocotb.triggers import ClockCycles

from testkit.serial_port import start_top
from testkit.tbutil import params


def trouble(line):
    return line["bad"] or line["err"]


async def start(dut, cfg):
    serial = await start_top(dut, cfg["divisor"], "SPR", trouble)
    first = await serial.line(lambda s: s["script"] == cfg["ops"] and s["good"] > 0, 10)
    assert first["fail"] == 0 and first["loss"] == 0 and first["stall"] == 0
    assert int(dut.up.value) == 1
    return serial, first


def planes(cfg):
    return range(cfg["planes"])


@cocotb.test()
async def sprays_fails_over_and_accounts_for_every_frame(dut):
    cfg = params()
    serial, first = await start(dut, cfg)

    # Evenly over the planes, one output beat a cycle.
    a = await serial.line(lambda s: True, 1)
    b = await serial.line(lambda s: True, 1)
    sent = b["sent"] - a["sent"]
    shares = [(b[f"f{p}"] - a[f"f{p}"]) / sent for p in planes(cfg)]
    rate = sent * cfg["frame_beats"] / (b["cycle"] - a["cycle"])
    dut._log.info("%d frames in %d cycles: %.3f output beats a cycle (frames of %d beats); "
                  "plane shares %s", sent, b["cycle"] - a["cycle"], rate, cfg["frame_beats"],
                  " ".join(f"{s:.3f}" for s in shares))
    even = 1 / cfg["planes"]
    assert all(abs(s - even) <= 0.1 * even for s in shares), shares
    assert rate >= 0.95, f"{rate:.3f} beats a cycle out of the encapsulator"

    # Plane 1 fails at a random instant: no frame enters it after the line that shows it.
    await ClockCycles(dut.clk, random.randrange(5000))
    await serial.type("1")
    failed = await serial.line(lambda s: s["fail"] == 2, 4)
    # The line may have been latched just after the failure, before the frames decided
    # before it (four in the generator's FIFOs, one in the encapsulator) reached the plane.
    settled = await serial.line(lambda s: True, 1)
    later = await serial.line(lambda s: True, 1)
    assert settled["f1"] - failed["f1"] <= 5, "more frames into the failed plane than decided"
    assert later["f1"] == settled["f1"], "frames still sent into a failed plane"
    assert later["good"] - settled["good"] >= 100 and later["f0"] - settled["f0"] >= 100
    # A decision revoked in the cycle the port went down answers "no path": a few at most.
    assert later["stall"] <= 4, later
    dut._log.info("plane 1 failed: %d frames dropped in it, %d decisions revoked; %d good "
                  "frames in a report period, all on plane 0", later["l1"],
                  later["stall"], later["good"] - settled["good"])

    # Plane 1 back, 1/16 of the frames lost; then paused: every frame sent is accounted for.
    await serial.type("1ll")
    lossy = await serial.line(lambda s: s["fail"] == 0 and s["loss"] == 4096, 4)
    after = await serial.line(lambda s: True, 1)
    lost = sum(after[f"l{p}"] - lossy[f"l{p}"] for p in planes(cfg))
    assert lost > 0 and after["f1"] > lossy["f1"]
    await serial.type("p")
    await serial.line(lambda s: True, 1)            # perhaps latched while the FIFOs drain
    quiet = await serial.line(lambda s: True, 1)
    end = await serial.line(lambda s: True, 1)
    assert end["sent"] == quiet["sent"], "frames sent while paused"
    assert end["sent"] == end["good"] + sum(end[f"l{p}"] for p in planes(cfg)), end
    dut._log.info("loss 1/16: %d of %d frames lost; paused: %d sent = %d good + %d lost or "
                  "failed", lost, after["sent"] - lossy["sent"], end["sent"], end["good"],
                  end["sent"] - end["good"])
    assert int(dut.bad.value) == 0
