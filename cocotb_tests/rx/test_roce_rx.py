import pytest

from testkit.harness import SIMULATORS, run_cocotb, width_cases


# 512 bits on Verilator in make soak: Icarus covers that width in make test.
@pytest.mark.parametrize("simulator,data_width", width_cases([64, 512], soak_on_verilator=[512]))
def test_roce_rx(simulator, data_width):
    run_cocotb("roce-rx", {"data_width": data_width}, "cocotb_tests.rx.tb_roce_rx", simulator)
