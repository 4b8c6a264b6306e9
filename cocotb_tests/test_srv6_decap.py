import pytest

from harness import SIMULATORS, run_cocotb


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("data_width", [64, 512])
def test_srv6_decap(simulator, data_width):
    run_cocotb("srv6-decap", {"data_width": data_width}, "tb_srv6_decap", simulator)
