"""The board self-test top in simulation (Verilator), read through its UART: it comes up
and runs (``make test``); a plane failed and restored with loss (``make soak``)."""

import pytest

from testkit.harness import run_cocotb_component
from mrcnic.boards.selftest import SelfTest

# A fast serial line (25 MHz / 8) and a report every 25000 cycles (a line takes 12000),
# so that the simulation sees many lines; the NIC's timers run at the board's 25 MHz.
CONFIG = {"planes": 2, "data_width": 64, "qps": 2, "ev_count": 8, "clk_hz": 25_000_000,
          "baud": 3_125_000, "report_hz": 1000}


@pytest.mark.parametrize("simulator", ["verilator"])
def test_selftest(simulator):
    top = SelfTest(**CONFIG)
    params = dict(CONFIG, divisor=top.divisor, ops=len(top.ops),
                  run_bytes=top.msgs << top.msg_log2)
    run_cocotb_component("mrcnic_selftest", top, params,
                         "cocotb_tests.boards.tb_selftest", simulator)
