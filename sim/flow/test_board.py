"""The board self-test without building it: every board of the table elaborates against
its platform (pins found, PLL reachable), the self-test's bring-up script is recorded,
and the command line refuses what it cannot do with a clear message."""

import json
import zipfile

import pytest
from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.flow import board as board_module, synth
from mrcnic import cli
from mrcnic.boards.program import loader_args, program
from mrcnic.flow.board import (DESIGNS, SELFTEST_BOARDS, BoardSelfTest, default_design,
                               fits_default, selftest_result)
from mrcnic.boards.selftest import SelfTest
from mrcnic.flow.ecp5 import _build_only
from mrcnic.flow.synth import get_board


class Pins(wiring.Component):
    """The SelfTest's pins and nothing else: the pin maps of every board, quickly."""

    def __init__(self, clk_hz, planes=2):
        self.divisor = round(clk_hz / 115200)
        super().__init__({"tx": Out(1), "rx": In(1), "buttons": In(planes), "leds": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.tx.eq(self.rx), self.leds.eq(Cat(self.buttons, self.rx))]
        return m


@pytest.mark.parametrize("board", sorted(SELFTEST_BOARDS))
def test_every_board_has_its_pins(board):
    platform = _build_only(get_board(board))()
    top = BoardSelfTest(board, core=Pins)
    assert platform.prepare(top, name="top") is not None     # every pin found, no clash
    assert top.pll.f_out_mhz == pytest.approx(SELFTEST_BOARDS[board].freq_mhz, rel=0.01)


def test_the_ulx3s_top_elaborates_with_the_selftest():
    platform = _build_only(get_board("ulx3s-85f"))()
    top = BoardSelfTest("ulx3s-85f")
    platform.prepare(top, name="top")
    assert top.selftest.divisor == round(top.pll.f_out_mhz * 1e6 / 115200)
    assert len(top.selftest.ops) > 150


def test_the_selftest_refuses_bad_parameters():
    with pytest.raises(ValueError, match="1, 2 or 4 planes"):
        SelfTest(planes=3)
    with pytest.raises(ValueError, match="report at most"):
        SelfTest(report_hz=1000)                    # a line takes longer than a report
    with pytest.raises(ValueError, match="LFE5U-12F is too small .* needs a 25F"):
        BoardSelfTest("ulx3s-12f")
    with pytest.raises(ValueError, match="no self-test for board 'nope'; boards: ulx3s-25f"):
        BoardSelfTest("nope")


def test_the_command_line_says_what_is_wrong(capsys):
    assert cli.main(["build", "--board", "nonsense"]) == 2
    assert "no self-test for board" in capsys.readouterr().err
    assert cli.main(["build", "--board", "ulx3s-85f", "--block", "skid-buffer",
                     "--program"]) == 2
    assert "are for the self-test" in capsys.readouterr().err
    assert cli.main(["build", "--board", "ulx3s-85f", "--router", "router1"]) == 2
    assert "--router is for a --block" in capsys.readouterr().err
    assert cli.main(["build", "--list-boards"]) == 0
    out = capsys.readouterr().out
    assert "ulx3s-85f  (self-test: nic, or --design spray)" in out
    assert "versa-ecp5  (self-test: spray; the NIC needs an 85F)" in out
    # A board too small for the NIC self-test is refused before any tool runs.
    assert cli.main(["build", "--board", "versa-ecp5", "--design", "nic"]) == 2
    err = capsys.readouterr().err
    assert "LFE5UM-45F cannot hold it" in err and "ecpix5-85f" in err and "spray" in err


@pytest.mark.parametrize("board", ["colorlight-5a-75b-r7", "versa-ecp5"])
def test_the_small_boards_get_the_spray_test(board):
    assert default_design(board) == "spray"
    platform = _build_only(get_board(board))()
    top = BoardSelfTest(board, core=DESIGNS["spray"])
    platform.prepare(top, name="top")
    assert top.pll.f_out_mhz == pytest.approx(40.0, rel=0.01)
    assert top.selftest.divisor == round(top.pll.f_out_mhz * 1e6 / 115200)
    assert len(top.selftest.ops) > 100


def test_the_default_selftest_boards_have_an_85f_or_a_kintex():
    assert sorted(b for b in SELFTEST_BOARDS if fits_default(b)) == [
        "butterstick", "ecp5-5g-evn", "ecpix5-85f", "kc705", "kcu105", "logicbone-85f",
        "orangecrab-r0.2-85f", "ulx3s-85f"]


def test_a_boards_nextpnr_seed_reaches_the_nic_build_only(tmp_path, monkeypatch):
    """The ButterStick's NIC is placed with its own seed (the default's did not route); its
    spray test and every other board's build keep nextpnr's default."""
    plans = {}

    def stop(*args, **kwargs):
        raise StopBuild
    monkeypatch.setattr(board_module, "design_digest", lambda plan: "x")
    monkeypatch.setattr(board_module, "_run", stop)
    monkeypatch.setattr(board_module, "yowasp_env", dict)
    for name, design in (("butterstick", "nic"), ("butterstick", "spray"), ("ulx3s-85f", "nic")):
        with pytest.raises(StopBuild):
            board_module.build_selftest(name, build_dir=tmp_path / name / design, design=design,
                                        reuse=False)
        plans[name, design] = (tmp_path / name / design / "build_top.sh").read_text()
    assert SELFTEST_BOARDS["butterstick"].nic_seed == 2
    assert "--seed 2" in plans["butterstick", "nic"]
    assert "--seed" not in plans["butterstick", "spray"] + plans["ulx3s-85f", "nic"]


class StopBuild(Exception):
    pass


def test_every_ecp5_board_with_room_has_a_selftest():
    from mrcnic.flow.synth import BOARDS
    assert sorted(set(BOARDS) - set(SELFTEST_BOARDS)) == ["ulx3s-12f"]


@pytest.mark.parametrize("board,primitive", [("kcu105", "MMCME3_BASE"),
                                             ("kc705", "MMCME2_BASE")])
def test_xilinx_boards_get_a_build_plan(board, primitive, tmp_path, capsys):
    # a block in its harness (seconds); the self-test's plan differs only in the top
    assert cli.main(["build", "--board", board, "--plan-only", "--block", "skid-buffer",
                     "--build-dir", str(tmp_path)]) == 0
    assert "build_top.sh where Vivado" in capsys.readouterr().out
    with zipfile.ZipFile(tmp_path / "top_plan.zip") as z:
        names = set(z.namelist())
        verilog = z.read("top.v").decode()
    assert {"top.v", "top.xdc", "top.tcl", "build_top.sh"} <= names
    assert primitive in verilog and "BUFG" in verilog


def test_vivado_boards_and_plans_are_refused_where_they_do_not_apply(capsys):
    assert cli.main(["build", "--board", "kc705"]) == 2
    assert "--plan-only writes its build plan" in capsys.readouterr().err
    assert cli.main(["build", "--board", "kcu105", "--block", "skid-buffer"]) == 2
    assert "Vivado" in capsys.readouterr().err
    assert cli.main(["build", "--board", "ulx3s-85f", "--plan-only"]) == 2
    assert "builds here" in capsys.readouterr().err


def test_programming_without_a_loader_or_board_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))       # no openFPGALoader on the path
    with pytest.raises(RuntimeError, match="openFPGALoader not found"):
        program(tmp_path / "top.bit", "ulx3s-85f")


