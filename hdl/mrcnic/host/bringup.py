"""Bring-up over the registers: what software writes after reset so that the NIC's
transmit half sends (and, with :mod:`mrcnic.netsim.fabric` or a real network, is understood).

The functions take the register port as two coroutines, ``read(addr)`` and
``write(addr, value)`` (whole 32-bit words), so the same sequence runs in an Amaranth
testbench, in cocotb and from a board's UART. They find every block by walking the
:class:`~mrcnic.base.csr.bus.CsrBus` directory, as any driver would.

:class:`TxConfig` holds what the transmit half needs: addresses, PMTU, time base,
timeouts, and the EVs: one SRv6 destination (a uSID path) per EV, loaded as explicit raw
EVs into one path-selector profile whose format is four 32-bit fields, so the expanded
EV is the address itself (:func:`srv6_address_profile`).
"""

import math
from dataclasses import dataclass, field

from mrcnic.host.driver import RegisterDriver
from mrcnic.base.csr.bus import BLOCK_TYPES, MAGIC
from mrcnic.base import proto
from mrcnic.base.records import TICK_NS
from mrcnic.model import ev as evm
from mrcnic.base.proto import EvMode

__all__ = ["TxConfig", "RxConfig", "find_blocks", "bring_up_tx", "bring_up_rx",
           "bring_up_selector", "srv6_address_profile", "FRAME_HEADROOM", "GUARD_FRAMES",
           "time_guard_ticks"]


# Bytes of a frame that are not payload, at most (Ethernet, outer IPv6 and SRH, IPv6, UDP,
# BTH, METH, RETH, ICRC, FCS): a bound for frame times, not an exact size.
FRAME_HEADROOM = 200

# The retransmit tracker's time guard, in PMTU frame times of one path's link.
GUARD_FRAMES = 3


def time_guard_ticks(link_gbps, pmtu_log2, frames=GUARD_FRAMES, tick_ns=TICK_NS):
    """The retransmit tracker's ``reorder_time`` for paths whose slowest link runs at
    ``link_gbps``: ``frames`` PMTU frame times on that link, rounded up to whole ticks.

    **Decision**: a packet held behind a frame or two in a loaded port is late by that
    many frame times; three frame times covers that, so a hole counts as lost only when a
    packet sent at least three frame times after it has arrived (TCP RACK's rule), and
    the count guard (``reorder_guard``) can stay at 3 PSNs however many paths there are
    (docs/blocks/mrc-nic.md)."""
    frame_ns = ((1 << pmtu_log2) + FRAME_HEADROOM) * 8 / link_gbps
    return min(max(1, math.ceil(frames * frame_ns / tick_ns)), (1 << 16) - 1)


def _regmaps():
    from mrcnic.rx.ack_generator import ACK_REGS
    from mrcnic.rx.memory_protect import MP_REGS
    from mrcnic.tx.mrc_tx import MRC_TX_REGS
    from mrcnic.tx.path_selector import SELECTOR_REGS
    from mrcnic.rx.psn_tracker import TRACKER_REGS
    from mrcnic.tx.retransmit_tracker import RT_REGS
    from mrcnic.rx.roce_rx import ROCE_RX_REGS
    from mrcnic.tx.roce_tx import TX_REGS
    from mrcnic.tx.srv6_encap import ENCAP_REGS
    from mrcnic.rx.srv6_decap import DECAP_REGS
    from mrcnic.tx.segmenter import SEG_REGS
    return {"mrc-tx": MRC_TX_REGS, "tx-segmenter": SEG_REGS, "path-selector": SELECTOR_REGS,
            "retransmit-tracker": RT_REGS, "roce-tx": TX_REGS, "srv6-encap": ENCAP_REGS,
            "srv6-decap": DECAP_REGS, "roce-rx": ROCE_RX_REGS, "memory-protect": MP_REGS,
            "psn-tracker": TRACKER_REGS, "ack-generator": ACK_REGS}


async def find_blocks(read, write, base=0):
    """Walk the directory at ``base``: {block name: [RegisterDriver, ...]} in bus order. A
    nested bus (type ``csr-bus``) is walked in its place."""
    if await read(base) != MAGIC:
        raise RuntimeError(f"no register directory at 0x{base:x} (magic not 'MRCN')")
    names = {t: n for n, t in BLOCK_TYPES.items()}
    maps = _regmaps()
    blocks = {}
    entry = await read(base + 12)
    while entry:
        kind = (await read(base + entry)) >> 16
        where = await read(base + entry + 4)
        name = names.get(kind)
        if name is None:
            raise RuntimeError(f"unknown block type 0x{kind:04x} at 0x{where:x}")
        if name == "csr-bus":
            for inner, drivers in (await find_blocks(read, write, base + where)).items():
                blocks.setdefault(inner, []).extend(drivers)
        else:
            blocks.setdefault(name, []).append(RegisterDriver(maps[name], read, write,
                                                              base=base + where))
        entry = await read(base + entry + 12)
    return blocks


