import pytest

from testkit.csr_example import CsrExample
from testkit.harness import SIMULATORS, run_cocotb_component


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_csr_over_axi_lite(simulator):
    run_cocotb_component("mrcnic_csr_example", CsrExample(), {},
                         "cocotb_tests.base.tb_csr", simulator)
