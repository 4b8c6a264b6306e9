"""Transmit path selection (spec §3, §4): :class:`PathSelector` (``path-selector``).

For every packet of every QP the block picks an entropy value (EV, a path): the next EV in
the QP's pseudo-random scan order that is GOOD and whose plane port is enabled and has
credit. It applies the EV state transitions of §4 to path feedback, reports state changes
as events, sends probes on ASSUMED_BAD EVs, and expands raw EVs (§3) in gateware. It sits in
:class:`~mrcnic.tx.mrc_tx.MrcTx` between the send gate, which asks for an EV per packet, and
the frame builders, which take the expanded EV it returns.

Operation, decisions and measured figures: docs/blocks/path-selector.md.
"""

import enum
from types import SimpleNamespace

from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.records import (
    QP_INDEX_BITS, REQUEST, probe_layout, response_layout, EV_FEEDBACK, EV_INDEX_BITS,
    PROBE_KINDS, FeedbackKind)
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.gates import first_set_of, take as _take
from mrcnic.base.proto import MAX_FIELD_WIDTH, MAX_FORMAT_FIELDS
from mrcnic.base.proto import EvMode, EvState
from mrcnic.base.rules import EVENT_MASK_DEFAULT, RESEED_MULT
from mrcnic.base.stream import meta_stream

__all__ = ["PathSelector", "EVENT", "SELECTOR_REGS", "COUNTERS", "Cmd", "PROFILES_DEFAULT",
           "EV_BITS_CHOICES", "EVENT_MASK_DEFAULT", "RESEED_MULT", "RSP_FIFO_DEPTH",
           "EVENT_FIFO_DEPTH", "PROBE_FIFO_DEPTH"]

PROFILES_DEFAULT = 4
EV_BITS_CHOICES = (32, 128, 256)
PLANE_CHOICES = (1, 2, 4, 8)
RSP_FIFO_DEPTH = 8
EVENT_FIFO_DEPTH = 16
PROBE_FIFO_DEPTH = 4
IN_FLIGHT = 4                  # S1..S4 may each hold a decision the FIFO must take
DROP_BITS = 16
# Decision: the scan order of a QP puts EV (j XOR seed) at position j. With EV e on plane
# e mod planes (planes a power of two), consecutive positions visit every plane in turn.
SCAN_ORDER = "xor"
# Decision: SKIP lasts until a QP of the profile ends a rotation (its pointer wraps).
SKIP_CLEARED_BY = "wrap of any QP of the profile"
# Decision: the healthy backup of the failed EV's plane with the lowest index is promoted.
BACKUP_RULE = "lowest-index healthy backup of the same plane"
# Decision: a change of this NIC's live ports (enabled and up) is announced once to the peer
# of every QP, on the QP's profile's first usable EV; a QP with none is passed over.
ANNOUNCE_RULE = "one round over the QPs per change, first usable EV, none: passed over"


def at_or_after(ptr, n):
    """Thermometer: bit j set when ``ptr <= j`` (the last bit always)."""
    return Cat(*(Const(1, 1) if j == n - 1 else ptr <= j for j in range(n)))








EVENT = data.StructLayout({
    "profile": 4,
    "ev":      EV_INDEX_BITS,
    "state":   2,
    "dropped": DROP_BITS,         # events lost for lack of room just before this one
})


class Cmd(enum.IntEnum):
    """What occupies the F2 stage."""
    FEEDBACK = 0
    FORCE = 1
    LOAD = 2
    CLEAR = 3


COUNTERS = ["requests", "decisions", "no_path", "revoked", "bad_request", "wraps",
            "feedback", "bad_feedback", "stale_probe", "transitions", "promotions",
            "no_backup", "events", "events_dropped", "probes", "refused", "peer_updates",
            "announcements"]

_COUNTER_DESC = {
    "requests": "Requests accepted",
    "decisions": "Responses with an EV",
    "no_path": "Requests of a QP with no usable EV (response none)",
    "revoked": "Decisions revoked at S4: the EV stopped being usable (response none)",
    "bad_request": "Requests naming a QP >= qps (response none)",
    "wraps": "Rotations ended (scan pointer wraps)",
    "feedback": "Feedback records accepted",
    "bad_feedback": "Feedback naming a QP, EV or kind out of range, or an unloaded EV",
    "stale_probe": "Probe answers with no matching outstanding probe",
    "transitions": "EV state changes by feedback or force",
    "promotions": "Backup EVs promoted to keep ev_min_active",
    "no_backup": "ev_min_active not kept: no healthy backup on the plane",
    "events": "Events queued",
    "events_dropped": "Events dropped, the event FIFO full",
    "probes": "Probes sent",
    "refused": "Configuration commands refused",
    "peer_updates": "Peer port status updates applied (PEER_PORTS feedback)",
    "announcements": "Port status records sent (this NIC's ports, one per QP per change)",
}

SELECTOR_REGS = RegisterMap("path_selector", [
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    Register("status", [
        Field("busy", 1, "ro", desc="The expansion engine or a command runs; commands are "
                                    "refused"),
        Field("generated", 9, "ro", desc="EVs the last generation wrote"),
    ]),
    Register("error", [
        Field("bad_config", 1, "w1c", desc="A profile, field or raw EV broke a rule of "
                                           "spec §3; refused"),
        Field("bad_index", 1, "w1c", desc="A command named a profile, field, EV or QP out "
                                          "of range; refused"),
        Field("busy", 1, "w1c", desc="A command came while status.busy; refused"),
        Field("stalled", 1, "w1c", desc="A request found no usable EV (see stalled.qp)"),
    ]),
    Register("stalled", [Field("qp", 16, "ro", desc="The last QP that found no usable EV")]),
    Register("ports", [Field("admin", 8, "rw", reset=0xFF,
                             desc="Port administratively enabled, bit = plane")]),
    Register("announce", [Field("enable", 1, "rw", reset=1,
                                desc="Tell the peers of every QP when a port goes down or "
                                     "up (port status records on probe)")]),
    Register("peer_ports", [Field("ports", 8, "ro",
                                  desc="Ports up at the peer of select.profile, bit = plane "
                                       "(PEER_PORTS feedback; all after reset or a clear)")]),
    Register("ev_min_active", [Field("count", 9, "rw", desc="Healthy active EVs a profile "
                                                            "keeps by promoting backups")]),
    Register("probe_interval", [Field("cycles", 24, "rw", desc="Cycles between probes; 0: "
                                                              "no probes")]),
    Register("reseed", [Field("stride", 8, "rw", reset=1,
                              desc="Odd: seed' = 5 seed + stride at each rotation (low "
                                   "log2(planes) bits kept); 0: never reseed")]),
    Register("select", [
        Field("profile", 4, "rw", desc="Profile the next command acts on"),
        Field("field", 4, "rw", desc="Format/EV field of write_field"),
        Field("ev", 8, "rw", desc="EV index of write_ev, force_state, ev_status"),
    ]),
    Register("select_qp", [Field("qp", 16, "rw", desc="QP of write_qp")]),
    Register("profile_cfg", [
        Field("mode", 3, "rw", reset=EvMode.STEV, desc="EvMode: 1 STEV, 2 UDP, 3 SRV6, "
                                                       "4 SRV6_SRH"),
        Field("format_fields", 5, "rw", reset=1, desc="Format fields, 1..16"),
        Field("ev_fields", 5, "rw", desc="EV profile fields, 0..format_fields"),
        Field("generated", 1, "rw", desc="1: GENERATED (min..max), 0: EXPLICIT"),
        Field("active", 9, "rw", reset=256, desc="EVs loaded below this index are active, "
                                                 "the others backups"),
        Field("event_mask", 4, "rw", reset=EVENT_MASK_DEFAULT,
              desc="Bit s: report changes to EvState s"),
    ]),
    Register("field_widths", [
        Field("format_width", 6, "rw", reset=32, desc="Format field width, 1..32"),
        Field("width", 6, "rw", desc="EV field width, 1..32 (0: none)"),
    ]),
    Register("field_init", [Field("value", 32, "rw", desc="EV field init_val")]),
    Register("field_mask", [Field("value", 32, "rw", desc="EV field mask")]),
    Register("field_min", [Field("value", 32, "rw", desc="EV field min_val")]),
    Register("field_max", [Field("value", 32, "rw", desc="EV field max_val")]),
    *[Register(f"raw{i}", [Field("value", 32, "rw")],
               desc=f"Raw EV bytes {4 * i}..{4 * i + 3}, byte {4 * i} in bits 31:24")
      for i in range(8)],
    Register("qp_cfg", [
        Field("profile", 4, "rw", desc="Profile of the QP"),
        Field("seed", 8, "rw", desc="Scan-order seed, < ev_count"),
    ]),
    Register("force", [Field("state", 2, "rw", desc="State force_state sets: GOOD 0 or "
                                                    "DENIED 3")]),
    Register("command", [
        Field("write_profile", 1, "w1p", desc="select.profile takes profile_cfg"),
        Field("write_field", 1, "w1p", desc="Field select.field of select.profile takes "
                                            "field_*"),
        Field("write_ev", 1, "w1p", desc="Expand raw0..7 into EV select.ev (EXPLICIT)"),
        Field("generate", 1, "w1p", desc="Clear select.profile and generate its EVs "
                                         "(GENERATED)"),
        Field("write_qp", 1, "w1p", desc="select_qp.qp takes qp_cfg; pointer 0, probe "
                                         "dropped"),
        Field("force_state", 1, "w1p", desc="EV select.ev of select.profile takes "
                                            "force.state"),
        Field("clear_profile", 1, "w1p", desc="Unload every EV of select.profile"),
    ]),
    Register("ev_status", [
        Field("state", 2, "ro", desc="State of EV select.ev of select.profile"),
        Field("active", 1, "ro"),
        Field("loaded", 1, "ro"),
        Field("healthy", 9, "ro", desc="Healthy active EVs of select.profile"),
    ]),
    *[Register(name, [Field("count", 32, "ro")], desc=_COUNTER_DESC[name])
      for name in COUNTERS],
])


