"""Receive memory protection: :class:`MemoryProtect` (``memory-protect``).

In :class:`~mrcnic.rx.mrc_rx.MrcRx` the ``pkt`` records of every plane's
:class:`~mrcnic.rx.roce_rx.RoceRx` are merged and pass through this block before the
:class:`~mrcnic.rx.psn_tracker.PsnTracker`: it looks each RDMA WRITE's R_Key up in a
memory-region table set through registers, checks the QP's protection domain, the region's
write permission and the address range, and marks the record denied or not; the first
violation of a QP gives an access-error record for an AETH NAK and puts the QP in error.
:func:`table_op` is the software sequence that writes the tables.

Operation, decisions and measured figures: docs/blocks/memory-protect.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import Opcode
from mrcnic.base.records import NAK, RX_PKT
from mrcnic.base.stream import MetaSkidBuffer, meta_stream

__all__ = ["MemoryProtect", "MP_OUT", "MP_REGS", "MP_COUNTERS", "CAUSES", "FIFO_DEPTH",
           "MAX_REGIONS", "MAX_QPS", "table_op"]

# The input record plus the decision; built from RX_PKT so that it follows it.
MP_OUT = data.StructLayout({**{name: f.shape for name, f in RX_PKT}, "deny": 1})

MAX_REGIONS = 256
MAX_QPS = 1024           # error bits are flip-flops: one per QP
FIFO_DEPTH = 8           # out and nak; the pipeline waits when either is full
PD_BITS = 8

# Check failures, in priority order.
CAUSES = ["unknown_rkey", "pd_mismatch", "read_only", "out_of_range"]
MP_COUNTERS = ["records", "checked", "denied", *CAUSES, "qp_in_error", "naks"]

# A region table entry, and a record's failed checks (stages B and C).
_ENTRY = data.StructLayout({"valid": 1, "rkey": 32, "base": 64, "limit": 65, "writable": 1,
                           "pd": PD_BITS})
_CAUSE = data.StructLayout({c: 1 for c in CAUSES})

MP_REGS = RegisterMap("memory_protect", [
    Register("info", [Field("regions", 9, "ro", desc="Region table entries (parameter)"),
                      Field("qps", 11, "ro", offset=16, desc="QPs (parameter)")]),
    Register("region_select", [Field("entry", 8, "rw", desc="Region entry the next "
                                                           "region_command acts on")]),
    Register("region_rkey", [Field("rkey", 32, "rw", desc="Staged R_Key")]),
    Register("region_base_lo", [Field("base", 32, "rw", desc="Staged base address, bits "
                                                             "31:0")]),
    Register("region_base_hi", [Field("base", 32, "rw", desc="Staged base address, bits "
                                                             "63:32")]),
    Register("region_length_lo", [Field("length", 32, "rw", desc="Staged region length in "
                                                                 "bytes, bits 31:0")]),
    Register("region_length_hi", [Field("length", 32, "rw", desc="Staged region length, "
                                                                 "bits 63:32")]),
    Register("region_attr", [Field("writable", 1, "rw", desc="Staged: RDMA WRITE allowed"),
                             Field("pd", PD_BITS, "rw", offset=8,
                                   desc="Staged protection domain")]),
    Register("region_command", [
        Field("write", 1, "w1p", desc="Write the staged entry into region_select, valid, "
                                      "on one edge"),
        Field("invalidate", 1, "w1p", desc="Make entry region_select invalid"),
    ]),
    Register("qp_select", [Field("qp", 16, "rw", desc="QP the next qp_command acts on and "
                                                      "qp_status shows")]),
    Register("qp_pd", [Field("pd", PD_BITS, "rw", desc="Protection domain set_pd writes")]),
    Register("qp_command", [
        Field("set_pd", 1, "w1p", desc="Give QP qp_select the domain qp_pd"),
        Field("clear_error", 1, "w1p", desc="Clear QP qp_select's error bit (a violation "
                                            "on the same edge wins)"),
    ]),
    Register("qp_status", [Field("error", 1, "ro", desc="QP qp_select is in error (0 when "
                                                        "qp_select >= qps)")]),
    Register("status", [Field("busy", 1, "ro", desc="A region_command or set_pd is waiting "
                                                     "for the pipeline (a few cycles, longer "
                                                     "while out or nak is full)")]),
    Register("error", [
        Field("bad_region", 1, "w1c", desc="A region_command named an entry >= regions; "
                                           "nothing was written"),
        Field("bad_qp", 1, "w1c", desc="A qp_command named a QP >= qps; nothing was "
                                       "written"),
        Field("busy", 1, "w1c", desc="A region_command or set_pd came while status.busy "
                                     "(or set_pd with a region_command); it was refused"),
    ]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("records", "Records in"),
        ("checked", "WRITEs, not trimmed, of a QP in range and not in error: checked"),
        ("denied", "Records out with deny = 1"),
        ("unknown_rkey", "Checked WRITEs whose R_Key no valid region has"),
        ("pd_mismatch", "Checked WRITEs to a region of another protection domain"),
        ("read_only", "Checked WRITEs to a region that is not writable"),
        ("out_of_range", "Checked WRITEs that leave their region"),
        ("qp_in_error", "Records of a QP in error (denied, not NAKed)"),
        ("naks", "NAK records (access error)"),
    ]],
])


class MemoryProtect(wiring.Component):
    """Receive memory protection: checks every RDMA WRITE against a memory-region table and
    its QP's protection domain before the PSN tracker sees it.

    Every ``pkt`` record leaves on ``out``, in order, its fields unchanged and ``deny``
    added. Per record, in this order: a QP index >= ``qps`` passes (``deny`` = 0; the
    tracker answers it as NO_QP); a record of a QP in error is denied, without a NAK (one
    NAK per error episode), probes and trimmed packets included; a WRITE (0xC6..0xCB) that
    is not trimmed is checked, and the first failing check names the cause (:data:`CAUSES`:
    ``unknown_rkey``, ``pd_mismatch``, ``read_only``, ``out_of_range``, the range in exact
    arithmetic with the region's end clamped at 2^64): the record is denied, one ``nak``
    record {qp, psn, syndrome 0x62} is written and the QP's error bit is set; anything else
    passes. Two valid regions with one R_Key: the lower entry is used. The region table is a
    CAM in flip-flops, written entry by entry through staging registers and
    ``region_command``; the per-QP domains are written by ``qp_command.set_pd``, and an error
    bit is cleared only by ``qp_command.clear_error`` (a violation on the same edge wins). A
    table command is applied between two records, never halfway through one (the input is
    held for that cycle; ``status.busy`` meanwhile).

    Parameters
    ----------
    regions : int
        Region table entries, 1 .. 256 (:data:`MAX_REGIONS`). Default 16.
    qps : int
        QPs with a protection domain and an error bit, 1 .. 1024 (:data:`MAX_QPS`); records
        of a QP index >= ``qps`` pass unchecked. Default 64.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    pkt : stream of :data:`~mrcnic.base.records.RX_PKT`, in
        The merged receive records. ``pkt.ready`` is a register.
    out : stream of :data:`MP_OUT`, out
        One record per ``pkt`` record, in order: its fields, then ``deny``.
    nak : stream of :data:`~mrcnic.base.records.NAK`, out
        One record {qp, psn, syndrome 0x62, ``proto.AETH_SYNDROME_ACCESS_ERROR``} per
        violation that puts a QP in error. Must be read independently of ``out``.
    s_axil : AXI4-Lite, in
        Registers, :data:`MP_REGS`.
    latency : int
        Cycles from a ``pkt`` handshake to the record valid on ``out``.

    ``out`` and ``nak`` come from FIFOs of :data:`FIFO_DEPTH` entries. The pipeline moves
    only while both have room, so a NAK is never dropped: a full ``nak`` FIFO stalls the
    input.

    Latency
    -------
    :attr:`latency` = 6 cycles from the ``pkt`` handshake to the record valid on ``out``
    (and its NAK on ``nak``): the input skid buffer, stages A1 (R_Key compare), A2 (field
    select) and B (range and domain compares), stage C writing the FIFO, and the FIFO's
    output register. A table command is applied 1 cycle after its strobe while the pipeline
    moves.

    Throughput
    ----------
    One record per cycle sustained, any mix, while ``out`` and ``nak`` are read; each region
    or domain command costs one input cycle.

    Raises
    ------
    TypeError
        If ``regions`` or ``qps`` is not an int.
    ValueError
        If ``regions`` is outside 1 .. 256, ``qps`` outside 1 .. 1024, or ``counter_width``
        is not 0, 16 or 32.
    """

    latency = 6

    def __init__(self, regions=16, qps=64, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        for name, value, top in (("regions", regions, MAX_REGIONS), ("qps", qps, MAX_QPS)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {value!r}")
            if not 1 <= value <= top:
                raise ValueError(f"{name} = {value} is outside 1..{top}")
        self.regions, self.qps = regions, qps
        super().__init__({
            "pkt": In(meta_stream(RX_PKT)),
            "out": Out(meta_stream(MP_OUT)),
            "nak": Out(meta_stream(NAK)),
            "s_axil": In(AxiLiteSignature(MP_REGS.addr_width)),
        })

    @property
    def _qbits(self):
        """Index bits of the per-QP tables and masks: at least one."""
        return max(1, ceil_log2(self.qps))

    def elaborate(self, platform):
        m = Module()
        # Registers: the CSR block on s_axil; its fields
        f = self._registers(m)
        # Tables: the region table, the staged entry's limit, the per-QP domains, error bits
        table, base, staged_limit, pd_w, pd_r, errors = self._tables(m, f)
        # Table commands: latched, and applied between two records (`apply`)
        pending, apply, qsel, qsel_ok, qcmd = self._table_commands(
            m, f, table, base, staged_limit, pd_w, errors)
        # Input: the skid buffer; `advance`, the enable every stage moves on
        skid, advance = self._input(m)
        # Stage A1: CAM (R_Key against every entry), lowest match, QP domain
        x, x_valid = self._stage_a1(m, table, pd_r, pending, apply, skid, advance)
        # Stage A2: the matched entry's fields
        b, b_valid = self._stage_a2(m, table, x, x_valid, advance)
        # Stage B: the range and domain compares, the cause
        c, c_valid = self._stage_b(m, b, b_valid, advance)
        # Stage C: error bit, decision, the out and nak FIFOs
        fire, err, violation, deny = self._stage_c(m, c, c_valid, advance, errors,
                                                   qsel, qsel_ok, qcmd)
        # Counters: records, checks, denials by cause, NAKs
        self._counters(m, f, c, fire, err, violation, deny)
        return m

    def _registers(self, m):
        """The register block on ``s_axil`` and its ``info``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(MP_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        m.d.comb += [f["info"]["regions"].eq(self.regions), f["info"]["qps"].eq(self.qps)]
        return f

    def _tables(self, m, f):
        """The tables: the region table (flip-flops), the staged entry's limit, the per-QP
        domains (distributed RAM) and error bits. Returns ``(table, base, staged_limit, pd_w,
        pd_r, errors)``: ``base`` is the staged base address."""
        qbits = self._qbits
        table = [Signal(_ENTRY, name=f"region{i}") for i in range(self.regions)]
        base = Cat(f["region_base_lo"]["base"], f["region_base_hi"]["base"])
        length = Cat(f["region_length_lo"]["length"], f["region_length_hi"]["length"])
        # The command strobe comes at least one cycle after the last staging write, so the
        # limit can be summed into a register first: no 64-bit adder before the table.
        # The end is clamped at 2^64: a write that runs past 2^64 is out of range even in a
        # region whose length would reach beyond it (no wrap-around, in any region).
        staged_limit = Signal(65)
        total = Signal(65)
        m.d.comb += total.eq(base + length)
        m.d.sync += staged_limit.eq(Mux(total[64], 1 << 64, total))

        # Per-QP domain in distributed RAM (contents kept through a reset, 0 at
        # configuration); error bits in flip-flops: stage C reads and sets them in one cycle.
        # A power-of-two depth: every index a record can carry reads a real word (never X
        # in the Verilog), and a one-QP table still has an address bit.
        m.submodules.pd_mem = pd_mem = Memory(shape=PD_BITS, depth=1 << qbits, init=[])
        pd_w = pd_mem.write_port()
        pd_r = pd_mem.read_port(domain="comb")
        errors = Signal(self.qps)
        return table, base, staged_limit, pd_w, pd_r, errors

    def _table_commands(self, m, f, table, base, staged_limit, pd_w, errors):
        """Table commands, latched and applied on an edge where no record is between A1 and
        A2. Returns ``(pending, apply, qsel, qsel_ok, qcmd)``: a command is latched; apply
        it (driven by :meth:`_stage_a1`); the ``qp_select`` QP, in range; ``qp_command``."""
        R, Q = self.regions, self.qps
        qbits = self._qbits
        # A record compares its R_Key (stage A1) one cycle before it selects the matched
        # entry's fields (A2), so a table write must not land between the two: a command is
        # latched (with a copy of the staged entry, so that software may restage at once)
        # and applied on an edge where no record is between A1 and A2 (the input is held for
        # that cycle). Until then status.busy is set and further table commands are refused
        # (error.busy).
        sel = f["region_select"]["entry"]
        cmd = f["region_command"]
        qsel = f["qp_select"]["qp"]
        qsel_ok = qsel < Q
        qcmd = f["qp_command"]
        region_ok = sel < R
        pending = Signal()
        p_kind = Signal(2)                  # 0 region write, 1 invalidate, 2 set_pd
        p_index = Signal(8)
        p_entry = Signal(_ENTRY)
        p_qp = Signal(qbits)
        p_pd = Signal(PD_BITS)
        region_cmd = cmd["write"] | cmd["invalidate"]
        take_region = region_cmd & region_ok & ~pending
        take_pd = qcmd["set_pd"] & qsel_ok & ~pending & ~region_cmd
        m.d.comb += [
            f["error"]["bad_region_set"].eq(region_cmd & ~region_ok),
            f["error"]["bad_qp_set"].eq((qcmd["set_pd"] | qcmd["clear_error"]) & ~qsel_ok),
            f["error"]["busy_set"].eq((region_cmd & region_ok & pending) |
                                      (qcmd["set_pd"] & qsel_ok & (pending | region_cmd))),
            f["status"]["busy"].eq(pending),
        ]
        with m.If(take_region):
            m.d.sync += [pending.eq(1), p_kind.eq(Mux(cmd["write"], 0, 1)), p_index.eq(sel),
                         p_entry.valid.eq(1), p_entry.rkey.eq(f["region_rkey"]["rkey"]),
                         p_entry.base.eq(base), p_entry.limit.eq(staged_limit),
                         p_entry.writable.eq(f["region_attr"]["writable"]),
                         p_entry.pd.eq(f["region_attr"]["pd"])]
        with m.If(take_pd):
            m.d.sync += [pending.eq(1), p_kind.eq(2), p_qp.eq(qsel[:qbits]),
                         p_pd.eq(f["qp_pd"]["pd"])]
        apply = Signal()
        for i, e in enumerate(table):
            with m.If(apply & (p_index == i)):
                with m.If(p_kind == 0):
                    m.d.sync += e.eq(p_entry)
                with m.Elif(p_kind == 1):
                    m.d.sync += e.valid.eq(0)
        with m.If(apply):
            m.d.sync += pending.eq(0)
        m.d.comb += [
            pd_w.addr.eq(p_qp), pd_w.data.eq(p_pd), pd_w.en.eq(apply & (p_kind == 2)),
            f["qp_status"]["error"].eq(qsel_ok & errors.bit_select(qsel[:qbits], 1)),
        ]
        return pending, apply, qsel, qsel_ok, qcmd

    def _input(self, m):
        """The input skid buffer. Returns ``(skid, advance)``: the buffer, and the enable of
        every stage (driven by :meth:`_stage_c`)."""
        m.submodules.skid = skid = MetaSkidBuffer(RX_PKT)
        wiring.connect(m, wiring.flipped(self.pkt), skid.i)

        # Every stage moves together: only the output FIFOs stop the pipeline. Stage C
        # writes when both FIFOs have room (a violation needs the nak FIFO), so `advance`
        # depends on FIFO levels only, not on the decision.
        advance = Signal()
        return skid, advance

    def _stage_a1(self, m, table, pd_r, pending, apply, skid, advance):
        """Stage A1: the R_Key against every entry (CAM), the lowest match as a one-hot
        vector, the QP's domain read, the end summed; drives the input's ready and
        ``apply``. Returns ``(x, x_valid)``."""
        R, Q = self.regions, self.qps
        qbits = self._qbits
        a = skid.o.payload
        op = a.opcode
        is_write = (op >= Opcode.WRITE_FIRST) & (op <= Opcode.WRITE_ONLY_IMM)
        match = Signal(R)
        m.d.comb += match.eq(Cat(*(e.valid & (e.rkey == a.rkey) for e in table)))
        # Lowest index wins, as a one-hot vector for the AND-OR select of stage A2.
        first = Signal(R)
        m.d.comb += first.eq(Cat(*(match[i] & ~match[:i].any() if i else match[0]
                                   for i in range(R))))
        m.d.comb += pd_r.addr.eq(a.qp[:qbits])
        X_STAGE = data.StructLayout({"rec": RX_PKT, "qp_ok": 1, "checked": 1, "hit": 1,
                                     "first": R, "qp_pd": PD_BITS, "end": 65})
        x = Signal(X_STAGE)
        x_valid = Signal()
        qp_ok_a = a.qp < Q
        # A command is applied on an edge where no record enters X: one held input cycle.
        take_in = advance & ~pending
        m.d.comb += [skid.o.ready.eq(take_in), apply.eq(pending & advance)]
        with m.If(advance):
            m.d.sync += [
                x_valid.eq(skid.o.valid & ~pending),
                x.rec.eq(a), x.qp_ok.eq(qp_ok_a),
                x.checked.eq(qp_ok_a & is_write & ~a.trimmed),
                x.hit.eq(match.any()), x.first.eq(first),
                x.qp_pd.eq(pd_r.data), x.end.eq(a.va + a.length),
            ]
        return x, x_valid

    def _stage_a2(self, m, table, x, x_valid, advance):
        """Stage A2: the matched entry's fields (AND-OR over the one-hot match). Returns
        ``(b, b_valid)``."""
        hit_entry = Signal(_ENTRY)
        acc = Const(0, _ENTRY.size)
        for i, e in enumerate(table):
            acc = acc | Mux(x.first[i], e.as_value(), 0)
        m.d.comb += hit_entry.eq(acc)
        B_STAGE = data.StructLayout({
            "rec": RX_PKT, "qp_ok": 1, "checked": 1, "hit": 1, "base": 64, "limit": 65,
            "writable": 1, "region_pd": PD_BITS, "qp_pd": PD_BITS, "end": 65,
        })
        b = Signal(B_STAGE)
        b_valid = Signal()
        with m.If(advance):
            m.d.sync += [
                b_valid.eq(x_valid),
                b.rec.eq(x.rec), b.qp_ok.eq(x.qp_ok), b.checked.eq(x.checked),
                b.hit.eq(x.hit), b.base.eq(hit_entry.base), b.limit.eq(hit_entry.limit),
                b.writable.eq(hit_entry.writable), b.region_pd.eq(hit_entry.pd),
                b.qp_pd.eq(x.qp_pd), b.end.eq(x.end),
            ]
        return b, b_valid

    def _stage_b(self, m, b, b_valid, advance):
        """Stage B: the range and domain compares, the cause. Returns ``(c, c_valid)``."""
        cause_b = Signal(_CAUSE)
        pd_ok = b.region_pd == b.qp_pd
        m.d.comb += [
            cause_b.unknown_rkey.eq(~b.hit),
            cause_b.pd_mismatch.eq(b.hit & ~pd_ok),
            cause_b.read_only.eq(b.hit & pd_ok & ~b.writable),
            cause_b.out_of_range.eq(b.hit & pd_ok & b.writable &
                                    ((b.rec.va < b.base) | (b.end > b.limit))),
        ]
        C_STAGE = data.StructLayout({"rec": RX_PKT, "qp_ok": 1, "checked": 1,
                                     "cause": _CAUSE})
        c = Signal(C_STAGE)
        c_valid = Signal()
        with m.If(advance):
            m.d.sync += [c_valid.eq(b_valid), c.rec.eq(b.rec), c.qp_ok.eq(b.qp_ok),
                         c.checked.eq(b.checked), c.cause.eq(cause_b)]
        return c, c_valid

    def _stage_c(self, m, c, c_valid, advance, errors, qsel, qsel_ok, qcmd):
        """Stage C: the error bit, the decision, the out and nak FIFOs; drives ``advance``
        and the error bits. Returns ``(fire, err, violation, deny)``."""
        Q = self.qps
        qbits = self._qbits
        # The error bits are read and set here only, so the record behind sees the bit this
        # one sets; the carry chains of stage B end in registers before this.
        cause = c.cause
        err = Signal()
        m.d.comb += err.eq(c.qp_ok & errors.bit_select(c.rec.qp[:qbits], 1))
        violation = Signal()
        m.d.comb += violation.eq(c.checked & ~err & cause.as_value().any())
        deny = err | violation

        out_fifo = output_fifo(m, "out_fifo", self.out)
        nak_fifo = output_fifo(m, "nak_fifo", self.nak)
        # `advance` enables every pipeline register and the table writes: a flip-flop, not
        # logic behind the FIFO levels, so that the fan-out starts at a register. Both FIFOs
        # keep room for this cycle's write and one more when it is set.
        m.d.sync += advance.eq((out_fifo.level <= FIFO_DEPTH - 3) &
                               (nak_fifo.level <= FIFO_DEPTH - 3))
        fire = Signal()
        m.d.comb += [
            fire.eq(c_valid & advance),
            out_fifo.w_en.eq(fire),
            nak_fifo.w_en.eq(fire & violation),
        ]
        out_rec = Signal(MP_OUT)
        for name, _ in RX_PKT:
            m.d.comb += getattr(out_rec, name).eq(getattr(c.rec, name))
        m.d.comb += [
            out_rec.deny.eq(deny), out_fifo.w_data.eq(out_rec),
            nak_fifo.w_data.eq(Cat(c.rec.qp, c.rec.psn,
                                   Const(proto.AETH_SYNDROME_ACCESS_ERROR, 8))),
        ]
        # Error bits: a violation sets its QP's; a software clear of the same QP on the
        # same edge loses, so that no violation goes unrecorded.
        set_mask = Signal(Q)
        clr_mask = Signal(Q)
        m.d.comb += [
            set_mask.eq(Mux(fire & violation, Const(1, Q) << c.rec.qp[:qbits], 0)),
            clr_mask.eq(Mux(qcmd["clear_error"] & qsel_ok, Const(1, Q) << qsel[:qbits], 0)),
        ]
        m.d.sync += errors.eq((errors & ~clr_mask) | set_mask)
        return fire, err, violation, deny

    def _counters(self, m, f, c, fire, err, violation, deny):
        """The event counters (:data:`MP_COUNTERS`)."""
        cause = c.cause
        ev = Signal(data.StructLayout({n: 1 for n in MP_COUNTERS}))
        m.d.comb += [
            ev.records.eq(fire), ev.checked.eq(fire & c.checked & ~err),
            ev.denied.eq(fire & deny), ev.qp_in_error.eq(fire & err),
            ev.naks.eq(fire & violation),
            *[getattr(ev, n).eq(fire & violation & getattr(cause, n)) for n in CAUSES],
        ]
        event_counters(m, f, ev, MP_COUNTERS, f["control"]["clear"], width=self.counter_width)


async def table_op(drv, op):
    """Software: one table operation through a :class:`~mrcnic.host.driver.RegisterDriver` on
    :data:`MP_REGS`, as :func:`mrcnic.model.rx.memory_protect.apply_op` names them:
    ``("region", index, rkey, base, length, writable, pd)``, ``("invalidate", index)``,
    ``("pd", qp, pd)``, ``("clear_error", qp)``. A region is staged field by field and
    committed by one ``write`` strobe, so traffic never sees half an entry."""
    kind, *args = op
    if kind == "region":
        index, rkey, base, length, writable, pd = args
        await drv.write_fields("region_select", entry=index)
        await drv.write_fields("region_rkey", rkey=rkey)
        await drv.write_fields("region_base_lo", base=base & 0xFFFFFFFF)
        await drv.write_fields("region_base_hi", base=base >> 32)
        await drv.write_fields("region_length_lo", length=length & 0xFFFFFFFF)
        await drv.write_fields("region_length_hi", length=length >> 32)
        await drv.write_fields("region_attr", writable=writable, pd=pd)
        await drv.write_fields("region_command", write=1)
    elif kind == "invalidate":
        await drv.write_fields("region_select", entry=args[0])
        await drv.write_fields("region_command", invalidate=1)
    elif kind == "pd":
        await drv.write_fields("qp_select", qp=args[0])
        await drv.write_fields("qp_pd", pd=args[1])
        await drv.write_fields("qp_command", set_pd=1)
    elif kind == "clear_error":
        await drv.write_fields("qp_select", qp=args[0])
        await drv.write_fields("qp_command", clear_error=1)
    else:
        raise ValueError(f"unknown table operation {op!r}")
    if kind != "clear_error":           # done when applied: the next op comes after it
        await drv.wait_clear("status", "busy")


def output_fifo(m, name, o):
    """A ``SyncFIFOBuffered`` of :data:`FIFO_DEPTH` records feeding the component's own
    output stream ``o``; the caller drives ``w_data``/``w_en`` and reads ``w_rdy``
    (:func:`~mrcnic.base.stream.stream_fifo` wants a stream on the write side too; here it is a
    pipeline stage that writes two FIFOs on one condition)."""
    fifo = SyncFIFOBuffered(width=len(o.payload.as_value()), depth=FIFO_DEPTH)
    m.submodules[name] = fifo
    m.d.comb += [o.payload.eq(fifo.r_data), o.valid.eq(fifo.r_rdy), fifo.r_en.eq(o.ready)]
    return fifo


