import pytest

from testkit.harness import SIMULATORS, run_cocotb, width_cases


# 512 bits on Verilator in make soak: Icarus covers that width in make test.
@pytest.mark.parametrize("simulator,data_width", width_cases([64, 512], soak_on_verilator=[512]))
def test_roce_tx(simulator, data_width):
    run_cocotb("roce-tx", {"data_width": data_width, "qps": 8},
               "cocotb_tests.tx.tb_roce_tx", simulator)


@pytest.mark.soak
@pytest.mark.parametrize("data_width,qps", [(128, 64), (256, 5), (2048, 64)])
def test_roce_tx_more_widths(data_width, qps):
    """Other widths and table sizes on Verilator, the faster simulator for long runs."""
    if "verilator" not in SIMULATORS:
        pytest.skip("Verilator not selected (COCOTB_SIMS)")
    run_cocotb("roce-tx", {"data_width": data_width, "qps": qps},
               "cocotb_tests.tx.tb_roce_tx", "verilator")
