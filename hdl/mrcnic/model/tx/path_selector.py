"""Reference model of the transmit path selector (``PathSelector``), decision by decision.

The policy of spec §4 as plain Python: EV states per profile, the QP's scan order (EV
``j XOR seed`` at position ``j``), the pointer that moves past each chosen EV, the end of a
rotation (SKIP back to GOOD, reseed), feedback transitions, ``ev_min_active`` with backup
promotion, events. Expanded EVs come from :mod:`mrcnic.model.ev`.

The block is pipelined, so *when* a state change reaches a decision is part of its
behaviour; the model takes every input with the cycle it was accepted in and applies the
block's documented timing (module docstring of :mod:`mrcnic.tx.path_selector`):

* a request accepted in cycle t takes its snapshot of the usable EVs and the QP's seed in
  cycle t+1 (state as it stands at the start of t+1, port inputs of cycle t), is decided
  in t+3 (the QP's pointer), and is checked again in t+4 (revoked if its EV is no longer
  usable);
* a rotation that ends in cycle x clears the profile's SKIP EVs in cycle x+1;
* a feedback record accepted in cycle f is matched to the QP's probe in f+1 and changes
  the state in f+2, after that cycle's SKIP clear;
* probes (:meth:`PathSelectorModel.next_probe`): the probe round visits one QP a cycle
  while it finds none to probe, and after each probe waits ``probe_interval`` cycles, so
  the k-th probe leaves ``probe_interval`` + (QPs passed over) cycles after the one before
  (with room in the block's probe FIFO).

Everything else (which EV, which transition, which backup) is the policy itself and is
written here without reference to the gateware.
"""

from collections import defaultdict

from mrcnic.base import proto
from mrcnic.base.records import PROBE_KINDS, FeedbackKind
from mrcnic.base.rules import EVENT_MASK_DEFAULT, RESEED_MULT
from mrcnic.base.proto import EvMode, EvState
from mrcnic.model import ev as evm

__all__ = ["PathSelectorModel", "plane_of", "transition", "reseed", "entropy_of",
           "random_feedback",
           "SAMPLE_AT", "DECIDE_AT", "CHECK_AT", "FEEDBACK_AT"]

SAMPLE_AT, DECIDE_AT, CHECK_AT = 1, 3, 4       # cycles after a request is accepted
MATCH_AT, FEEDBACK_AT = 1, 2                    # cycles after a feedback is accepted


def plane_of(ev, planes):
    """The plane (port) of EV index ``ev``."""
    return ev % planes


def transition(state, kind):
    """The §4 state after feedback ``kind`` on an EV in ``state``; None for a kind that is
    not a :class:`FeedbackKind`."""
    if kind not in FeedbackKind._value2member_map_:
        return None
    k = FeedbackKind(kind)
    s = EvState(state)
    if s == EvState.DENIED:                 # only the controller lifts DENIED
        return s
    if k in (FeedbackKind.SKIP_ONCE, FeedbackKind.TRIMMED):
        return EvState.SKIP if s == EvState.GOOD else s
    if k in (FeedbackKind.ALWAYS_SKIP, FeedbackKind.TIMEOUT, FeedbackKind.PROBE_BAD):
        return EvState.ASSUMED_BAD
    if k == FeedbackKind.PROBE_GOOD:
        return EvState.GOOD
    if k == FeedbackKind.PROBE_SKIP:
        return EvState.SKIP
    return s                                # ACKED, TRIMMED_LASTHOP, RESOURCE


def reseed(seed, stride, ev_count, planes):
    """The seed a QP takes when its rotation ends: the low log2(planes) bits kept (the plane
    round robin goes on), the rest stepped by ``RESEED_MULT * x + stride``."""
    pb = planes.bit_length() - 1
    hb = (ev_count.bit_length() - 1) - pb
    if stride == 0 or hb == 0:
        return seed
    hi = (RESEED_MULT * (seed >> pb) + stride) & ((1 << hb) - 1)
    return (hi << pb) | (seed & ((1 << pb) - 1))


def entropy_of(mode, expanded, ev, ev_bits):
    """The 32-bit entropy of EV ``ev`` (§2.3): STEV the EV's 32 bits, UDP its 16 bits,
    SRv6 the EV index (:func:`~mrcnic.base.proto.srv6_entropy`). ``expanded`` is the first
    ``ev_bits`` bits of the expanded EV."""
    if mode == EvMode.STEV:
        return expanded >> (ev_bits - 32)
    if mode == EvMode.UDP:
        return expanded >> (ev_bits - 16)
    return proto.srv6_entropy(ev)


def _healthy(state):
    return state in (EvState.GOOD, EvState.SKIP)


