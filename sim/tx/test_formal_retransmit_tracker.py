"""Formal checks of RetransmitTracker (bounded, SymbiYosys + z3): a PSN is never released
before it is acknowledged, an acknowledged PSN is never requested for retransmission, and a
PSN whose retransmission was requested is not requested again by a NACK or a SACK hole
before its resend is taken."""

import pytest
from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume, Module, Mux, Signal
from amaranth.lib import wiring

from mrcnic.base import proto
from mrcnic.base.records import RtxCause
from mrcnic.flow.formal import prove, prove_not_vacuous
from mrcnic.tx.retransmit_tracker import RT_REGS, RetransmitTracker

PSN = proto.PSN_BITS
HALF = 1 << (PSN - 1)


class GuardOneTracker(RetransmitTracker):
    """The tracker with ``reorder_guard`` 1 after reset (3 by default): a SACK that
    acknowledges the second PSN sent finds the first a hole, two cycles earlier than with
    the default, so the check reaches a hole's request two steps sooner."""
    regs = RT_REGS.with_resets({"config": {"reorder_guard": 1}})


def at_or_after(a, b):
    """``a`` at or after ``b`` (mod 2^24)."""
    return ~(a - b)[PSN - 1]


class NeverReleasedOrResentWhenAcked(wiring.Component):
    """RetransmitTracker (1 QP, 128 outstanding, reorder_guard 1 from reset) with every
    input free except: sent records are new PSNs in order, from 0 (the sender's own counter ``sent_n``), or retransmissions
    (rtx = 1) of a PSN before ``sent_n``; SACKs name a CACK
    before ``sent_n`` that never moves back and bitmap bits only for PSNs before
    ``sent_n`` (a well-behaved receiver); NACKs, ``now``, send times, EVs and
    backpressure are free. For any PSN ``x`` (AnyConst): once an accepted-at-the-input SACK
    covers ``x`` (CACK at or after it, or its bit), no retransmit request for ``x`` enters
    the output FIFO; and a release record that covers ``x`` enters its FIFO only after some
    SACK taken at the input had CACK at or after ``x``. And once a request for ``x`` entered
    the FIFO, no NACK or HOLE request for ``x`` enters it until a retransmission of ``x``
    is taken at ``sent`` (or the QP is opened): the pending table has 8 entries, more than
    the requests the depth allows, so it is never full here.

    With ``claim_unreachable``, it asserts instead that no request of cause ``reach`` is
    ever made (for ``x`` when TIMEOUT, for any PSN when HOLE): that one must fail, which
    shows the checks are not vacuous within the depth (time passes, records are written,
    the scan runs; or a SACK's hole goes through the hole engine)."""

    def __init__(self, claim_unreachable=False, reach=RtxCause.TIMEOUT):
        self.dut = GuardOneTracker(qps=1, outstanding=128, tag_width=1, pending=8,
                                   counter_width=0)
        self.claim_unreachable = claim_unreachable
        self.reach = reach
        # mrcnic.flow.formal.StreamRules takes stream and AXI4-Lite members only: the plain
        # ports (now, credit_qp, credit_ready) are driven and read inside.
        super().__init__(wiring.Signature({
            name: member for name, member in self.dut.signature.members.items()
            if not member.is_port}))

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        m.submodules.dut = dut.elaborate(platform)
        for name, member in dut.signature.members.items():
            inner = getattr(dut, name)
            if member.is_port:
                if member.flow == wiring.In:
                    m.d.comb += inner.eq(AnySeq(len(inner)))
            elif member.flow == wiring.In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), inner)
            else:
                wiring.connect(m, inner, wiring.flipped(getattr(self, name)))
        x = AnyConst(PSN)
        m.d.comb += Assume(x < 64)

        # The sender: new PSNs in order, and retransmissions of PSNs already sent.
        sent_n = Signal(PSN)
        s = self.sent
        m.d.comb += Assume(~s.valid | ((s.payload.qp == 0) &
                                       Mux(s.payload.rtx, s.payload.psn < sent_n,
                                           s.payload.psn == sent_n)))
        with m.If(s.valid & s.ready & ~s.payload.rtx):
            m.d.sync += sent_n.eq(sent_n + 1)
        # A retransmission counts as recorded when the sent path judges it (probe
        # "sent_go"), in the order the tracker applies records, not when the port takes it.
        pr = dut.probe
        resent_x = pr["sent_go"] & pr["sent"].rtx & (pr["sent"].psn == x)

        # The receiver: SACKs before sent_n, CACK never moving back; any NACK.
        a = self.ack
        p = a.payload
        max_c = Signal(PSN, init=(1 << PSN) - 1)
        base = Signal(PSN)
        m.d.comb += base.eq(p.cack + 1)
        m.d.comb += Assume(~a.valid | (p.qp == 0))
        with m.If(a.valid & ~p.nack):
            m.d.comb += [
                Assume(p.sack_offset == 1),
                Assume(at_or_after(p.cack, max_c)),
                Assume((sent_n - p.cack)[:PSN] != 0),
                Assume(~(sent_n - p.cack)[PSN - 1]),
                # Bitmap bits only for PSNs before sent_n.
                Assume((p.bitmap >> Mux((sent_n - base)[:PSN] < 64,
                                        (sent_n - base)[:7], 64)) == 0),
            ]
        taken = a.valid & a.ready & ~p.nack
        covers_c = taken & at_or_after(p.cack, x) & ~at_or_after(p.cack, x + HALF)
        rel = Signal(PSN)
        m.d.comb += rel.eq(x - base)
        covers_bit = taken & (rel < 64) & p.bitmap.bit_select(rel[:6], 1)
        cacked = Signal()
        acked = Signal()
        with m.If(taken):
            m.d.sync += max_c.eq(p.cack)
        with m.If(covers_c):
            m.d.sync += cacked.eq(1)
        # x counts as acknowledged once the covering SACK is applied (probe "applied": an
        # ack record applied, in the order taken): the records taken before it may still
        # request x until then.
        applied = pr["applied"]
        inflight = Signal(3)             # ack records taken, not yet applied
        m.d.sync += inflight.eq(inflight + (a.valid & a.ready) - applied)
        wait = Signal(3)                 # applications until the covering SACK's own
        with m.If((covers_c | covers_bit) & ~acked & (wait == 0)):
            m.d.sync += wait.eq(inflight + 1 - applied)
        with m.Elif((wait != 0) & applied):
            m.d.sync += wait.eq(wait - 1)
            with m.If(wait == 1):
                m.d.sync += acked.eq(1)
        asked = Signal()                # a request for x made, its resend not yet taken
        req_x = pr["rtx_we"] & (pr["rtx"].psn == x)
        m.d.sync += asked.eq(req_x | (asked & ~resent_x & ~pr["open"]))
        if self.claim_unreachable:
            which = pr["rtx"].psn == x if self.reach == RtxCause.TIMEOUT else 1
            m.d.comb += Assert(~(pr["rtx_we"] & which & (pr["rtx"].cause == self.reach)))
        else:
            with m.If(req_x):
                m.d.comb += Assert(~acked)
            with m.If(req_x & (pr["rtx"].cause != RtxCause.TIMEOUT)):
                m.d.comb += Assert(~asked)
            r = pr["release"]
            with m.If(pr["release_we"] & at_or_after(x, r.first) & at_or_after(r.last, x)):
                m.d.comb += Assert(cacked)
        return m


