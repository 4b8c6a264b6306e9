"""Verilog export: port names, module names, lint, the block catalogue and the CLI."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.lib import data

from mrcnic.flow import registry
from mrcnic.cli import main as cli
from mrcnic.flow.export import export_verilog, flat_ports, lint, verilog_text
from mrcnic.base.stream import MetaSkidBuffer


def module_ports(text, module):
    header = re.search(rf"module {module}\((.*?)\);", text, re.S).group(1)
    return {p.strip() for p in header.split(",")}


@pytest.mark.parametrize("width", [64, 512, 2048])
def test_skid_buffer_exports_lint_clean_with_axis_names(tmp_path, width):
    path, module = export_verilog("skid-buffer", {"data_width": width, "user_width": 1},
                                  tmp_path / "skid.v")
    assert module == f"mrcnic_skid_buffer_data_width_{width}_user_width_1"
    text = path.read_text()
    ports = module_ports(text, module)
    expected = {f"{d}_axis_{s}" for d in "sm" for s in
                ("tdata", "tkeep", "tlast", "tuser", "tvalid", "tready")} | {"clk", "rst"}
    assert ports == expected
    assert re.search(rf"input \[{width - 1}:0\] s_axis_tdata;", text)
    assert re.search(rf"output \[{width // 8 - 1}:0\] m_axis_tkeep;", text)
    lint(path, module)


# Every block (at 64 bits where it has a data width; the selector and the retransmit tracker
# at their small configurations, whose export takes seconds where the defaults take half a
# minute), the inserter at 256 bits too; the halves and the whole NIC in make soak (their
# export takes a minute or more).
SMALL = {"path-selector": ["qps=8", "ev_count=32", "planes=4", "profiles=2", "ev_bits=32"],
         "retransmit-tracker": ["qps=8", "outstanding=128"]}


def _width(name):
    return 64 if "data_width" in registry.get(name).defaults else None


LINT_CASES = [(name, _width(name)) for name in registry.blocks()
              if name not in ("mrc-rx", "mrc-tx", "mrc-nic")] + [("srv6-encap", 256)] + [
    pytest.param(name, 64, marks=pytest.mark.soak) for name in ("mrc-rx", "mrc-tx", "mrc-nic")]


@pytest.mark.parametrize("block,width", LINT_CASES)
def test_every_block_lints_clean(tmp_path, block, width):
    """verilator -Wall (the project's waivers) finds nothing in the exported Verilog."""
    path, module = export_verilog(block, registry.parse_params(block, SMALL.get(block, []),
                                                               width),
                                  tmp_path / f"{block}.v")
    lint(path, module)


def test_metadata_stream_gets_one_port_per_field(tmp_path):
    layout = data.StructLayout({"qp": 6, "psn": 24,
                                "flags": data.StructLayout({"rtx": 1, "ack_req": 1})})
    dut = MetaSkidBuffer(layout)
    names = {n for n, _, _ in flat_ports(dut)}
    assert names == {"i_qp", "i_psn", "i_flags_rtx", "i_flags_ack_req", "i_valid", "i_ready",
                     "o_qp", "o_psn", "o_flags_rtx", "o_flags_ack_req", "o_valid", "o_ready"}
    text = verilog_text(MetaSkidBuffer(layout), "meta_skid")
    assert module_ports(text, "meta_skid") == names | {"clk", "rst"}
    assert re.search(r"input \[23:0\] i_psn;", text)
    path = tmp_path / "meta_skid.v"
    path.write_text(text)
    lint(path, "meta_skid")


def test_lint_catches_a_real_warning(tmp_path):
    """The lint step is not a rubber stamp: a multiply-driven wire fails it."""
    path = tmp_path / "bad.v"
    path.write_text("module bad(input clk, input a, input b, output reg y);\n"
                    "  always @(posedge clk) y <= a;\n  always @* y = b;\nendmodule\n")
    with pytest.raises(RuntimeError, match="%(Warning|Error)-"):
        lint(path, "bad")


def test_registry_errors_are_precise():
    with pytest.raises(ValueError, match="unknown block 'nope'; blocks: .*skid-buffer"):
        registry.get("nope")
    with pytest.raises(ValueError, match="has no parameter 'depth'"):
        registry.parse_params("skid-buffer", ["depth=3"])
    with pytest.raises(ValueError, match="expected int"):
        registry.parse_params("skid-buffer", ["data_width=wide"])
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        registry.parse_params("skid-buffer", ["data_width"])
    assert registry.parse_params("skid-buffer", ["user_width=0x4"], 128) == \
        {"data_width": 128, "user_width": 4}


def test_cli_list_and_export(tmp_path, capsys):
    assert cli(["verilog", "--list"]) == 0
    assert "skid-buffer" in capsys.readouterr().out
    out = tmp_path / "s.v"
    assert cli(["verilog", "skid-buffer", "--data-width", "128", "-o", str(out)]) == 0
    assert "module mrcnic_skid_buffer_data_width_128_user_width_1(" in out.read_text()


def test_cli_refuses_bad_parameters(capsys):
    assert cli(["verilog", "skid-buffer", "--data-width", "60"]) == 2
    assert "whole number of bytes" in capsys.readouterr().err
    assert cli(["verilog", "skid-buffer", "--param", "bogus=1"]) == 2
    assert "has no parameter 'bogus'" in capsys.readouterr().err


def test_ev_expand_reproduces_the_spec_example(capsys):
    assert cli(["ev-expand", "--format-widths", "16,16",
                "--field", "width=16,init=0x1000,min=0,max=0,mask=0x0f0f",
                "--field", "width=16,init=0x2000,min=0,max=0,mask=0x0f0f",
                "--ev", "0x3312"]) == 0
    assert capsys.readouterr().out.strip() == "0x13032102" + "0" * 56


def test_pip_install_gives_a_working_command(tmp_path):
    """A plain (non-editable) install carries the package, its board tops (mrcnic.boards, from
    the top-level boards/ folder) and the `mrcnic` entry point."""
    from testkit import ROOT as root
    wheel_dir, prefix = tmp_path / "wheel", tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheel_dir), str(root)], check=True,
                   cwd=tmp_path)
    wheel = next(wheel_dir.glob("mrcnic-*.whl"))
    # --target never touches the running environment (a --prefix install would uninstall
    # the work tree's editable install first).
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(prefix), str(wheel)], check=True)
    site = prefix
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    script = prefix / "bin" / "mrcnic"
    proc = subprocess.run([sys.executable, str(script), "verilog", "--list"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "skid-buffer" in proc.stdout
    for args, expect in ((["build", "--list-boards"], "ulx3s-85f"),
                         (["demo", "--help"], "--planes")):
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0 and expect in proc.stdout, (args, proc.stderr)
    # The installed copy, not the work tree, answered.
    check = subprocess.run([sys.executable, "-c", "import mrcnic; print(mrcnic.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(site) in check.stdout


def test_the_demo_says_what_it_needs_before_it_builds(monkeypatch, capsys):
    """Here everything `mrcnic demo` needs is installed; without one of its packages (the
    "sim" extra) it stops before exporting anything and names the package and the extra."""
    from mrcnic import cli as cli_module
    assert cli_module.demo_missing() == ([], [])
    monkeypatch.setitem(cli_module.DEMO_MODULES, "no_such_module.sub", "no-such-package")
    assert cli(["demo", "--out", "never-made"]) == 2
    err = capsys.readouterr().err
    assert "no-such-package" in err and "mrcnic[sim]" in err and "nothing was run" in err
    assert not Path("never-made").exists()
