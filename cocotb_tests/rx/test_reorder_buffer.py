import pytest

from testkit.harness import run_cocotb, width_cases


@pytest.mark.parametrize("simulator,data_width", width_cases([64, 512], soak_on_verilator=[512]))
def test_reorder_buffer(simulator, data_width):
    run_cocotb("reorder-buffer", {"data_width": data_width},
               "cocotb_tests.rx.tb_reorder_buffer", simulator)
