import pytest

from testkit.harness import SIMULATORS, run_cocotb

SMALL = {"qps": 4, "outstanding": 128, "tag_width": 16, "pending": 4}

# Icarus cross-checks the small configuration; Verilator runs it too, and the default
# configuration (64 QPs x 1024 PSNs: a 9 MB Verilog file, about 3 minutes of C++ build) in
# make soak.
CASES = [pytest.param(sim, SMALL, id=f"{sim}-small") for sim in SIMULATORS]
if "verilator" in SIMULATORS:
    CASES.append(pytest.param("verilator", {}, id="verilator-default",
                              marks=pytest.mark.soak))


@pytest.mark.parametrize("simulator,params", CASES)
def test_retransmit_tracker(simulator, params):
    run_cocotb("retransmit-tracker", params, "cocotb_tests.tx.tb_retransmit_tracker", simulator)