def srv6_address_profile():
    """An explicit SRv6 EV profile whose raw EV is the 16-byte destination address."""
    fmt = evm.EvFormatProfile(EvMode.SRV6, (32, 32, 32, 32))
    whole = evm.EvField(32, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF)
    return evm.EvProfile(fmt, (whole,) * 4, evm.EXPLICIT)


@dataclass
class TxConfig:
    local_mac: int
    local_ip: int                   # inner source
    peer_mac: int
    peer_ip: int                    # inner destination
    outer_src: int                  # SRv6 source
    evs: list                       # 128-bit SRv6 destination of each EV, index order
    remote_qps: list = field(default_factory=lambda: [0x100])   # per local QP
    pmtu_log2: int = 12
    tick_cycles: int = 256
    timeout_exp: int = 7
    # PSNs past a hole before it counts as lost: 3 with the time guard on; without it,
    # enough to cover the skew between paths (the demo: planes // 2 + 1)
    reorder_guard: int = 3
    # The tracker's time guard in ticks: None derives it from link_gbps
    # (time_guard_ticks), or leaves it off when the link rate is not given; 0: off.
    reorder_time: int = None
    link_gbps: float = None         # rate of one path's slowest link (a plane's links)
    seeds: list = None              # scan-order seed per QP (default: QP index)
    min_active: int = 0
    active: int = None              # EVs below this index active, the rest backups
    probe_interval: int = 0         # cycles between the selector's probes (0: no probes)
    ts_cycles: int = 32             # clock cycles per 128 ns timestamp unit
    tseth: bool = False             # a TSETH on every data packet, an RTT sample per SACK

    def tracker_reorder_time(self):
        """The ``reorder_time`` register the bring-up writes: ``reorder_time`` when given,
        else derived from ``link_gbps`` and the PMTU (:func:`time_guard_ticks`), else 0
        (no time guard: without the link rate there is no frame time to derive it from)."""
        if self.reorder_time is not None:
            return self.reorder_time
        return time_guard_ticks(self.link_gbps, self.pmtu_log2) if self.link_gbps else 0


async def wait_clear(regs, reg="status", name="busy"):
    await regs.wait_clear(reg, name)


async def _selector_profile(regs, p, prof, raws, active):
    fmt = prof.format
    await regs.write_fields("select", profile=p)
    await regs.write_fields("profile_cfg", mode=int(fmt.mode), format_fields=len(fmt.widths),
                            ev_fields=len(prof.fields),
                            generated=int(prof.mode == evm.GENERATED), active=active)
    await regs.write_fields("command", write_profile=1)
    for i, fw in enumerate(fmt.widths):
        f = prof.fields[i]
        await regs.write_fields("select", profile=p, field=i)
        await regs.write_fields("field_widths", format_width=fw, width=f.width)
        for name, v in (("field_init", f.init_val), ("field_mask", f.mask),
                        ("field_min", f.min_val), ("field_max", f.max_val)):
            await regs.write_fields(name, value=v)
        await regs.write_fields("command", write_field=1)
    for e, raw in enumerate(raws):
        await regs.write_fields("select", profile=p, ev=e)
        raw = raw.ljust(32, b"\0")
        for i in range(8):
            await regs.write_fields(f"raw{i}", value=int.from_bytes(raw[4 * i:4 * i + 4],
                                                                    "big"))
        await regs.write_fields("command", write_ev=1)
        await wait_clear(regs)
    err = await regs.read_fields("error")
    if err["bad_config"] or err["bad_index"] or err["busy"]:
        raise RuntimeError(f"path selector refused the EV profile: {err}")


async def _addresses(regs, cfg, qps, wait=False):
    """The local addresses and every QP's context (peer addresses, remote QP) of a block
    with :func:`~mrcnic.base.csr.regs.mac_registers`/
    :func:`~mrcnic.base.csr.regs.ipv6_registers` ``local`` and ``ctx`` (RoceTx, AckGenerator); ``wait``: for ``status.ctx_busy`` after each entry."""
    await regs.write_mac("local", cfg.local_mac)
    await regs.write_ipv6("local", cfg.local_ip)
    for q in range(qps):
        await regs.write_fields("ctx_qp", qp=q)
        await regs.write_mac("ctx", cfg.peer_mac)
        await regs.write_ipv6("ctx", cfg.peer_ip)
        await regs.write_fields("ctx_remote_qp", qpn=cfg.remote_qps[q % len(cfg.remote_qps)])
        await regs.write_fields("control", ctx_write=1)
        if wait:
            await wait_clear(regs, "status", "ctx_busy")