class _Profile:
    def __init__(self, n):
        self.ev_profile = None
        self.active_count = n
        self.event_mask = EVENT_MASK_DEFAULT
        self.state = [EvState.GOOD] * n
        self.loaded = [False] * n
        self.active = [False] * n
        self.expanded = [0] * n


class PathSelectorModel:
    """Parameters as the block's; ``ev_min_active``, ``reseed_stride`` and ``admin`` as its
    registers."""

    def __init__(self, qps=64, ev_count=256, planes=8, profiles=4, ev_bits=256, *,
                 ev_min_active=0, reseed_stride=1):
        self.qps, self.n, self.planes = qps, ev_count, planes
        self.profiles, self.ev_bits = profiles, ev_bits
        self.ev_min_active, self.reseed_stride = ev_min_active, reseed_stride
        self.prof = [_Profile(ev_count) for _ in range(profiles)]
        self.qp_profile = [0] * qps
        self.qp_seed = [0] * qps
        self.qp_ptr = [0] * qps
        self.probe = {}                       # qp -> (ev, entropy) outstanding
        self.probe_qp = 0                     # where the probe round looks next
        self.probe_ptr = [0] * profiles       # per profile: probe at or after this EV
        self.all_ports = (1 << planes) - 1
        self.peer_ports = [self.all_ports] * profiles   # per profile: the peer's ports up
        self.events = []
        self.counts = defaultdict(int)

    # --- Configuration -------------------------------------------------------------------

    def configure_profile(self, p, ev_profile, active=None, event_mask=EVENT_MASK_DEFAULT):
        pr = self.prof[p]
        pr.ev_profile = ev_profile
        pr.active_count = self.n if active is None else active
        pr.event_mask = event_mask

    def load_ev(self, p, e, raw):
        pr = self.prof[p]
        full = evm.expand_int(pr.ev_profile, raw)
        pr.expanded[e] = full >> (evm.EXPANDED_BITS - self.ev_bits)
        pr.loaded[e] = True
        pr.state[e] = EvState.GOOD
        pr.active[e] = e < pr.active_count

    def clear_profile(self, p):
        pr = self.prof[p]
        pr.state = [EvState.GOOD] * self.n
        pr.loaded = [False] * self.n
        pr.active = [False] * self.n
        self.peer_ports[p] = self.all_ports

    def generate(self, p):
        """Clear profile ``p`` and load its generated EVs; returns how many."""
        self.clear_profile(p)
        count = 0
        for e, raw in enumerate(evm.generate(self.prof[p].ev_profile)):
            if e == self.n:
                break
            self.load_ev(p, e, raw)
            count += 1
        return count

    def force(self, p, e, state):
        pr = self.prof[p]
        old = pr.state[e]
        pr.state[e] = EvState(state)
        if state != old:
            self.counts["transitions"] += 1
            self._event(p, e, state)

    def set_qp(self, qp, profile, seed):
        self.qp_profile[qp], self.qp_seed[qp], self.qp_ptr[qp] = profile, seed, 0
        self.probe.pop(qp, None)

    def set_probe(self, qp, ev, entropy):
        """A probe the block sent (it replaces the QP's outstanding one)."""
        self.probe[qp] = (ev, entropy)

    def next_probe(self, live):
        """The block's next probe, with ``live`` the mask of ports enabled and up: the next
        QP of the round (from the one after the last probed) whose profile has an
        ASSUMED_BAD EV on a live port, and of those EVs the first at or after the one after
        the profile's last probed, wrapping. Returns ``(qp, ev, passed)`` (``passed``: QPs
        the round visited and passed over first, a cycle each) and makes it the QP's
        outstanding probe; None when no QP has one (the block's round then keeps moving a
        QP a cycle, so where it starts again depends on the cycle: call :meth:`probe_round`
        with it)."""
        for k in range(self.qps):
            qp = (self.probe_qp + k) % self.qps
            p = self.qp_profile[qp]
            pr = self.prof[p]
            bad = [e for e in range(self.n)
                   if pr.loaded[e] and pr.state[e] == EvState.ASSUMED_BAD
                   and (live & self.peer_ports[p]) >> plane_of(e, self.planes) & 1]
            if bad:
                ev = next((e for e in bad if e >= self.probe_ptr[p]), bad[0])
                self.probe_ptr[p] = ev + 1
                self.probe_qp = (qp + 1) % self.qps
                self.probe[qp] = (ev, self.entropy(p, ev))
                self.counts["probes"] += 1
                return qp, ev, k
        return None

    def announce_round(self, live, port_ok):
        """The announce records of the round that a change of this NIC's live ports (``live``:
        enabled and up) starts, in order: for each QP, one on the first EV of its profile
        usable with the port mask ``port_ok``; a QP with none is passed over."""
        out = []
        for qp in range(self.qps):
            p = self.qp_profile[qp]
            ev = next((e for e in range(self.n) if self._usable(p, e, port_ok)), None)
            if ev is None:
                continue
            self.counts["announcements"] += 1
            out.append({"qp": qp, "ev": ev, "plane": plane_of(ev, self.planes),
                        "entropy": self.entropy(p, ev), "expanded": self.prof[p].expanded[ev],
                        "announce": 1, "ports": live})
        return out

    def probe_round(self, qp):
        """Set where the probe round looks next (the block's after a reset: QP 0)."""
        self.probe_qp = qp

    def healthy_count(self, p):
        pr = self.prof[p]
        return sum(1 for e in range(self.n)
                   if pr.loaded[e] and pr.active[e] and _healthy(pr.state[e]))

    def mode(self, p):
        return self.prof[p].ev_profile.format.mode

    def entropy(self, p, e):
        return entropy_of(self.mode(p), self.prof[p].expanded[e], e, self.ev_bits)

    # --- Policy ----------------------------------------------------------------------------

    def _usable(self, p, e, port_ok):
        pr = self.prof[p]
        return (pr.loaded[e] and pr.active[e] and pr.state[e] == EvState.GOOD
                and (port_ok & self.peer_ports[p]) >> plane_of(e, self.planes) & 1)

    def _event(self, p, e, state):
        if self.prof[p].event_mask >> state & 1:
            self.events.append({"profile": p, "ev": e, "state": int(state), "dropped": 0})
            self.counts["events"] += 1

    def _decide(self, qp, snapshot, seed, avoid):
        """Scan position of the first usable EV at or after the pointer, wrapping."""
        n = self.n
        scan = [snapshot[j ^ seed] and (j ^ seed) != avoid for j in range(n)]
        ptr = self.qp_ptr[qp]
        for j in list(range(ptr, n)) + list(range(ptr)):
            if scan[j]:
                wrapped = j < ptr or j == n - 1
                return j, wrapped
        return None, False

    def _feedback(self, rec, target):
        """F2: apply a matched feedback record; ``target`` = (profile, ev)."""
        p, e = target
        pr = self.prof[p]
        if not pr.loaded[e]:
            self.counts["bad_feedback"] += 1
            return
        old = pr.state[e]
        if old == EvState.DENIED:
            return
        new = transition(old, rec["kind"])
        was_healthy = pr.active[e] and _healthy(old)
        pr.state[e] = new
        if new != old:
            self.counts["transitions"] += 1
            self._event(p, e, new)
        if was_healthy and new == EvState.ASSUMED_BAD:
            # the count before this change, as the block keeps it
            if self.healthy_count(p) + 1 <= self.ev_min_active:
                cands = [k for k in range(plane_of(e, self.planes), self.n, self.planes)
                         if pr.loaded[k] and not pr.active[k] and _healthy(pr.state[k])]
                if cands:
                    pr.active[cands[0]] = True
                    pr.active[e] = False
                    self.counts["promotions"] += 1
                else:
                    self.counts["no_backup"] += 1

    def run(self, requests, feedback, port_ok):
        """Requests and feedback records as ``(cycle accepted, record)`` lists, ``port_ok(c)``
        the mask admin & port_up & credit in cycle c. Returns the responses in order."""
        at = defaultdict(list)                # cycle -> [(order, kind, payload)]
        for i, (t, rec) in enumerate(requests):
            slot = {"rec": rec}
            at[t + SAMPLE_AT].append((0, "sample", slot))
            at[t + CHECK_AT].append((1, "check", slot))
            at[t + DECIDE_AT].append((2, "decide", slot))
        for t, rec in feedback:
            slot = {"rec": rec}
            self.counts["feedback"] += 1
            at[t + MATCH_AT].append((4, "match", slot))
            at[t + FEEDBACK_AT].append((5, "apply", slot))
        self.counts["requests"] += len(requests)
        responses = []
        clear = None                          # profile whose SKIPs clear this cycle
        for x in range(min(at, default=0), max(at, default=-1) + 2):
            next_clear = None
            # order 3: the SKIP clear of a rotation that ended last cycle, before F2
            todo = sorted(at.pop(x, []) + [(3, "clear", None)], key=lambda o: o[0])
            for order, kind, slot in todo:
                if kind == "sample":
                    rec = slot["rec"]
                    qp = rec["qp"]
                    if qp >= self.qps:
                        slot["bad"] = True
                        continue
                    p = self.qp_profile[qp]
                    ok = port_ok(x - 1)
                    slot["p"] = p
                    slot["snap"] = [self._usable(p, e, ok) for e in range(self.n)]
                    slot["seed"] = self.qp_seed[qp]
                elif kind == "decide":
                    if slot.get("bad"):
                        continue
                    rec = slot["rec"]
                    qp = rec["qp"]
                    avoid = rec["avoid"] if rec["rtx"] else -1
                    j, wrapped = self._decide(qp, slot["snap"], slot["seed"], avoid)
                    if j is None:
                        continue
                    slot["ev"] = j ^ slot["seed"]
                    self.qp_ptr[qp] = (j + 1) % self.n
                    if wrapped:
                        self.counts["wraps"] += 1
                        self.qp_seed[qp] = reseed(self.qp_seed[qp], self.reseed_stride,
                                                  self.n, self.planes)
                        next_clear = slot["p"]
                elif kind == "check":
                    rec = slot["rec"]
                    out = {"qp": rec["qp"], "psn": rec["psn"], "rtx": rec["rtx"], "none": 1,
                           "ev": 0, "plane": 0, "entropy": 0, "expanded": 0}
                    if slot.get("bad"):
                        self.counts["bad_request"] += 1
                    elif "ev" not in slot:
                        self.counts["no_path"] += 1
                    elif not self._usable(slot["p"], slot["ev"], port_ok(x - 1)):
                        self.counts["revoked"] += 1
                    else:
                        p, e = slot["p"], slot["ev"]
                        self.counts["decisions"] += 1
                        out.update(none=0, ev=e, plane=plane_of(e, self.planes),
                                   entropy=self.entropy(p, e),
                                   expanded=self.prof[p].expanded[e])
                    responses.append(out)
                elif kind == "clear":
                    if clear is not None:
                        pr = self.prof[clear]
                        pr.state = [EvState.GOOD if s == EvState.SKIP else s
                                    for s in pr.state]
                elif kind == "match":
                    rec = slot["rec"]
                    qp, k = rec["qp"], rec["kind"]
                    if qp >= self.qps or k not in FeedbackKind._value2member_map_ or (
                            k not in PROBE_KINDS and k != FeedbackKind.PEER_PORTS
                            and rec["ev"] >= self.n):
                        self.counts["bad_feedback"] += 1
                        continue
                    if k == FeedbackKind.PEER_PORTS:
                        slot["peer"] = (self.qp_profile[qp], rec["entropy"] & self.all_ports)
                    elif k in PROBE_KINDS:
                        probe = self.probe.get(qp)
                        if probe is None or probe[1] != rec["entropy"]:
                            self.counts["stale_probe"] += 1
                            continue
                        del self.probe[qp]
                        slot["target"] = (self.qp_profile[qp], probe[0])
                    else:
                        slot["target"] = (self.qp_profile[qp], rec["ev"])
                elif kind == "apply":
                    if "peer" in slot:
                        p, ports = slot["peer"]
                        self.peer_ports[p] = ports
                        self.counts["peer_updates"] += 1
                    elif "target" in slot:
                        self._feedback(slot["rec"], slot["target"])
            clear = next_clear
        return responses


