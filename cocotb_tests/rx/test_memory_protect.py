import pytest

from testkit.harness import SIMULATORS, run_cocotb

SMALL = {"regions": 4, "qps": 8}
CASES = [(sim, params) for sim in SIMULATORS for params in ({}, SMALL)]


@pytest.mark.parametrize("simulator,params", CASES,
                         ids=[f"{s}-{'small' if p else 'default'}" for s, p in CASES])
def test_memory_protect(simulator, params):
    run_cocotb("memory-protect", params, "cocotb_tests.rx.tb_memory_protect", simulator)
