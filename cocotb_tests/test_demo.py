"""The two-NIC simulation of ``mrcnic demo`` on Verilator (in ``make soak`` and ``make demo``:
building two NICs takes minutes): 4 planes, a plane failing mid-transfer, then 1% loss;
every byte placed once, intact, every work request completed; and bad frames of every kind
dropped and counted."""

import pytest

from mrcnic import demo
from mrcnic.demo_bench import INJECT_KINDS

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


@pytest.mark.soak
def test_bad_frames_are_dropped_and_counted(tmp_path):
    """One bad frame of each kind on b's wire (5 us apart from 20 us), the transfer on QP 0
    undisturbed; each frame counted once where it must be dropped."""
    cfg = dict(SMALL, size=64 << 10, inject=list(INJECT_KINDS))
    m = demo.run_demo(cfg, out_dir=str(tmp_path))
    print(demo.summary(m))
    assert m["injected"] == list(INJECT_KINDS)             # all six reached the wire
    c = m["counters"]
    rx, prot, trk = c["b.roce-rx"], c["b.memory-protect"], c["b.psn-tracker"]
    assert rx["icrc"] == 1                                 # wrong ICRC
    assert rx["in_bad"] == 1                               # truncated (the decapsulator)
    # The spare QP: an unknown R_Key (NAK, QP in error), then an address outside the region
    # on the QP now in error (no second NAK); both never placed.
    assert (prot["unknown_rkey"], prot["qp_in_error"], prot["denied"], prot["naks"]) == \
        (1, 1, 2, 1)
    assert trk["no_qp"] == 3                               # unknown QP and the two denied
    assert trk["out_of_window"] == 1 and trk["nacks"] >= 1  # PSN far: NACK 0x0B
    assert trk["place"] == rx["placed"] == (64 << 10) >> 12  # only the real packets
    assert m["complete"] and m["completions"] == m["work_requests"]
    assert m["missing"] == 0 and m["duplicates"] == 0
