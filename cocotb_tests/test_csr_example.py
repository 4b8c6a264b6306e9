import pytest

from csr_example import CsrExample
from harness import SIMULATORS, run_cocotb_component


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_csr_over_axi_lite(simulator):
    run_cocotb_component("mrcnic_csr_example", CsrExample(), {}, "tb_csr", simulator)
