import pytest

from testkit.harness import SIMULATORS, run_cocotb

SMALL = {"qps": 4, "mpr_max": 2, "max_wimm_dest": 2}

# Icarus takes minutes per thousand records on the default configuration (64 QPs, four
# 128-bit read ports): it cross-checks the small one; Verilator runs both.
# The default configuration on Verilator is in make soak (a minute more of build and run).
CASES = [pytest.param(sim, params, id=f"{sim}-{'small' if params else 'default'}",
                      marks=[] if params else [pytest.mark.soak])
         for sim in SIMULATORS
         for params in ([{}, SMALL] if sim == "verilator" else [SMALL])]


@pytest.mark.parametrize("simulator,params", CASES)
def test_psn_tracker(simulator, params):
    run_cocotb("psn-tracker", params, "cocotb_tests.rx.tb_psn_tracker", simulator)
