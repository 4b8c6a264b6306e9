import pytest

from harness import SIMULATORS, run_cocotb


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("data_width", [64, 512])
def test_roce_rx(simulator, data_width):
    run_cocotb("roce-rx", {"data_width": data_width}, "tb_roce_rx", simulator)
