"""The two-NIC simulation of ``mrcnic demo`` on Verilator (in ``make soak`` and ``make demo``:
building two NICs takes minutes): 4 planes, a plane failing mid-transfer, then 1% loss;
every byte placed once, intact, every work request completed."""

import pytest

from mrcnic import demo

SMALL = {"planes": 4, "size": 256 << 10, "msg_bytes": 32 << 10, "pmtu_log2": 12,
         "qps": 2, "ev_count": 16, "max_cycles": 600_000}


@pytest.mark.soak
@pytest.mark.parametrize("case", ["plane_failure", "loss"])
def test_two_nics_over_the_fabric(case, tmp_path):
    cfg = dict(SMALL)
    if case == "plane_failure":
        cfg["failures"] = [demo.parse_failure("1@60")]
    else:
        cfg["loss"] = 0.01
    m = demo.run_demo(cfg, out_dir=str(tmp_path))
    print(demo.summary(m))
    assert m["complete"] and m["completions"] == m["work_requests"]
    assert m["missing"] == 0 and m["duplicates"] == 0
