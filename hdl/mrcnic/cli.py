"""The ``mrcnic`` command: Verilog export, ECP5 builds and the EV expansion tool."""

import argparse
import sys


def _add_verilog(sub):
    p = sub.add_parser("verilog", help="export one block as a Verilog file",
                       description="Export a block as Verilog; the module name encodes the "
                                   "parameters. Ports: <stream>_tdata/_tkeep/..., "
                                   "<stream>_<field>/_valid/_ready, s_axil_*.")
    p.add_argument("block", nargs="?", help="block name (see --list)")
    p.add_argument("--list", action="store_true", help="list the blocks and their parameters")
    p.add_argument("--data-width", type=int, help="AXI-Stream data width in bits")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="block parameter (repeatable)")
    p.add_argument("-o", "--output", help="output file (default: <module>.v)")
    p.set_defaults(func=_run_verilog)


def _run_verilog(args):
    from . import registry
    if args.list or not args.block:
        for block in registry.blocks().values():
            params = ", ".join(f"{k}={v!r}" for k, v in block.defaults.items())
            print(f"{block.name:20} {block.summary}")
            print(f"{'':20} parameters: {params}")
        return 0
    from .export import export_verilog
    params = registry.parse_params(args.block, args.param, args.data_width)
    path, module = export_verilog(args.block, params, args.output)
    print(f"wrote {path} (module {module})")
    return 0


def _add_build(sub):
    p = sub.add_parser("build", help="synthesize a block for an ECP5 board (open toolchain)",
                       description="Place and route one block with registered ports on an "
                                   "ECP5 board through YoWASP Yosys and nextpnr; print fmax "
                                   "and LUT/FF/BRAM use.")
    p.add_argument("--board", required=True, help="board name (see --list-boards)")
    p.add_argument("--block", default="skid-buffer", help="block name")
    p.add_argument("--data-width", type=int)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--freq", type=float, default=100.0, help="clock constraint in MHz")
    p.add_argument("--build-dir", default=None)
    p.add_argument("--list-boards", action="store_true")
    p.set_defaults(func=_run_build)


def _run_build(args):
    from . import synth
    if args.list_boards:
        for name in synth.BOARDS:
            print(name)
        return 0
    from . import registry
    params = registry.parse_params(args.block, args.param, args.data_width)
    result = synth.build_block(args.board, args.block, params, freq_mhz=args.freq,
                              build_dir=args.build_dir)
    print(result.summary())
    return 0 if result.met else 1


def _add_ev_expand(sub):
    from .model import ev
    ev.add_cli(sub)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mrcnic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_verilog(sub)
    _add_build(sub)
    _add_ev_expand(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError) as e:
        print(f"mrcnic {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
