import pytest

from testkit.harness import SIMULATORS, run_cocotb

SMALL = {"qps": 8, "ev_count": 32, "planes": 4, "profiles": 2, "ev_bits": 32}

# Both simulators run the small configuration in make test (Verilator's C++ build of it
# costs about 75 s of CPU). Icarus is slow on the default configuration (1024 EV states,
# 256-bit EVs) and Verilator's build of it takes minutes: that one runs in make soak.
CASES = [pytest.param("icarus", SMALL, id="icarus-small"),
         pytest.param("verilator", SMALL, id="verilator-small"),
         pytest.param("verilator", {}, id="verilator-default", marks=pytest.mark.soak)]


@pytest.mark.parametrize("simulator,params", CASES)
def test_path_selector(simulator, params):
    if simulator not in SIMULATORS:
        pytest.skip(f"{simulator} not in COCOTB_SIMS")
    run_cocotb("path-selector", params, "cocotb_tests.tx.tb_path_selector", simulator)