async def bring_up_tx(read, write, cfg, base=0, blocks=None):
    """Configure every transmit block found at ``base`` from ``cfg`` (:class:`TxConfig`).
    Returns the blocks (:func:`find_blocks`)."""
    b = blocks or await find_blocks(read, write, base)
    tx, seg, sel = b["mrc-tx"][0], b["tx-segmenter"][0], b["path-selector"][0]
    trk, roce = b["retransmit-tracker"][0], b["roce-tx"][0]
    qps = (await tx.read_fields("info"))["qps"]
    await wait_clear(seg)
    await wait_clear(trk)
    await tx.write_ipv6("outer_src", cfg.outer_src)
    await tx.write_fields("tick", cycles=cfg.tick_cycles)
    await tx.write_fields("timestamp", tseth=int(cfg.tseth), cycles=cfg.ts_cycles)
    await seg.write_fields("config", pmtu_log2=cfg.pmtu_log2)
    await trk.write_fields("config", pmtu_log2=cfg.pmtu_log2, timeout_exp=cfg.timeout_exp,
                           reorder_guard=cfg.reorder_guard)
    reorder_time = cfg.tracker_reorder_time()
    if reorder_time:
        await trk.write_fields("config2", reorder_time=reorder_time)
    await _addresses(roce, cfg, qps)
    await bring_up_selector(sel, cfg.evs, qps, seeds=cfg.seeds, active=cfg.active,
                            min_active=cfg.min_active, probe_interval=cfg.probe_interval)
    return b


async def bring_up_selector(sel, evs, qps, *, seeds=None, active=None, min_active=0,
                            probe_interval=0):
    """Load path selector ``sel`` (a RegisterDriver): profile 0 holds ``evs`` (the 128-bit
    SRv6 destination of each EV, :func:`srv6_address_profile`), EVs below ``active``
    active (default: all), and QPs 0 .. ``qps`` - 1 use it, with scan seeds ``seeds``
    (default: the QP index)."""
    raws = [a.to_bytes(16, "big") for a in evs]
    # Every EV listed is active (no backups), unless min_active asks for backups.
    await _selector_profile(sel, 0, srv6_address_profile(), raws,
                            active if active is not None else len(raws))
    if min_active:
        await sel.write_fields("ev_min_active", count=min_active)
    if probe_interval:
        await sel.write_fields("probe_interval", cycles=probe_interval)
    for q in range(qps):
        seed = seeds[q] if seeds else q
        await sel.write_fields("select_qp", qp=q)
        await sel.write_fields("qp_cfg", profile=0, seed=seed % len(evs))
        await sel.write_fields("command", write_qp=1)


@dataclass
class RxConfig:
    local_mac: int
    local_ip: int                   # source of control frames
    peer_mac: int
    peer_ip: int                    # destination of control frames
    remote_qps: list = field(default_factory=lambda: [0x100])   # per local QP
    pmtu_log2: int = 12
    regions: list = field(default_factory=list)  # (rkey, base, length, writable, pd)
    sack_every: int = 8
    control_dscp: int = proto.DSCP_CONTROL


async def bring_up_rx(read, write, cfg, base=0, blocks=None):
    """Configure every receive block found at ``base`` from ``cfg`` (:class:`RxConfig`).
    Returns the blocks (:func:`find_blocks`)."""
    from mrcnic.rx.memory_protect import table_op
    b = blocks or await find_blocks(read, write, base)
    gen, trk, mp = b["ack-generator"][0], b["psn-tracker"][0], b["memory-protect"][0]
    for rx in b["roce-rx"]:
        await rx.write_fields("pmtu", bytes=1 << cfg.pmtu_log2)
    await wait_clear(trk)
    await trk.write_fields("config", sack_every=cfg.sack_every)
    for i, region in enumerate(cfg.regions):
        await table_op(mp, ("region", i, *region))
    await gen.write_fields("ipv6", dscp=cfg.control_dscp, ecn=0, hop_limit=64)
    await _addresses(gen, cfg, (await gen.read_fields("info"))["qps"], wait=True)
    await wait_clear(gen, "status", "cfg_pending")
    return b