def random_feedback(rng, n_ev, qps, count, idle=0.3):
    """``count`` random feedback records (None = an idle slot) for benches: mostly ACKs and
    congestion marks, some failures, stray probe answers, peer port updates (all up or one
    down), and a few records naming a QP, EV or kind out of range."""
    kinds = ([FeedbackKind.ACKED] * 6 + [FeedbackKind.SKIP_ONCE, FeedbackKind.TRIMMED] * 3 +
             [FeedbackKind.TRIMMED_LASTHOP, FeedbackKind.RESOURCE, FeedbackKind.TIMEOUT,
              FeedbackKind.ALWAYS_SKIP, FeedbackKind.PROBE_GOOD, FeedbackKind.PEER_PORTS, 12])
    out = []
    for _ in range(count):
        if rng.random() < idle:
            out.append(None)
            continue
        qp = rng.randrange(qps + 1) if rng.random() < 0.05 else rng.randrange(qps)
        ev = rng.randrange(min(n_ev + 2, 256)) if rng.random() < 0.05 else rng.randrange(n_ev)
        kind = rng.choice(kinds)
        entropy = rng.getrandbits(32)
        if kind == FeedbackKind.PEER_PORTS:    # all the peer's ports up, or one down
            entropy = 0xFFFFFFFF ^ (entropy >> 31 << (entropy & 7))
        out.append({"qp": qp, "ev": ev, "kind": int(kind), "entropy": entropy})
    return out
