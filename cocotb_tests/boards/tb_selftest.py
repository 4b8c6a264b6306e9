"""The board self-test top (:class:`mrcnic.boards.selftest.SelfTest`) in simulation, read as a
person at the board's serial port would: status lines decoded from the ``tx`` pin,
commands typed on ``rx``. The bring-up script completes, runs complete with nothing bad,
a plane failed by command stops carrying frames while runs go on over the others, and
random loss on every plane is recovered."""

import cocotb

from testkit.serial_port import start_top
from testkit.tbutil import params


def cfg_long():
    """The plane failure and loss test: Verilator in ``make soak`` (a few minutes)."""
    import os
    return int(os.environ.get("MRCNIC_SOAK", "1")) > 1


def trouble(line):
    return line["data"] or line["dup"] or line["stray"] or line["err"]


async def start(dut, cfg):
    serial = await start_top(dut, cfg["divisor"], "MRC", trouble)
    first = await serial.line(lambda s: s["script"] == cfg["ops"] and s["runs"] >= 2, 10)
    dut._log.info("up, runs going: %s", first)
    assert first["fail"] == 0 and first["loss"] == 0 and int(dut.up.value) == 1
    return serial, first


@cocotb.test()
async def comes_up_and_runs(dut):
    """The bring-up script completes and runs complete with nothing bad."""
    cfg = params()
    serial, first = await start(dut, cfg)
    assert first["bytes"] >= 2 * cfg["run_bytes"] and int(dut.bad.value) == 0
    assert first["f0"] > 0 and first["f1"] > 0, "a plane unused"


@cocotb.test(skip=not cfg_long())
async def runs_survive_a_failed_plane_and_loss(dut):
    """Plane 1 failed by command: runs go on over plane 0, the plane's EVs are reported;
    restored with 1/64 loss on both planes: runs go on, the losses recovered."""
    cfg = params()
    serial, first = await start(dut, cfg)
    await serial.type("1")                                   # plane 1 fails
    failed = await serial.line(lambda s: s["fail"] == 2, 4)
    later = await serial.line(lambda s: s["runs"] >= failed["runs"] + 3, 20)
    assert later["ev"] > first["ev"], "no EV state change after a plane failed"
    # Nothing more is sent into the failed plane: no data (its port is down), no probe
    # (a down port is not probed), no SACK (they go on the planes of the data they answer).
    assert later["f1"] - failed["f1"] <= 3, "frames still sent into a failed plane"
    dut._log.info("plane 1 failed: %d runs more, %d EV changes, %d frames into plane 1 "
                  "after the line that shows the failure", later["runs"] - failed["runs"],
                  later["ev"] - first["ev"], later["f1"] - failed["f1"])

    await serial.type("1l")                                  # plane 1 back, loss 1/64
    lossy = await serial.line(lambda s: s["fail"] == 0 and s["loss"] == 1024, 4)
    after = await serial.line(lambda s: s["runs"] >= lossy["runs"] + 3, 30)
    lost = sum(after[f"l{p}"] - lossy[f"l{p}"] for p in range(cfg["planes"]))
    assert lost > 0 and after["f1"] > lossy["f1"]
    dut._log.info("loss 1/64: %d runs more, %d frames lost on the way, %d EV changes",
                  after["runs"] - lossy["runs"], lost, after["ev"] - lossy["ev"])
    assert int(dut.bad.value) == 0