def _fake_loader(tmp_path, monkeypatch):
    """An openFPGALoader on PATH that prints its arguments."""
    loader = tmp_path / "openFPGALoader"
    loader.write_text("#!/bin/sh\necho \"$@\"\n")
    loader.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_each_board_is_programmed_through_its_own_programmer(tmp_path, monkeypatch):
    _fake_loader(tmp_path, monkeypatch)
    bit = tmp_path / "top.bit"
    assert program(bit, "ulx3s-85f").split() == ["-b", "ulx3s", str(bit)]
    assert program(bit, "ecp5-5g-evn", flash=True).split() == ["-b", "ecp5_evn", "-f", str(bit)]
    assert program(bit, "versa-ecp5-5g").split() == ["-c", "ft2232", str(bit)]
    assert program(bit, "icesugar-pro").split()[:2] == ["-c", "cmsisdap"]
    # A named cable overrides the board's programmer, and reaches any board.
    assert program(bit, "butterstick", cable="dirtyJtag").split() == ["-c", "dirtyJtag", str(bit)]


@pytest.mark.parametrize("name", sorted(b for b in SELFTEST_BOARDS if b in synth.BOARDS))
def test_every_ecp5_self_test_board_is_programmed_or_asks_for_a_cable(name):
    try:
        args = loader_args(name)
    except ValueError as e:
        assert "--cable" in str(e) and name in str(e)
        assert name.startswith(("butterstick", "logicbone", "icepi", "supercon"))
    else:
        assert args[0] in ("-b", "-c") and len(args) >= 2
    assert loader_args(name, "ft232") == ("-c", "ft232")


def test_program_without_a_programmer_is_refused_before_the_build(capsys, monkeypatch):
    monkeypatch.setattr(board_module, "build_selftest", _never_called)
    assert cli.main(["build", "--board", "butterstick", "--program"]) == 2
    assert "--cable" in capsys.readouterr().err
    assert cli.main(["build", "--board", "ulx3s-85f", "--cable", "ft232"]) == 2
    assert "--cable is for --program or --flash" in capsys.readouterr().err


def _never_called(*args, **kwargs):
    raise AssertionError("the build ran")


