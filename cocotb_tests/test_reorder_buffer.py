import pytest

from harness import SIMULATORS, run_cocotb


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("data_width", [64, 512])
def test_reorder_buffer(simulator, data_width):
    run_cocotb("reorder-buffer", {"data_width": data_width}, "tb_reorder_buffer", simulator)