# Depth 12 (about a minute and a half of CPU with Yices): the reset sweep, PSNs sent, SACKs and NACKs
# taken and applied, NACK requests and timeout requests written into the FIFO (the timer
# decides in its fourth stage), two NACKs for one PSN (the pending check fails at step 3
# without the table), and a SACK hole's request: it needs reorder_guard + 1 = 2 PSNs sent
# before the SACK that reports it (the guard 1 from reset, GuardOneTracker), and comes 9
# cycles after the SACK is taken (step 11). The tracker's counters are left out
# (counter_width 0: they add state, not behaviour). make soak runs depth 14. Both unreachability claims must fail within the depth: a
# timeout request for x, and a SACK hole request for any PSN.
@pytest.mark.formal
@pytest.mark.parametrize("depth", [12, pytest.param(14, marks=pytest.mark.soak)])
def test_formal_never_released_or_resent_once_acknowledged(tmp_path, depth):
    prove_not_vacuous(NeverReleasedOrResentWhenAcked, "rt_acked", depth, tmp_path)
    hole = NeverReleasedOrResentWhenAcked(claim_unreachable=True, reach=RtxCause.HOLE)
    with pytest.raises(AssertionError, match=r"DONE \(FAIL"):
        prove(hole, "rt_hole", depth, tmp_path / "hole")
