import pytest

from testkit.harness import SIMULATORS, run_cocotb


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("data_width", [64, 512, 2048])
def test_skid_buffer(simulator, data_width):
    run_cocotb("skid-buffer", {"data_width": data_width, "user_width": 2},
               "cocotb_tests.base.tb_skid_buffer",
               simulator)
