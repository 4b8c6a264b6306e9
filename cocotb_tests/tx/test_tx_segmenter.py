import pytest

from testkit.harness import SIMULATORS, run_cocotb


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("qps,msgs", [(4, 4), (64, 16)])
def test_tx_segmenter(simulator, qps, msgs):
    run_cocotb("tx-segmenter", {"qps": qps, "msgs": msgs},
               "cocotb_tests.tx.tb_tx_segmenter", simulator)
