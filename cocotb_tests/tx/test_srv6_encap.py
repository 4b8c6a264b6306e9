import pytest

from testkit.harness import SIMULATORS, run_cocotb, width_cases


@pytest.mark.parametrize("simulator,data_width", width_cases([64, 512], soak_on_verilator=[64, 512]))
def test_srv6_encap(simulator, data_width):
    run_cocotb("srv6-encap", {"data_width": data_width}, "cocotb_tests.tx.tb_srv6_encap", simulator)


@pytest.mark.soak
@pytest.mark.parametrize("data_width", [128, 256, 1024, 2048])
def test_srv6_encap_more_widths(data_width):
    """The other widths on Verilator, the faster simulator for long traffic runs."""
    if "verilator" not in SIMULATORS:
        pytest.skip("Verilator not selected (COCOTB_SIMS)")
    run_cocotb("srv6-encap", {"data_width": data_width},
               "cocotb_tests.tx.tb_srv6_encap", "verilator")