class PathSelector(wiring.Component):
    """The transmit path selector: one EV (a path) per packet, path feedback, probes.

    For each request (QP, PSN, rtx, the EV to avoid) the selector answers with the next EV
    in the QP's scan order (position ``j`` holds EV ``j XOR seed``, :data:`SCAN_ORDER`) that
    is *usable*: loaded, active, GOOD, on a port (plane ``ev mod planes``) that is enabled
    (``ports.admin``), up (``port_up``), has credit (``credit``) and is up at the profile's
    peer; a retransmission never gets its ``avoid`` EV. With no usable EV, or a QP not below
    ``qps``, the response has ``none`` = 1 and the QP stalls. EV state (GOOD, SKIP,
    ASSUMED_BAD, DENIED) is kept per EV profile; ``fb`` records change it by the transitions
    of spec §4, a PEER_PORTS record sets the profile's peer port mask, and state changes in
    the profile's ``event_mask`` are reported on ``event``. The block probes ASSUMED_BAD EVs
    every ``probe_interval`` cycles, announces changes of its own live ports to the peer of
    every QP (``probe`` with ``announce`` = 1), keeps ``ev_min_active`` healthy EVs by
    promoting backups (:data:`BACKUP_RULE`), and expands raw EVs written through the
    registers (spec §3) into a block RAM, off the packet path.

    Parameters
    ----------
    qps : int
        Queue pairs, 1 .. 65536. Default 64.
    ev_count : int
        EV slots per profile, a power of two 2 .. 256. Default 256.
    planes : int
        Planes (ports), one of 1, 2, 4, 8 (:data:`PLANE_CHOICES`), at most ``ev_count``.
        Default 8.
    profiles : int
        EV profiles, 1 .. 16. Default 4 (:data:`PROFILES_DEFAULT`).
    ev_bits : int
        Bits of the expanded EV carried, one of 32 (STEV, UDP), 128 (SRv6) or 256
        (SRv6 + SRH) (:data:`EV_BITS_CHOICES`). Default 256.
    counter_width : int
        Keyword only. Width of the event counters: 32, 16 or 0 (no counters; they read 0,
        see :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.
    formal : bool
        Keyword only. Add the safety assertions of the formal proof (no response carries an
        EV that is DENIED, ASSUMED_BAD, avoided, or on a port down, disabled, without credit
        or down at the peer) and let every EV start in any state. Default False.

    Attributes
    ----------
    req : stream of :data:`~mrcnic.base.records.REQUEST`, in
        One request per packet: ``qp``, ``psn``, ``rtx``, ``avoid``. Ready is a function of
        the response FIFO's level only; an accepted request never stalls.
    rsp : stream of :func:`~mrcnic.base.records.response_layout` (``ev_bits``), out
        The request's fields, then ``none``, ``ev``, ``plane``, ``entropy`` (what the packet
        carries and the peer echoes) and ``expanded`` (first wire bit most significant).
    fb : stream of :data:`~mrcnic.base.records.EV_FEEDBACK`, in
        Path feedback (SACK M, NACK reasons, timeouts, probe answers, PEER_PORTS). Out of
        range or for an unloaded EV: ignored and counted (``bad_feedback``).
    event : stream of :data:`EVENT`, out
        EV state changes: ``profile``, ``ev``, ``state``, and ``dropped``, the events lost
        for lack of room just before this one.
    probe : stream of :func:`~mrcnic.base.records.probe_layout` (``ev_bits``), out
        Probes to send (QP, EV, plane, entropy, expanded EV), and with ``announce`` = 1 the
        port status updates for the peer of each QP (``ports``: this NIC's live ports).
    port_up : Signal(planes), in
        Per plane: the port's link is up.
    credit : Signal(planes), in
        Per plane: the port can take another frame.
    s_axil : AXI4-Lite, in
        Registers, :data:`SELECTOR_REGS`: configuration, profiles, raw EVs, commands,
        counters.

    Latency
    -------
    :attr:`latency` = 6 cycles: a request accepted in cycle t is written into the response
    FIFO at the end of cycle t+4 (stages S1..S4) and is on ``rsp`` from cycle t+6. A
    feedback record accepted in cycle f changes the state that decisions see from cycle
    f+3; decisions already made are checked again at S4, so no EV is written into the
    response FIFO in a cycle in which it is not usable.

    Throughput
    ----------
    One request per cycle, any mix of QPs, one QP back to back included, without a bubble;
    at the same time one feedback record per cycle, minus one cycle per controller command.
    The expansion engine takes about ``ev_bits`` + 3 per format field + 5 cycles per EV.

    Raises
    ------
    ValueError
        If ``qps`` is not an int in 1 .. 65536; ``ev_count`` is not a power of two in
        2 .. 256; ``planes`` is not one of 1, 2, 4, 8 or is above ``ev_count``;
        ``profiles`` is not an int in 1 .. 16; ``ev_bits`` is not one of 32, 128, 256; or
        ``counter_width`` is not 0, 16 or 32.
    """

    latency = 6

    def __init__(self, qps=64, ev_count=256, planes=8, profiles=PROFILES_DEFAULT,
                 ev_bits=256, *, counter_width=32, formal=False, _skip_recheck=False):
        self.counter_width = check_counter_width(counter_width)
        if not (isinstance(qps, int) and 1 <= qps <= 1 << QP_INDEX_BITS):
            raise ValueError(f"qps must be 1 .. {1 << QP_INDEX_BITS}, not {qps!r}")
        if not (isinstance(ev_count, int) and 2 <= ev_count <= 1 << EV_INDEX_BITS
                and ev_count & (ev_count - 1) == 0):
            raise ValueError(f"ev_count must be a power of two 2 .. {1 << EV_INDEX_BITS}, "
                             f"not {ev_count!r}")
        if planes not in PLANE_CHOICES or planes > ev_count:
            raise ValueError(f"planes must be one of {PLANE_CHOICES} and at most ev_count "
                             f"({ev_count}), not {planes!r}")
        if not (isinstance(profiles, int) and 1 <= profiles <= 16):
            raise ValueError(f"profiles must be 1 .. 16, not {profiles!r}")
        if ev_bits not in EV_BITS_CHOICES:
            raise ValueError(f"ev_bits must be one of {EV_BITS_CHOICES}, not {ev_bits!r}")
        self.qps, self.ev_count, self.planes = qps, ev_count, planes
        self.profiles, self.ev_bits, self.formal = profiles, ev_bits, formal
        self._skip_recheck = _skip_recheck      # formal test only: must make the proof fail
        self.rsp_layout = response_layout(ev_bits)
        self.probe_layout = probe_layout(ev_bits)
        super().__init__({
            "req": In(meta_stream(REQUEST)),
            "rsp": Out(meta_stream(self.rsp_layout)),
            "fb": In(meta_stream(EV_FEEDBACK)),
            "event": Out(meta_stream(EVENT)),
            "probe": Out(meta_stream(self.probe_layout)),
            "port_up": In(planes),
            "credit": In(planes),
            "s_axil": In(AxiLiteSignature(SELECTOR_REGS.addr_width)),
        })

    def elaborate(self, platform):
        # One method per section, in order: each takes what the earlier ones left in
        # ``v`` (a namespace) and leaves there what the later ones use.
        m = Module()
        v = SimpleNamespace()
        self._setup(m, v)
        self._state(m, v)
        self._selection(m, v)
        self._feedback_f1(m, v)
        self._feedback_f2(m, v)
        self._feedback_next(m, v)
        self._probes(m, v)
        self._commands(m, v)
        self._expansion(m, v)
        self._counters(m, v)
        return m

    def _setup(self, m, v):
        """Parameters derived, the register block, the EV state constants."""
        qps, N, P, NP = self.qps, self.ev_count, self.planes, self.profiles
        EVB = self.ev_bits
        nb = ceil_log2(N)
        pb = ceil_log2(P)
        qb = max(1, ceil_log2(qps))
        prb = max(1, ceil_log2(NP))
        total = NP * N

        m.submodules.csr = csr = CsrBlock(SELECTOR_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        sel = f["select"]

        GOOD, SKIP, BAD, DENIED = (Const(s, 2) for s in
                                   (EvState.GOOD, EvState.SKIP, EvState.ASSUMED_BAD,
                                    EvState.DENIED))

        vars(v).update(qps=qps, N=N, P=P, NP=NP, EVB=EVB, nb=nb, pb=pb, qb=qb, prb=prb,
            total=total, f=f, sel=sel, GOOD=GOOD, SKIP=SKIP, BAD=BAD, DENIED=DENIED)

    def _state(self, m, v):
        """State: the per-QP and per-EV tables, the expanded EVs."""
        (qps, N, P, NP, EVB, nb, prb, total, f, GOOD, SKIP) = _take(v, """qps N P NP EVB nb prb
            total f GOOD SKIP""")
        # --- State ---------------------------------------------------------------------------
        # One register per EV and per QP (a wide register written at a variable index
        # makes Yosys emit a multiplexer per index over the whole register: quadratic);
        # st, loaded, active and the qp_* arrays below are their concatenations, for reads.
        st_l = [Signal(2, name=f"ev_state_{i}") for i in range(total)]
        ld_l = [Signal(name=f"ev_loaded_{i}") for i in range(total)]
        ac_l = [Signal(name=f"ev_active_{i}") for i in range(total)]
        st = Signal(data.ArrayLayout(2, total), name="ev_state")
        loaded = Signal(total, name="ev_loaded")
        active = Signal(total, name="ev_active")
        m.d.comb += [st.eq(Cat(*st_l)), loaded.eq(Cat(*ld_l)), active.eq(Cat(*ac_l))]
        healthy_cnt = Signal(data.ArrayLayout(9, NP), name="healthy_cnt")
        HDR = data.StructLayout({"mode": 3, "nfmt": 5, "nev": 5, "gen": 1, "active": 9,
                                 "mask": 4})
        hdr = Signal(data.ArrayLayout(HDR, NP), name="profile_hdr")
        qp_profile_l = [Signal(prb, name=f"qp_profile_{q}") for q in range(qps)]
        qp_seed_l = [Signal(max(nb, 1), name=f"qp_seed_{q}") for q in range(qps)]
        qp_ptr_l = [Signal(max(nb, 1), name=f"qp_ptr_{q}") for q in range(qps)]
        qp_profile = Signal(data.ArrayLayout(prb, qps), name="qp_profile")
        qp_seed = Signal(data.ArrayLayout(max(nb, 1), qps), name="qp_seed")
        qp_ptr = Signal(data.ArrayLayout(max(nb, 1), qps), name="qp_ptr")
        m.d.comb += [qp_profile.eq(Cat(*qp_profile_l)), qp_seed.eq(Cat(*qp_seed_l)),
                     qp_ptr.eq(Cat(*qp_ptr_l))]

        probe_valid = Signal(qps, name="probe_valid")
        # Per profile, the peer's ports (PEER_PORTS feedback; all up after reset or a CLEAR).
        peer_ports = [Signal(P, init=(1 << P) - 1, name=f"peer_ports_{p}") for p in range(NP)]

        port_ok = Signal(P, name="port_ok")
        # Enabled and up: worth a probe, and what announcements tell the peers. All up at
        # reset, as the previous value the announcement round compares with.
        port_live = Signal(P, name="port_live", init=(1 << P) - 1)
        m.d.sync += [port_ok.eq(f["ports"]["admin"][:P] & self.port_up & self.credit),
                     port_live.eq(f["ports"]["admin"][:P] & self.port_up)]

        def idx_of(profile, ev):
            return Cat(ev[:nb], profile[:prb]) if NP > 1 else ev[:nb]

        def healthy_state(s):
            return (s == GOOD) | (s == SKIP)

        # Ports usable by profile p: enabled, up and with credit here, up at the peer.
        prof_ok = [Signal(P, name=f"prof_ports_ok_{p}") for p in range(NP)]
        for p in range(NP):
            m.d.comb += prof_ok[p].eq(port_ok & peer_ports[p])

        def usable_vec(p):
            return Cat(*(loaded[p * N + e] & active[p * N + e] & (st[p * N + e] == GOOD) &
                         prof_ok[p][e % P] for e in range(N)))

        def by_profile(prof, values, name):
            """``values[prof]``, one Switch over the profiles."""
            out = Signal(len(values[0]), name=name)
            with m.Switch(prof):
                for p in range(NP):
                    with m.Case(p):
                        m.d.comb += out.eq(values[p])
            return out

        usable = [Signal(N, name=f"usable{p}") for p in range(NP)]
        for p in range(NP):
            m.d.comb += usable[p].eq(usable_vec(p))

        # Expanded EVs: written by the engine, read by S4 and by the probe generator.
        m.submodules.evmem = evmem = Memory(shape=EVB, depth=total, init=[])
        ev_w = evmem.write_port()
        ev_r = evmem.read_port()
        ev_rp = evmem.read_port()

        def entropy(mode, expanded, ev):
            # SRv6 modes: proto.srv6_entropy, the index over SRV6_ENTROPY_BASE in each half.
            half = Cat(ev, Const(0, 16 - len(ev))) | proto.SRV6_ENTROPY_BASE
            return Mux(mode == EvMode.STEV, expanded[EVB - 32:],
                       Mux(mode == EvMode.UDP, expanded[EVB - 16:], Cat(half, half)))

        vars(v).update(st_l=st_l, ld_l=ld_l, ac_l=ac_l, st=st, loaded=loaded, active=active,
            healthy_cnt=healthy_cnt, HDR=HDR, hdr=hdr, qp_profile_l=qp_profile_l,
            qp_seed_l=qp_seed_l, qp_ptr_l=qp_ptr_l, qp_profile=qp_profile, qp_seed=qp_seed,
            qp_ptr=qp_ptr, probe_valid=probe_valid, peer_ports=peer_ports, port_ok=port_ok,
            port_live=port_live, idx_of=idx_of, healthy_state=healthy_state, prof_ok=prof_ok, p=p,
            by_profile=by_profile, usable=usable, ev_w=ev_w, ev_r=ev_r, ev_rp=ev_rp,
            entropy=entropy)

    def _selection(self, m, v):
        """The selection pipeline: one request's decision, stage by stage."""
        (qps, N, P, nb, pb, qb, prb, f, GOOD, BAD, DENIED, st, loaded, active, HDR, hdr, qp_seed_l,
            qp_ptr_l, qp_profile, qp_seed, qp_ptr, peer_ports, port_ok, idx_of, prof_ok,
            by_profile, usable, ev_r, entropy) = _take(v, """qps N P nb pb qb prb f GOOD BAD DENIED
            st loaded active HDR hdr qp_seed_l qp_ptr_l qp_profile qp_seed qp_ptr peer_ports
            port_ok idx_of prof_ok by_profile usable ev_r entropy""")
        # --- Selection pipeline --------------------------------------------------------------
        rsp_fifo = SyncFIFOBuffered(width=self.rsp_layout.size, depth=RSP_FIFO_DEPTH)
        m.submodules.rsp_fifo = rsp_fifo
        m.d.comb += [self.rsp.payload.eq(rsp_fifo.r_data), self.rsp.valid.eq(rsp_fifo.r_rdy),
                     rsp_fifo.r_en.eq(self.rsp.ready)]
        m.d.comb += self.req.ready.eq(rsp_fifo.level <= RSP_FIFO_DEPTH - IN_FLIGHT - 1)
        take = self.req.valid & self.req.ready

        s1_valid = Signal(name="s1_valid")
        s1 = Signal(REQUEST, name="s1_req")
        m.d.sync += s1_valid.eq(take)
        with m.If(take):
            m.d.sync += s1.eq(self.req.payload)

        # S1: profile, seed, usable snapshot.
        s1_qi = Signal(qb)
        s1_qok = Signal()
        m.d.comb += [s1_qok.eq(s1.qp < qps), s1_qi.eq(Mux(s1_qok, s1.qp, 0))]
        s1_prof = Signal(prb)
        m.d.comb += s1_prof.eq(qp_profile[s1_qi])
        s1_vec = by_profile(s1_prof, usable, "s1_vec")
        avoid_ok = s1.rtx & (s1.avoid < N)
        s1_mask = Signal(N)
        m.d.comb += s1_mask.eq(Mux(avoid_ok, Const(1, N) << s1.avoid[:nb], 0))

        S2 = data.StructLayout({"valid": 1, "req": REQUEST, "qok": 1, "prof": prb,
                                "seed": max(nb, 1), "vec": N})
        s2 = Signal(S2, name="s2")
        m.d.sync += [s2.valid.eq(s1_valid), s2.req.eq(s1), s2.qok.eq(s1_qok),
                     s2.prof.eq(s1_prof), s2.seed.eq(qp_seed[s1_qi]),
                     s2.vec.eq(s1_vec & ~s1_mask)]

        # S2: into scan order, position j = EV j ^ seed.
        vec = s2.vec
        for b in range(nb):
            stage = Signal(N, name=f"scan_stage{b}")
            m.d.comb += stage.eq(Cat(*(Mux(s2.seed[b], vec[j ^ (1 << b)], vec[j])
                                       for j in range(N))))
            vec = stage
        S3 = data.StructLayout({"valid": 1, "req": REQUEST, "qok": 1, "prof": prb,
                                "seed": max(nb, 1), "scan": N})
        s3 = Signal(S3, name="s3")
        m.d.sync += [s3.valid.eq(s2.valid), s3.req.eq(s2.req), s3.qok.eq(s2.qok),
                     s3.prof.eq(s2.prof), s3.seed.eq(s2.seed), s3.scan.eq(vec)]

        # S3: first usable position at or after the pointer, wrapping.
        s3_qi = Signal(qb)
        m.d.comb += s3_qi.eq(Mux(s3.qok, s3.req.qp, 0))
        ptr = Signal(max(nb, 1))
        m.d.comb += ptr.eq(qp_ptr[s3_qi])
        ge = Signal(N)
        m.d.comb += ge.eq(at_or_after(ptr, N))
        found_hi, j_hi = first_set_of(m, s3.scan & ge, "scan_hi")
        found_all, j_all = first_set_of(m, s3.scan, "scan_all")
        j = Signal(max(nb, 1))
        m.d.comb += j.eq(Mux(found_hi, j_hi, j_all))
        found = Signal()
        m.d.comb += found.eq(s3.valid & s3.qok & found_all)
        wrapped = Signal()
        m.d.comb += wrapped.eq(found & (~found_hi | (j == N - 1)))
        s3_ev = Signal(max(nb, 1))
        m.d.comb += s3_ev.eq(j ^ s3.seed)
        seed_now = Signal(max(nb, 1))
        m.d.comb += seed_now.eq(qp_seed[s3_qi])
        new_seed = Signal(max(nb, 1))
        stride = f["reseed"]["stride"]
        hb = nb - pb
        if hb > 0:
            x = seed_now[pb:]
            assert RESEED_MULT == 5                 # 5x = 4x + x: adders, not a multiplier
            hi = ((x << 2) + x + stride)[:hb]
            m.d.comb += new_seed.eq(Mux(stride == 0, seed_now,
                                        Cat(seed_now[:pb], hi) if pb else hi))
        else:
            m.d.comb += new_seed.eq(seed_now)
        for q in range(qps):
            with m.If(found & (s3_qi == q)):
                m.d.sync += qp_ptr_l[q].eq((j + 1)[:max(nb, 1)])
            with m.If(wrapped & (s3_qi == q)):
                m.d.sync += qp_seed_l[q].eq(new_seed)
        clear_now = Signal(name="skip_clear")       # S3 wrapped in the previous cycle
        clear_p = Signal(prb, name="skip_clear_profile")
        m.d.sync += [clear_now.eq(wrapped), clear_p.eq(s3.prof)]
        m.d.comb += ev_r.addr.eq(idx_of(s3.prof, s3_ev))

        S4 = data.StructLayout({"valid": 1, "req": REQUEST, "qok": 1, "found": 1,
                                "prof": prb, "ev": max(nb, 1)})
        s4 = Signal(S4, name="s4")
        m.d.sync += [s4.valid.eq(s3.valid), s4.req.eq(s3.req), s4.qok.eq(s3.qok),
                     s4.found.eq(found), s4.prof.eq(s3.prof), s4.ev.eq(s3_ev)]

        # S4: recheck against this cycle's state, write the response.
        s4_idx = idx_of(s4.prof, s4.ev)
        s4_usable = Signal()
        s4_ports = by_profile(s4.prof, prof_ok, "s4_ports")
        m.d.comb += s4_usable.eq(loaded.bit_select(s4_idx, 1) & active.bit_select(s4_idx, 1) &
                                 (st[s4_idx] == GOOD) &
                                 s4_ports.bit_select(s4.ev[:pb] if pb else 0, 1))
        s4_emit = Signal()
        m.d.comb += s4_emit.eq(s4.valid & s4.found & (s4_usable | self._skip_recheck))
        s4_hdr = Signal(HDR)
        m.d.comb += s4_hdr.eq(hdr[s4.prof])
        rsp = Signal(self.rsp_layout)
        m.d.comb += [
            rsp.qp.eq(s4.req.qp), rsp.psn.eq(s4.req.psn), rsp.rtx.eq(s4.req.rtx),
            rsp.none.eq(~s4_emit),
            rsp.ev.eq(Mux(s4_emit, s4.ev, 0)),
            rsp.plane.eq(Mux(s4_emit, s4.ev[:pb] if pb else 0, 0)),
            rsp.entropy.eq(Mux(s4_emit, entropy(s4_hdr.mode, ev_r.data, s4.ev), 0)),
            rsp.expanded.eq(Mux(s4_emit, ev_r.data, 0)),
            rsp_fifo.w_data.eq(rsp), rsp_fifo.w_en.eq(s4.valid),
        ]
        stall = s4.valid & ~s4_emit
        m.d.comb += f["error"]["stalled_set"].eq(stall)
        stalled_qp = Signal(16)
        with m.If(stall):
            m.d.sync += stalled_qp.eq(s4.req.qp)
        m.d.comb += f["stalled"]["qp"].eq(stalled_qp)
        if self.formal:
            # Never emitted: an EV DENIED, ASSUMED_BAD, or on a disabled port, or the EV a
            # retransmission avoids. Checked against the state flip-flops and the port
            # inputs of the cycle before (port_ok), not against the selection's own logic.
            with m.If(rsp_fifo.w_en & ~rsp.none):
                m.d.comb += [
                    Assert(st[s4_idx] != DENIED, "denied EV emitted"),
                    Assert(st[s4_idx] != BAD, "assumed-bad EV emitted"),
                    Assert(port_ok.bit_select(rsp.plane[:max(pb, 1)], 1) if pb else
                           port_ok[0], "EV on a disabled port emitted"),
                    Assert(~rsp.rtx | (rsp.ev != s4.req.avoid), "avoided EV emitted"),
                    Assert(Cat(*peer_ports).bit_select(s4.prof * P + (rsp.plane[:pb] if pb
                                                                     else 0), 1),
                           "EV on a plane the peer reported down emitted"),
                ]

        vars(v).update(take=take, wrapped=wrapped, q=q, clear_now=clear_now, clear_p=clear_p,
            s4=s4, s4_usable=s4_usable, s4_emit=s4_emit)

    def _feedback_f1(self, m, v):
        """Feedback, stage F1: commands, outstanding probes, ranges."""
        (qps, N, P, nb, qb, prb, qp_profile, probe_valid) = _take(v, """qps N P nb qb prb
            qp_profile probe_valid""")
        # --- Commands and the F2 slot ---------------------------------------------------------
        OP = data.StructLayout({"valid": 1, "cmd": 2, "kind": 4, "state": 2, "prof": prb,
                                "ev": max(nb, 1), "qp": qb, "probe": 1, "ports": P})
        cmd_pending = Signal(name="cmd_pending")
        cmd = Signal(OP, name="cmd")
        m.d.comb += self.fb.ready.eq(~cmd_pending)
        fb_take = self.fb.valid & self.fb.ready

        f1_valid = Signal(name="f1_valid")
        f1 = Signal(EV_FEEDBACK, name="f1")
        m.d.sync += f1_valid.eq(fb_take)
        with m.If(fb_take):
            m.d.sync += f1.eq(self.fb.payload)

        # Outstanding probes: EV and entropy per QP.
        PROBE_CTX = data.StructLayout({"ev": max(nb, 1), "entropy": 32})
        m.submodules.probe_mem = probe_mem = Memory(shape=PROBE_CTX, depth=qps, init=[])
        pm_w = probe_mem.write_port()
        pm_r = probe_mem.read_port(domain="comb")

        # F1: ranges, the probe a PROBE_* answers.
        f1_qok = f1.qp < qps
        f1_qi = Signal(qb)
        m.d.comb += f1_qi.eq(Mux(f1_qok, f1.qp, 0))
        m.d.comb += pm_r.addr.eq(f1_qi)
        is_probe = (f1.kind >= min(PROBE_KINDS)) & (f1.kind <= max(PROBE_KINDS))
        is_peer = f1.kind == FeedbackKind.PEER_PORTS
        kind_ok = f1.kind <= max(FeedbackKind)
        probe_match = probe_valid.bit_select(f1_qi, 1) & (pm_r.data.entropy == f1.entropy)
        f1_ok = Signal()
        f1_stale = Signal()
        f1_bad = Signal()
        m.d.comb += [
            f1_bad.eq(f1_valid & (~f1_qok | ~kind_ok | (~is_probe & ~is_peer & (f1.ev >= N)))),
            f1_stale.eq(f1_valid & ~f1_bad & is_probe & ~probe_match),
            f1_ok.eq(f1_valid & ~f1_bad & ~f1_stale),
        ]
        f2 = Signal(OP, name="f2")
        cmd_go = cmd_pending & ~f1_valid
        with m.If(f1_valid):
            m.d.sync += [f2.valid.eq(f1_ok), f2.cmd.eq(Cmd.FEEDBACK), f2.kind.eq(f1.kind),
                         f2.prof.eq(qp_profile[f1_qi]),
                         f2.ev.eq(Mux(is_probe, pm_r.data.ev, f1.ev[:max(nb, 1)])),
                         f2.qp.eq(f1_qi), f2.probe.eq(is_probe), f2.ports.eq(f1.entropy[:P])]
        with m.Elif(cmd_go):
            m.d.sync += [f2.eq(cmd), cmd_pending.eq(0)]
        with m.Else():
            m.d.sync += f2.valid.eq(0)
        probe_clear = Signal(qps)
        with m.If(f1_ok & is_probe):
            m.d.comb += probe_clear.eq(Const(1, qps) << f1_qi)

        vars(v).update(cmd_pending=cmd_pending, cmd=cmd, fb_take=fb_take, pm_w=pm_w,
            f1_stale=f1_stale, f1_bad=f1_bad, f2=f2, probe_clear=probe_clear)

    def _feedback_f2(self, m, v):
        """Feedback, stage F2: read, transition, write; backups."""
        (N, P, NP, nb, pb, total, f, GOOD, SKIP, BAD, DENIED, st, loaded, active, healthy_cnt, HDR,
            hdr, peer_ports, idx_of, healthy_state, p, clear_now, clear_p, f2) = _take(v, """N P NP
            nb pb total f GOOD SKIP BAD DENIED st loaded active healthy_cnt HDR hdr peer_ports
            idx_of healthy_state p clear_now clear_p f2""")
        # F2: read, transition, write; min_active; events.
        f2_idx = Signal(range(total))
        m.d.comb += f2_idx.eq(idx_of(f2.prof, f2.ev))
        s_raw = Signal(2)
        m.d.comb += s_raw.eq(st[f2_idx])
        s_old = Signal(2)
        m.d.comb += s_old.eq(Mux(clear_now & (clear_p == f2.prof) & (s_raw == SKIP), GOOD,
                                 s_raw))
        ld, ac = Signal(), Signal()
        m.d.comb += [ld.eq(loaded.bit_select(f2_idx, 1)), ac.eq(active.bit_select(f2_idx, 1))]
        s_new = Signal(2)
        with m.Switch(f2.kind):
            with m.Case(FeedbackKind.SKIP_ONCE, FeedbackKind.TRIMMED):
                m.d.comb += s_new.eq(Mux(s_old == GOOD, SKIP, s_old))
            with m.Case(FeedbackKind.ALWAYS_SKIP, FeedbackKind.TIMEOUT,
                        FeedbackKind.PROBE_BAD):
                m.d.comb += s_new.eq(BAD)
            with m.Case(FeedbackKind.PROBE_GOOD):
                m.d.comb += s_new.eq(GOOD)
            with m.Case(FeedbackKind.PROBE_SKIP):
                m.d.comb += s_new.eq(SKIP)
            with m.Default():
                m.d.comb += s_new.eq(s_old)
        is_peer_fb = f2.valid & (f2.cmd == Cmd.FEEDBACK) & (f2.kind == FeedbackKind.PEER_PORTS)
        is_fb = f2.valid & (f2.cmd == Cmd.FEEDBACK) & ~is_peer_fb
        fb_apply = Signal()
        fb_unloaded = Signal()
        m.d.comb += [fb_apply.eq(is_fb & ld & (s_old != DENIED)),
                     fb_unloaded.eq(is_fb & ~ld)]
        is_force = f2.valid & (f2.cmd == Cmd.FORCE)
        is_load = f2.valid & (f2.cmd == Cmd.LOAD)
        is_clear = f2.valid & (f2.cmd == Cmd.CLEAR)
        w_state = Signal(2)
        m.d.comb += w_state.eq(Mux(is_force, f2.state, Mux(is_load, GOOD, s_new)))
        changed = Signal()
        m.d.comb += changed.eq(((fb_apply & (s_new != s_old)) | (is_force & (f2.state != s_old))))
        was_healthy = ld & ac & healthy_state(s_old)
        cnt = Signal(9)
        m.d.comb += cnt.eq(healthy_cnt[f2.prof])
        f2_hdr = Signal(HDR)
        m.d.comb += f2_hdr.eq(hdr[f2.prof])
        load_active = f2.ev < f2_hdr.active
        # Backups of the EV's plane: positions k of EVs plane + k*P.
        plane = f2.ev[:pb] if pb else Const(0, 1)
        npp = N // P
        cand_vec = Signal(npp)
        with m.Switch(Cat(plane[:max(pb, 1)] if pb else Const(0, 1), f2.prof)
                      if NP > 1 else (plane[:max(pb, 1)] if pb else Const(0, 1))):
            for p in range(NP):
                for pl in range(P):
                    key = pl | (p << max(pb, 1)) if NP > 1 else pl
                    with m.Case(key):
                        bits = []
                        for k in range(npp):
                            i = p * N + pl + k * P
                            s_i = Mux(clear_now & (clear_p == p) & (st[i] == SKIP), GOOD,
                                      st[i])
                            bits.append(loaded[i] & ~active[i] & healthy_state(s_i))
                        m.d.comb += cand_vec.eq(Cat(*bits))
        cand_found, cand_k = first_set_of(m, cand_vec, "cand_held")
        cand_ev = Signal(max(nb, 1))
        m.d.comb += cand_ev.eq(Cat(plane[:pb], cand_k) if pb else cand_k)
        going_bad = fb_apply & was_healthy & (s_new == BAD)
        need = going_bad & (cnt <= f["ev_min_active"]["count"])
        promote = Signal()
        m.d.comb += promote.eq(need & cand_found)
        now_healthy = Signal()
        m.d.comb += now_healthy.eq(Mux(is_load, load_active,
                                       ld & ac & healthy_state(w_state)))
        for p in range(NP):
            with m.If(is_clear & (f2.prof == p)):
                m.d.sync += peer_ports[p].eq((1 << P) - 1)
            with m.Elif(is_peer_fb & (f2.prof == p)):
                m.d.sync += peer_ports[p].eq(f2.ports)
        for p in range(NP):
            with m.If(is_clear & (f2.prof == p)):
                m.d.sync += healthy_cnt[p].eq(0)
            with m.Elif((fb_apply | is_force | is_load) & ~promote & (f2.prof == p)):
                m.d.sync += healthy_cnt[p].eq(cnt + now_healthy - was_healthy)

        vars(v).update(f2_idx=f2_idx, is_peer_fb=is_peer_fb, fb_apply=fb_apply,
            fb_unloaded=fb_unloaded, is_force=is_force, is_load=is_load, is_clear=is_clear,
            w_state=w_state, changed=changed, f2_hdr=f2_hdr, load_active=load_active, p=p,
            bits=bits, i=i, cand_found=cand_found, cand_ev=cand_ev, need=need, promote=promote)

    def _feedback_next(self, m, v):
        """Feedback: the next state of every EV, and the events."""
        (N, NP, total, GOOD, SKIP, st_l, ld_l, ac_l, p, clear_now, clear_p, f2, f2_idx, fb_apply,
            is_force, is_load, is_clear, w_state, changed, f2_hdr, load_active, i, cand_ev,
            promote) = _take(v, """N NP total GOOD SKIP st_l ld_l ac_l p clear_now clear_p f2
            f2_idx fb_apply is_force is_load is_clear w_state changed f2_hdr load_active i cand_ev
            promote""")
        # Next state of every EV: the rotation's SKIP clear, then the F2 write.
        w_en = fb_apply | is_force | is_load
        for p in range(NP):
            pclear = clear_now & (clear_p == p)
            for e in range(N):
                i = p * N + e
                hit = w_en & (f2_idx == i)
                with m.If(is_clear & (f2.prof == p)):
                    m.d.sync += [st_l[i].eq(GOOD), ld_l[i].eq(0), ac_l[i].eq(0)]
                with m.Elif(hit):
                    m.d.sync += st_l[i].eq(w_state)
                    with m.If(is_load):
                        m.d.sync += [ld_l[i].eq(1), ac_l[i].eq(load_active)]
                    with m.If(promote):
                        m.d.sync += ac_l[i].eq(0)
                with m.Elif(pclear & (st_l[i] == SKIP)):
                    m.d.sync += st_l[i].eq(GOOD)
                with m.If(promote & (f2.prof == p) & (cand_ev == e)):
                    m.d.sync += ac_l[i].eq(1)

        if self.formal:
            # Formal: every EV starts in any state, loaded or not, active or not, so that
            # DENIED and backups are reachable with the registers held idle.
            first = Signal(init=1, name="formal_first")
            m.d.sync += first.eq(0)
            with m.If(first):
                for i in range(total):
                    m.d.sync += [st_l[i].eq(AnyConst(2)), ld_l[i].eq(AnyConst(1)),
                                 ac_l[i].eq(AnyConst(1))]

        # Events.
        ev_fifo = SyncFIFOBuffered(width=EVENT.size, depth=EVENT_FIFO_DEPTH)
        m.submodules.event_fifo = ev_fifo
        m.d.comb += [self.event.payload.eq(ev_fifo.r_data), self.event.valid.eq(ev_fifo.r_rdy),
                     ev_fifo.r_en.eq(self.event.ready)]
        want_event = Signal()
        m.d.comb += want_event.eq(changed & f2_hdr.mask.bit_select(w_state, 1))
        drop_run = Signal(DROP_BITS)
        event_rec = Signal(EVENT)
        m.d.comb += [event_rec.profile.eq(f2.prof), event_rec.ev.eq(f2.ev),
                     event_rec.state.eq(w_state), event_rec.dropped.eq(drop_run),
                     ev_fifo.w_data.eq(event_rec), ev_fifo.w_en.eq(want_event)]
        ev_pushed = want_event & ev_fifo.w_rdy
        ev_dropped = want_event & ~ev_fifo.w_rdy
        with m.If(ev_pushed):
            m.d.sync += drop_run.eq(0)
        with m.Elif(ev_dropped & (drop_run != (1 << DROP_BITS) - 1)):
            m.d.sync += drop_run.eq(drop_run + 1)

        vars(v).update(p=p, e=e, i=i, ev_pushed=ev_pushed, ev_dropped=ev_dropped)

    def _probes(self, m, v):
        """Probes and announcements."""
        (qps, N, P, NP, nb, pb, qb, prb, f, BAD, st, loaded, hdr, qp_profile, peer_ports,
            port_live, idx_of, p, by_profile, usable, ev_rp, entropy, pm_w, e) = _take(v, """qps N
            P NP nb pb qb prb f BAD st loaded hdr qp_profile peer_ports port_live idx_of p
            by_profile usable ev_rp entropy pm_w e""")
        # --- Probes ------------------------------------------------------------------------
        probe_fifo = SyncFIFOBuffered(width=self.probe_layout.size, depth=PROBE_FIFO_DEPTH)
        m.submodules.probe_fifo = probe_fifo
        m.d.comb += [self.probe.payload.eq(probe_fifo.r_data),
                     self.probe.valid.eq(probe_fifo.r_rdy), probe_fifo.r_en.eq(self.probe.ready)]
        interval = f["probe_interval"]["cycles"]
        timer = Signal(24)
        probe_qp = Signal(qb)
        pptr = Signal(data.ArrayLayout(max(nb, 1), NP), name="probe_ptr")
        g_prof = Signal(prb)
        m.d.comb += g_prof.eq(qp_profile[probe_qp])
        bad_vec = Signal(N)
        with m.Switch(g_prof):
            for p in range(NP):
                with m.Case(p):
                    m.d.comb += bad_vec.eq(Cat(*(loaded[p * N + e] & (st[p * N + e] == BAD)
                                                 & port_live[e % P] & peer_ports[p][e % P]
                                                 for e in range(N))))
        g_ptr = Signal(max(nb, 1))
        m.d.comb += g_ptr.eq(pptr[g_prof])
        gfh, gjh = first_set_of(m, bad_vec & at_or_after(g_ptr, N), "bad_hi")
        gfa, gja = first_set_of(m, bad_vec, "bad_all")
        g_ev = Signal(max(nb, 1))
        m.d.comb += g_ev.eq(Mux(gfh, gjh, gja))
        # Announcements (ANNOUNCE_RULE): a change of port_live starts a round over the QPs.
        # In it each QP in turn, one a cycle, gets one port status record on its profile's
        # first usable EV (a path that carries data now), or is passed over when it has none.
        # The probe round waits meanwhile.
        live_prev = Signal(P, init=(1 << P) - 1, name="live_prev")
        m.d.sync += live_prev.eq(port_live)
        ann_left = Signal(range(qps + 1), name="announce_left")
        ann_qp = Signal(qb, name="announce_qp")
        a_prof = Signal(prb)
        m.d.comb += a_prof.eq(qp_profile[ann_qp])
        a_vec = by_profile(a_prof, usable, "announce_vec")
        a_found, a_ev = first_set_of(m, a_vec, "announce_ev")
        ann_busy = ann_left != 0
        probe_room = probe_fifo.level <= PROBE_FIFO_DEPTH - 3
        a_issue = Signal()
        m.d.comb += a_issue.eq(ann_busy & a_found & probe_room)
        with m.If(f["announce"]["enable"] & (port_live != live_prev)):
            m.d.sync += [ann_left.eq(qps), ann_qp.eq(0)]
        with m.Elif(ann_busy & (a_issue | ~a_found)):
            m.d.sync += [ann_left.eq(ann_left - 1),
                         ann_qp.eq(Mux(ann_qp == qps - 1, 0, ann_qp + 1))]

        armed = (interval != 0) & (timer == 0) & ~ann_busy
        g_issue = Signal()
        m.d.comb += g_issue.eq(armed & gfa & probe_room)
        with m.If(interval == 0):
            m.d.sync += timer.eq(0)
        with m.Elif(g_issue):
            m.d.sync += timer.eq(interval - 1)
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        with m.If(armed):
            m.d.sync += probe_qp.eq(Mux(probe_qp == qps - 1, 0, probe_qp + 1))
        for p in range(NP):
            with m.If(g_issue & (g_prof == p)):
                m.d.sync += pptr[p].eq((g_ev + 1)[:max(nb, 1)])
        m.d.comb += ev_rp.addr.eq(Mux(ann_busy, idx_of(a_prof, a_ev), idx_of(g_prof, g_ev)))
        G2 = data.StructLayout({"valid": 1, "qp": qb, "prof": prb, "ev": max(nb, 1),
                                "announce": 1, "ports": P})
        g2 = Signal(G2, name="g2")
        m.d.sync += [g2.valid.eq(g_issue | a_issue), g2.announce.eq(ann_busy),
                     g2.qp.eq(Mux(ann_busy, ann_qp, probe_qp)),
                     g2.prof.eq(Mux(ann_busy, a_prof, g_prof)),
                     g2.ev.eq(Mux(ann_busy, a_ev, g_ev)), g2.ports.eq(port_live)]
        probe_rec = Signal(self.probe_layout)
        g2_ent = Signal(32)
        m.d.comb += g2_ent.eq(entropy(hdr[g2.prof].mode, ev_rp.data, g2.ev))
        m.d.comb += [probe_rec.qp.eq(g2.qp), probe_rec.ev.eq(g2.ev),
                     probe_rec.plane.eq(g2.ev[:pb] if pb else 0), probe_rec.entropy.eq(g2_ent),
                     probe_rec.expanded.eq(ev_rp.data),
                     probe_rec.announce.eq(g2.announce),
                     probe_rec.ports.eq(Mux(g2.announce, g2.ports, 0)),
                     probe_fifo.w_data.eq(probe_rec), probe_fifo.w_en.eq(g2.valid),
                     pm_w.addr.eq(g2.qp), pm_w.data.ev.eq(g2.ev), pm_w.data.entropy.eq(g2_ent),
                     pm_w.en.eq(g2.valid & ~g2.announce)]
        probe_set = Signal(qps)
        with m.If(g2.valid & ~g2.announce):
            m.d.comb += probe_set.eq(Const(1, qps) << g2.qp)

        vars(v).update(p=p, a_issue=a_issue, g_issue=g_issue, probe_set=probe_set)

    def _commands(self, m, v):
        """Controller commands."""
        (qps, N, NP, EVB, nb, qb, prb, f, sel, HDR, hdr, qp_profile_l, qp_seed_l, qp_ptr_l,
            probe_valid, p, q, cmd_pending, probe_clear, bits, i, probe_set) = _take(v, """qps N NP
            EVB nb qb prb f sel HDR hdr qp_profile_l qp_seed_l qp_ptr_l probe_valid p q cmd_pending
            probe_clear bits i probe_set""")
        # --- Controller commands ---------------------------------------------------------------
        c = f["command"]
        err = f["error"]
        busy = Signal(name="engine_busy")
        any_cmd = Cat(*(c[n] for n in ("write_profile", "write_field", "write_ev", "generate",
                                        "write_qp", "force_state", "clear_profile"))).any()
        blocked = busy | cmd_pending
        sp, sf, se = sel["profile"], sel["field"], sel["ev"]
        sq = f["select_qp"]["qp"]
        p_ok = sp < NP
        pc = f["profile_cfg"]
        sel_hdr = Signal(HDR)
        m.d.comb += sel_hdr.eq(hdr[sp[:prb]])
        bad_index = Signal()
        bad_config = Signal()
        fw_reg = f["field_widths"]
        init_v, mask_v = f["field_init"]["value"], f["field_mask"]["value"]
        min_v, max_v = f["field_min"]["value"], f["field_max"]["value"]

        def popcount(v):
            return sum(v[i] for i in range(len(v)))

        def fits(v, w):          # v < 2^w, w 0..32
            return Mux(w >= 32, 1, (v >> w[:5]) == 0)

        def ev_bits_of(mode):
            # A Mux chain, not a Switch: Icarus never evaluates an always @* block whose
            # only input keeps its initial value (a mode written with its reset value).
            v = Const(0, 9)
            for md, bits in proto.EV_BITS.items():
                v = Mux(mode == md, bits, v)
            return v

        mode_bits = Signal(9)
        m.d.comb += mode_bits.eq(ev_bits_of(pc["mode"]))
        # The rule checks are registered: they read registers that a write changed at least
        # one cycle before a command can pulse (the register block does one write a cycle),
        # and so stay off the path from the command to the engine.
        profile_bad = Signal()
        m.d.sync += profile_bad.eq(
            (mode_bits == 0) | (mode_bits > EVB) | (pc["format_fields"] == 0) |
            (pc["format_fields"] > MAX_FORMAT_FIELDS) |
            (pc["ev_fields"] > pc["format_fields"]) | (pc["active"] > N))
        w_fw, w_w = fw_reg["format_width"], fw_reg["width"]
        k_mask = Signal(6)
        m.d.comb += k_mask.eq(popcount(mask_v))
        field_bad = Signal()
        m.d.sync += field_bad.eq(
            (w_fw == 0) | (w_fw > MAX_FIELD_WIDTH) | (w_w > MAX_FIELD_WIDTH) |
            ((w_w != 0) & ((w_w > w_fw) | ~fits(init_v, w_w) | ~fits(mask_v, w_w) |
                           ~fits(max_v, k_mask) | (min_v > max_v))))
        with m.If(c["write_profile"] & ~blocked):
            m.d.comb += [bad_index.eq(~p_ok), bad_config.eq(p_ok & profile_bad)]
        with m.If(c["write_field"] & ~blocked):
            m.d.comb += [bad_index.eq(~p_ok), bad_config.eq(p_ok & field_bad)]
        with m.If((c["write_ev"] | c["force_state"]) & ~blocked):
            m.d.comb += bad_index.eq(~p_ok | (se >= N))
            with m.If(c["write_ev"]):
                m.d.comb += bad_config.eq(p_ok & (se < N) & sel_hdr.gen)
            with m.Else():
                m.d.comb += bad_config.eq(p_ok & (se < N) &
                                          (f["force"]["state"] != EvState.GOOD) &
                                          (f["force"]["state"] != EvState.DENIED))
        with m.If(c["generate"] & ~blocked):
            m.d.comb += [bad_index.eq(~p_ok), bad_config.eq(p_ok & ~sel_hdr.gen)]
        with m.If(c["clear_profile"] & ~blocked):
            m.d.comb += bad_index.eq(~p_ok)
        qcfg = f["qp_cfg"]
        with m.If(c["write_qp"] & ~blocked):
            m.d.comb += bad_index.eq((sq >= qps) | (qcfg["profile"] >= NP) |
                                     (qcfg["seed"] >= N))
        refused_busy = any_cmd & blocked
        ok_cmd = any_cmd & ~blocked & ~bad_index & ~bad_config
        m.d.comb += [err["busy_set"].eq(refused_busy), err["bad_index_set"].eq(bad_index),
                     err["bad_config_set"].eq(bad_config)]
        refused = Signal()
        m.d.comb += refused.eq(refused_busy | bad_index | bad_config)

        for p in range(NP):
            with m.If(ok_cmd & c["write_profile"] & (sp == p)):
                m.d.sync += [hdr[p].mode.eq(pc["mode"]), hdr[p].nfmt.eq(pc["format_fields"]),
                             hdr[p].nev.eq(pc["ev_fields"]), hdr[p].gen.eq(pc["generated"]),
                             hdr[p].active.eq(pc["active"]), hdr[p].mask.eq(pc["event_mask"])]
        FCFG = data.StructLayout({"fw": 6, "w": 6, "init": 32, "mask": 32, "min": 32,
                                  "max": 32})
        m.submodules.fmem = fmem = Memory(shape=FCFG, depth=NP * MAX_FORMAT_FIELDS, init=[])
        fm_w = fmem.write_port()
        fm_r = fmem.read_port(domain="comb")
        with m.If(ok_cmd & c["write_field"]):
            m.d.comb += [fm_w.addr.eq(Cat(sf, sp[:prb]) if NP > 1 else sf), fm_w.en.eq(1),
                         fm_w.data.fw.eq(w_fw), fm_w.data.w.eq(w_w), fm_w.data.init.eq(init_v),
                         fm_w.data.mask.eq(mask_v), fm_w.data.min.eq(min_v),
                         fm_w.data.max.eq(max_v)]
        for q in range(qps):
            with m.If(ok_cmd & c["write_qp"] & (sq == q)):
                m.d.sync += [qp_profile_l[q].eq(qcfg["profile"][:prb]),
                             qp_seed_l[q].eq(qcfg["seed"][:max(nb, 1)]),
                             qp_ptr_l[q].eq(0)]
        qp_cfg_clear = Signal(qps)
        with m.If(ok_cmd & c["write_qp"]):
            m.d.comb += qp_cfg_clear.eq(Const(1, qps) << sq[:qb])
        m.d.sync += probe_valid.eq((probe_valid & ~probe_clear & ~qp_cfg_clear) | probe_set)

        vars(v).update(c=c, err=err, busy=busy, sp=sp, se=se, sel_hdr=sel_hdr, popcount=popcount,
            ev_bits_of=ev_bits_of, ok_cmd=ok_cmd, refused=refused, fm_r=fm_r)

    def _expansion(self, m, v):
        """The expansion engine."""
        (N, NP, EVB, nb, prb, f, HDR, idx_of, ev_w, cmd_pending, cmd, i, c, err, busy, sp, se,
            sel_hdr, popcount, ev_bits_of, ok_cmd, refused, fm_r) = _take(v, """N NP EVB nb prb f
            HDR idx_of ev_w cmd_pending cmd i c err busy sp se sel_hdr popcount ev_bits_of ok_cmd
            refused fm_r""")
        # --- Expansion engine ----------------------------------------------------------------
        job_p = Signal(prb)
        job_ev = Signal(max(nb, 1))
        job_gen = Signal()
        fi = Signal(5)
        jb = Signal(6)
        total_fw = Signal(10)
        outbits = Signal(range(EVB + 1))
        acc = Signal(EVB)
        raw = Signal(256)
        check_bad = Signal()
        # The field being expanded, loaded once per field (FLOAD) and shifted one bit per
        # cycle, so that the per-bit path is a few LUTs from flip-flops.
        f_fw = Signal(6)
        f_in_ev = Signal()
        f_msk = Signal(32)
        f_ini = Signal(32)
        f_n = Signal(32)
        f_k = Signal(6)
        gen_count = Signal(9)
        m.submodules.nmem = nmem = Memory(shape=32, depth=MAX_FORMAT_FIELDS, init=[])
        n_w = nmem.write_port()
        n_r = nmem.read_port(domain="comb")
        j_hdr = Signal(HDR, name="job_hdr")       # the job's profile header, held
        m.d.comb += [fm_r.addr.eq(Cat(fi[:4], job_p) if NP > 1 else fi[:4]),
                     n_r.addr.eq(fi[:4])]
        cur = fm_r.data
        raw_words = [f[f"raw{i}"]["value"] for i in range(8)]
        m.d.comb += [f["status"]["busy"].eq(busy | cmd_pending),
                     f["status"]["generated"].eq(gen_count)]

        with m.If(ok_cmd & (c["force_state"] | c["clear_profile"])):
            m.d.sync += [cmd_pending.eq(1), cmd.valid.eq(1),
                         cmd.cmd.eq(Mux(c["force_state"], Cmd.FORCE, Cmd.CLEAR)),
                         cmd.state.eq(f["force"]["state"]), cmd.prof.eq(sp[:prb]),
                         cmd.ev.eq(se[:max(nb, 1)])]

        with m.FSM(name="engine"):
            with m.State("IDLE"):
                with m.If(ok_cmd & (c["write_ev"] | c["generate"])):
                    m.d.sync += [busy.eq(1), job_p.eq(sp[:prb]), job_ev.eq(0),
                                 job_gen.eq(c["generate"]), fi.eq(0), total_fw.eq(0),
                                 check_bad.eq(0), j_hdr.eq(sel_hdr)]
                    with m.If(c["write_ev"]):
                        m.d.sync += [job_ev.eq(se[:max(nb, 1)]),
                                     raw.eq(Cat(*reversed(raw_words)))]
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(fi < j_hdr.nfmt):
                    m.d.sync += [fi.eq(fi + 1), total_fw.eq(total_fw + cur.fw),
                                 check_bad.eq(check_bad | (cur.fw == 0) |
                                              ((fi < j_hdr.nev) & (cur.w == 0)))]
                with m.Else():
                    mb = ev_bits_of(j_hdr.mode)
                    bad = check_bad | (total_fw > mb) | (mb == 0) | (j_hdr.nfmt == 0)
                    m.d.sync += fi.eq(0)
                    with m.If(bad):
                        m.d.comb += err["bad_config_set"].eq(1)
                        m.d.comb += refused.eq(1)
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
                    with m.Elif(job_gen):
                        m.d.sync += [cmd_pending.eq(1), cmd.valid.eq(1), cmd.cmd.eq(Cmd.CLEAR),
                                     cmd.prof.eq(job_p), gen_count.eq(0)]
                        m.next = "GINIT"
                    with m.Else():
                        m.next = "EXP_START"
            with m.State("GINIT"):
                with m.If(fi < j_hdr.nev):
                    m.d.comb += [n_w.addr.eq(fi[:4]), n_w.data.eq(cur.min), n_w.en.eq(1)]
                    m.d.sync += fi.eq(fi + 1)
                with m.Elif(~cmd_pending):
                    m.next = "EXP_START"
            with m.State("EXP_START"):
                m.d.sync += [fi.eq(0), jb.eq(0), outbits.eq(0), acc.eq(0)]
                m.next = "FLOAD"
            with m.State("FLOAD"):
                with m.If(fi < j_hdr.nfmt):
                    m.d.sync += [f_fw.eq(cur.fw), f_in_ev.eq(fi < j_hdr.nev),
                                 f_msk.eq(cur.mask), f_ini.eq(cur.init), f_n.eq(n_r.data),
                                 f_k.eq(popcount(cur.mask)), jb.eq(0)]
                    m.next = "FALIGN"
                with m.Else():
                    m.next = "TAIL"
            with m.State("FALIGN"):
                # Field fi: its first wire bit (format bit fw-1) to bit 31 of the shifters;
                # the k bits of a generated number to the top of f_n, most significant first.
                up = (Const(32, 7) - f_fw)[:6]
                m.d.sync += [f_msk.eq((f_msk << up)[:32]), f_ini.eq((f_ini << up)[:32]),
                             f_n.eq((f_n << (Const(32, 7) - f_k)[:6])[:32])]
                m.next = "BITS"
            with m.State("BITS"):
                src = Mux(job_gen, f_n[31], raw[255])
                consume = f_in_ev & f_msk[31]
                bit = f_in_ev & Mux(f_msk[31], src, f_ini[31])
                m.d.sync += [acc.eq(Cat(bit, acc[:-1])), outbits.eq(outbits + 1),
                             f_msk.eq(f_msk << 1), f_ini.eq(f_ini << 1)]
                with m.If(consume & job_gen):
                    m.d.sync += f_n.eq(f_n << 1)
                with m.If(consume & ~job_gen):
                    m.d.sync += raw.eq(raw << 1)
                with m.If(jb == f_fw - 1):
                    m.d.sync += fi.eq(fi + 1)
                    m.next = "FLOAD"
                with m.Else():
                    m.d.sync += jb.eq(jb + 1)
            with m.State("TAIL"):
                with m.If(outbits < EVB):
                    m.d.sync += [acc.eq(acc << 1), outbits.eq(outbits + 1)]
                with m.Else():
                    m.next = "WRITE"
            with m.State("WRITE"):
                with m.If(~cmd_pending):
                    m.d.comb += [ev_w.addr.eq(idx_of(job_p, job_ev)), ev_w.data.eq(acc),
                                 ev_w.en.eq(1)]
                    m.d.sync += [cmd_pending.eq(1), cmd.valid.eq(1), cmd.cmd.eq(Cmd.LOAD),
                                 cmd.prof.eq(job_p), cmd.ev.eq(job_ev)]
                    with m.If(job_gen):
                        m.d.sync += [gen_count.eq(gen_count + 1), fi.eq(j_hdr.nev - 1)]
                        m.next = "ODO"
                    with m.Else():
                        m.next = "DONE"
            with m.State("ODO"):
                # Odometer: the last field steps fastest; a carry out of field 0 ends it.
                last = job_ev == N - 1
                with m.If(last | (j_hdr.nev == 0)):
                    m.next = "DONE"
                with m.Elif(n_r.data == cur.max):
                    m.d.comb += [n_w.addr.eq(fi[:4]), n_w.data.eq(cur.min), n_w.en.eq(1)]
                    m.d.sync += fi.eq(fi - 1)
                    with m.If(fi == 0):
                        m.next = "DONE"
                with m.Else():
                    m.d.comb += [n_w.addr.eq(fi[:4]), n_w.data.eq(n_r.data + 1), n_w.en.eq(1)]
                    m.d.sync += job_ev.eq(job_ev + 1)
                    m.next = "EXP_START"
            with m.State("DONE"):
                with m.If(~cmd_pending):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"


    def _counters(self, m, v):
        """Counters."""
        (nb, prb, f, st, loaded, active, healthy_cnt, peer_ports, idx_of, by_profile, take,
            wrapped, s4, s4_usable, s4_emit, fb_take, f1_stale, f1_bad, is_peer_fb, fb_unloaded,
            changed, cand_found, need, promote, ev_pushed, ev_dropped, a_issue, g_issue, sp, se,
            refused) = _take(v, """nb prb f st loaded active healthy_cnt peer_ports idx_of
            by_profile take wrapped s4 s4_usable s4_emit fb_take f1_stale f1_bad is_peer_fb
            fb_unloaded changed cand_found need promote ev_pushed ev_dropped a_issue g_issue sp se
            refused""")
        # --- Counters ---------------------------------------------------------------------------
        evs = Signal(data.StructLayout({n: 1 for n in COUNTERS}))
        m.d.comb += [
            evs.requests.eq(take),
            evs.decisions.eq(s4_emit),
            evs.no_path.eq(s4.valid & s4.qok & ~s4.found),
            evs.revoked.eq(s4.valid & s4.found & ~s4_usable),
            evs.bad_request.eq(s4.valid & ~s4.qok),
            evs.wraps.eq(wrapped),
            evs.feedback.eq(fb_take),
            evs.bad_feedback.eq(f1_bad | fb_unloaded),
            evs.stale_probe.eq(f1_stale),
            evs.transitions.eq(changed),
            evs.promotions.eq(promote),
            evs.no_backup.eq(need & ~cand_found),
            evs.events.eq(ev_pushed),
            evs.events_dropped.eq(ev_dropped),
            evs.probes.eq(g_issue),
            evs.announcements.eq(a_issue),
            evs.refused.eq(refused),
            evs.peer_updates.eq(is_peer_fb),
        ]
        event_counters(m, f, evs, COUNTERS, f["control"]["clear"], width=self.counter_width)

        es_idx = idx_of(sp[:prb], se[:max(nb, 1)])
        m.d.comb += [f["ev_status"]["state"].eq(st[es_idx]),
                     f["ev_status"]["active"].eq(active.bit_select(es_idx, 1)),
                     f["ev_status"]["loaded"].eq(loaded.bit_select(es_idx, 1)),
                     f["ev_status"]["healthy"].eq(healthy_cnt[sp[:prb]])]
        m.d.comb += f["peer_ports"]["ports"].eq(by_profile(sp, peer_ports, "peer_ports_sel"))