def test_a_finished_build_is_read_from_nextpnrs_report(tmp_path):
    report = {"fmax": {"$glbnet$clk_selftest": {"achieved": 18.2, "constraint": 16.667}},
              "utilization": {"TRELLIS_COMB": {"used": 80000, "available": 83640},
                              "DP16KD": {"used": 41, "available": 208}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    r = selftest_result("ulx3s-85f", tmp_path, 16.667, 16.6667, 12.0)
    assert (r.fmax_mhz, r.met, r.luts, r.brams) == (18.2, True, 80000, 41)
    assert json.loads((tmp_path / "summary.json").read_text())["met"] is True
    report["fmax"]["$glbnet$clk_selftest"]["achieved"] = 16.6
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert not selftest_result("ulx3s-85f", tmp_path, 16.667, 16.6667, 12.0).met
    # The PLL's net under the design's own name: found by its constraint.
    report["fmax"] = {"$glbnet$clk": {"achieved": 22.19, "constraint": 16.6669},
                      "$glbnet$other": {"achieved": 5.0, "constraint": 100.0}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    r = selftest_result("ulx3s-85f", tmp_path, 16.667, 16.6667, 12.0)
    assert (r.fmax_mhz, r.met) == (22.19, True)


def _finished_build(build_dir):
    """What a build script leaves: nextpnr's report (30 MHz against 20) and a bitstream."""
    report = {"fmax": {"$glbnet$clk_selftest": {"achieved": 30.0, "constraint": 20.0}},
              "utilization": {"TRELLIS_COMB": {"used": 100, "available": 83640}}}
    (build_dir / "report.json").write_text(json.dumps(report))
    (build_dir / "top.bit").write_bytes(b"bits")


def test_a_build_of_the_same_design_is_reused_and_another_is_rebuilt(tmp_path, monkeypatch):
    """The build script is replaced by one that writes a report and a bitstream and counts
    its runs: the same design built twice runs it once; another design runs it again."""
    from mrcnic.flow import board
    runs = []

    def fake_run(cmd, *, cwd, env, log):
        runs.append(cmd)
        _finished_build(cwd)

    monkeypatch.setattr(board, "_run", fake_run)
    first = board.build_selftest("ecpix5-85f", build_dir=tmp_path, core=Pins)
    again = board.build_selftest("ecpix5-85f", build_dir=tmp_path, core=Pins)
    assert (len(runs), first.reused, again.reused, again.met) == (1, False, True, True)
    assert "reused" not in json.loads((tmp_path / "summary.json").read_text())
    board.build_selftest("ecpix5-85f", 25.0, build_dir=tmp_path, core=Pins)   # another clock
    assert len(runs) == 2
    board.build_selftest("ecpix5-85f", 25.0, build_dir=tmp_path, reuse=False, core=Pins)
    assert len(runs) == 3


@pytest.mark.synth
def test_the_smallest_boards_bitstream_builds_and_meets_its_clock(tmp_path):
    """`make test` builds the bitstream of the smallest self-test board: the spray test on
    the Colorlight 5A-75B's LFE5U-25F (a few minutes), and checks it against its clock."""
    from mrcnic.flow import board
    result = board.build_selftest("colorlight-5a-75b-r7", build_dir=tmp_path)
    print(f"{result.luts} LUT4 of {result.available['TRELLIS_COMB']}, {result.ffs} FF, "
          f"{result.brams} DP16KD; fmax {result.fmax_mhz:.1f} MHz against "
          f"{result.pll_mhz:.1f}; {result.seconds:.0f} s; critical path {result.critical_path}")
    assert result.selftest == "spray" and result.pll_mhz == pytest.approx(40.0)
    assert result.met and result.fmax_mhz >= 40.0
    assert 0 < result.luts <= result.available["TRELLIS_COMB"]
    assert (tmp_path / "top.bit").stat().st_size > 100_000
    assert json.loads((tmp_path / "summary.json").read_text())["selftest"] == "spray"


def test_yosys_abc9_assertion_is_worked_around_and_other_failures_are_reported(tmp_path,
                                                                              monkeypatch):
    """A Yosys run that dies of abc9's reintegration assertion is run again with the
    hierarchy kept (board.ABC9_WORKAROUND, named in summary.json); any other failure is
    raised with the end of Yosys's log."""
    from mrcnic.flow import board
    from mrcnic.flow.tools import SynthError
    scripts = []

    def fake_run(cmd, *, cwd, env, log, error="ERROR: Assert `" + board.ABC9_BUG + "' failed"):
        script = (cwd / "top.ys").read_text()
        scripts.append(script)
        if board.ABC9_WORKAROUND not in script:
            (cwd / "top.rpt").write_text(f"Executing ABC_OPS_REINTEGRATE pass\n{error}\n")
            raise SynthError("sh build_top.sh failed (exit 1)")
        _finished_build(cwd)

    monkeypatch.setattr(board, "_run", fake_run)
    r = board.build_selftest("ecpix5-85f", build_dir=tmp_path, core=Pins)
    assert len(scripts) == 2 and r.met and r.synth_opts == board.ABC9_WORKAROUND
    assert json.loads((tmp_path / "summary.json").read_text())["synth_opts"] == "-noflatten"
    again = board.build_selftest("ecpix5-85f", build_dir=tmp_path, core=Pins)
    assert again.reused and len(scripts) == 2          # the same design: reused

    monkeypatch.setattr(board, "_run", lambda *a, **k: fake_run(*a, **k, error="ERROR: other"))
    with pytest.raises(SynthError, match="ERROR: other"):
        board.build_selftest("ecpix5-85f", build_dir=tmp_path / "b", core=Pins)
