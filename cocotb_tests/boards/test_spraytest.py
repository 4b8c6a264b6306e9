"""The spray self-test top in simulation, on both simulators, read through its UART."""

import pytest

from testkit.harness import SIMULATORS, run_cocotb_component
from mrcnic.boards.spraytest import SprayTest

# A fast serial line (25 MHz / 4) and a report every 12500 cycles (a line takes about
# 5200), so that the simulation sees many lines.
CONFIG = {"planes": 2, "data_width": 64, "qps": 2, "ev_count": 8, "payload": 256,
          "clk_hz": 25_000_000, "baud": 6_250_000, "report_hz": 2000}


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_spraytest(simulator):
    top = SprayTest(**CONFIG)
    params = dict(CONFIG, divisor=top.divisor, ops=len(top.ops), frame_beats=top.frame_beats)
    run_cocotb_component("mrcnic_spraytest", top, params,
                         "cocotb_tests.boards.tb_spraytest", simulator)
