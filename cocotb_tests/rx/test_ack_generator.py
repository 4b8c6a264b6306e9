import pytest

from testkit.harness import SIMULATORS, run_cocotb, width_cases


# 512 bits on Verilator in make soak: Icarus covers that width in make test.
@pytest.mark.parametrize("simulator,data_width", width_cases([64, 512], soak_on_verilator=[512]))
def test_ack_generator(simulator, data_width):
    run_cocotb("ack-generator", {"data_width": data_width},
               "cocotb_tests.rx.tb_ack_generator", simulator)


@pytest.mark.soak
@pytest.mark.parametrize("data_width,qps", [(128, 64), (256, 5), (1024, 64), (2048, 256)])
def test_ack_generator_more_widths(data_width, qps):
    """Other widths and table sizes on Verilator, the faster simulator for long runs."""
    if "verilator" not in SIMULATORS:
        pytest.skip("Verilator not selected (COCOTB_SIMS)")
    run_cocotb("ack-generator", {"data_width": data_width, "qps": qps},
               "cocotb_tests.rx.tb_ack_generator",
               "verilator")
