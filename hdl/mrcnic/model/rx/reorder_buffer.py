"""Reference model of the reorder buffer (``ReorderBuffer``): one flow's packets in, in any PSN
order; out in PSN order.

It keeps what the block means, not how it is built: a dictionary of the packets held, keyed
by PSN, and the next PSN to release. Every call is one event, taken whole and in order:

* :meth:`ReorderModel.packet` judges a packet against the window ``[expected, expected +
  depth)`` (PSNs modulo 2^24): ``bad`` (``tuser[0]``) first, then ``too_long`` (more than
  ``max_packet`` bytes), then ``duplicate`` (before ``expected``, or that PSN already held),
  then ``out_of_window`` (at or beyond ``expected + depth``), else ``stored``;
* :meth:`ReorderModel.skip` ("this PSN is lost") moves ``expected`` on by one when it names
  ``expected`` (which is then never held, see below): ``skipped``; any other PSN:
  ``skip_ignored``;
* after each event every held packet from ``expected`` on is released at once, in order, so
  ``expected`` is always the first PSN not held. :meth:`ReorderModel.release` hands the
  released packets over.

"Before" follows the spec (§5): ``a`` is at or after ``b`` when ``(a - b) mod 2^24`` is below
2^23; a PSN exactly 2^23 from ``expected`` counts as before it.

The block itself judges a packet at its first beat against a window whose base may trail the
model's (a packet waiting to leave still holds its slot); ``docs/blocks/reorder-buffer.md``
says when the two agree exactly and the tests keep to that.
"""

PSN_MOD = 1 << 24
HALF = PSN_MOD >> 1

__all__ = ["ReorderModel", "COUNTERS", "VERDICTS", "random_traffic", "wait_for"]

VERDICTS = ("stored", "duplicate", "out_of_window", "too_long", "bad")
COUNTERS = ("packets_in", "released", "duplicates", "out_of_window", "too_long", "bad",
            "skipped", "skip_ignored")
_COUNTER_OF = {"duplicate": "duplicates", "out_of_window": "out_of_window",
               "too_long": "too_long", "bad": "bad"}


class ReorderModel:
    """``depth`` slots of up to ``max_packet`` bytes; ``expected``: the first PSN to release."""

    def __init__(self, depth, max_packet, expected=0):
        if depth < 1 or max_packet < 1:
            raise ValueError("depth and max_packet must be positive")
        self.depth = depth
        self.max_packet = max_packet
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.history = []           # (psn, "released" or "skipped"), in order, kept across
        self.restart(expected)      # restarts

    def restart(self, expected):
        """Empty the buffer; ``expected`` is the next PSN to release. Counters are kept."""
        if not 0 <= expected < PSN_MOD:
            raise ValueError(f"PSN {expected!r} does not fit 24 bits")
        self.expected = expected
        self.held = {}              # PSN -> bytes, every key in the window
        self.out = []               # released, not yet handed over by release()
        self._since = len(self.history)     # where the current run's decisions start

    @property
    def occupancy(self):
        return len(self.held)

    def offset(self, psn):
        """``(psn - expected) mod 2^24``."""
        return (psn - self.expected) % PSN_MOD

    def judge(self, psn, length, bad=False):
        """The verdict :meth:`packet` would give, without changing anything."""
        if bad:
            return "bad"
        if length > self.max_packet:
            return "too_long"
        d = self.offset(psn)
        if d >= HALF or psn in self.held:
            return "duplicate"
        if d >= self.depth:
            return "out_of_window"
        return "stored"

    def packet(self, psn, data, bad=False):
        if not 0 <= psn < PSN_MOD:
            raise ValueError(f"PSN {psn!r} does not fit 24 bits")
        data = bytes(data)
        if not data:
            raise ValueError("a packet has at least one byte")
        verdict = self.judge(psn, len(data), bad)
        self.counters["packets_in"] += 1
        if verdict == "stored":
            self.held[psn] = data
            self._drain()
        else:
            self.counters[_COUNTER_OF[verdict]] += 1
        return verdict

    def skip(self, psn):
        if psn == self.expected:
            assert psn not in self.held          # _drain leaves expected empty
            self.history.append((psn, "skipped"))
            self.expected = (self.expected + 1) % PSN_MOD
            self.counters["skipped"] += 1
            self._drain()
            return "skipped"
        self.counters["skip_ignored"] += 1
        return "skip_ignored"

    def release(self):
        """``[(psn, bytes)]`` released since the last call, in release order."""
        out, self.out = self.out, []
        return out

    def _drain(self):
        while self.expected in self.held:
            psn = self.expected
            self.out.append((psn, self.held.pop(psn)))
            self.history.append((psn, "released"))
            self.counters["released"] += 1
            self.expected = (psn + 1) % PSN_MOD


def wait_for(model, psn, length=1, bad=False):
    """How many released packets (counted since ``model`` was made) a consumer must have
    taken before a packet ``psn`` is sent, for the block to judge it as ``model`` would
    now: the block's window starts at the oldest PSN not yet read out of its RAM, the
    model's at the first PSN not released. 0 unless the model would store it."""
    if model.judge(psn, length, bad) != "stored":
        return 0
    return _released_upto(model, (psn - model.depth) % PSN_MOD)


def _released_upto(model, psn):
    """Packets released, over the model's whole history, up to and including the decision
    on ``psn`` in the current run (all of them before the run if ``psn`` is not there)."""
    hist = model.history
    back = (model.expected - 1 - psn) % PSN_MOD          # decisions after psn's
    idx = len(hist) - 1 - back
    if back >= HALF or idx < model._since:
        idx = model._since - 1
    return sum(1 for _, kind in hist[:idx + 1] if kind == "released")


def random_traffic(rng, model, count, *, beat_bytes, loss=0.05, dup=0.06, oow=0.04,
                   bad=0.04, too_long=0.03, skip_other=0.03, late=0.4, lengths=None):
    """``count`` random packets (and the skips they need) for ``model``'s window, judged by
    ``model`` as they are made (it is advanced). Good packets come in a random order within
    the window; a fraction ``loss`` of PSNs is never sent until skipped (and a fraction
    ``late`` of those comes afterwards, a duplicate); duplicates, out-of-window, bad and
    too-long packets and ignored skips are mixed in at the given rates.

    Items: ``("packet", psn, data, bad, verdict, need)`` and ``("skip", psn, verdict)``.
    ``need`` is the number of released packets (counted since the model was made) the
    consumer must have taken before a packet may be sent so that the block, whose window
    trails the model's while released packets wait to leave, judges it exactly as the
    model did (0 when it does not matter). A skip is sent after the packet before it has
    been accepted whole, and the packet after it only once the skip was taken.
    """
    D, P, B = model.depth, model.max_packet, beat_bytes
    lengths = lengths or (lambda: rng.choice([
        rng.randint(1, B), rng.randint(1, P), rng.randint(1, min(P, 3 * B)), P,
        B * rng.randint(1, P // B), min(P, B * rng.randint(1, P // B) + 1)]))
    items, pending, lost, gone = [], [], set(), []
    nxt = model.expected
    packets = 0

    def send(psn, data, is_bad=False):
        need = wait_for(model, psn, len(data), is_bad)
        verdict = model.packet(psn, data, is_bad)
        items.append(("packet", psn, bytes(data), is_bad, verdict, need))

    while packets < count:
        while model.offset(nxt) < D and model.offset(nxt) < HALF:
            (lost.add if rng.random() < loss else pending.append)(nxt)
            nxt = (nxt + 1) % PSN_MOD
        r = rng.random()
        if model.expected in lost and (not pending or rng.random() < 0.3):
            psn = model.expected
            lost.discard(psn)
            items.append(("skip", psn, model.skip(psn)))
            if rng.random() < late:
                gone.append(psn)
            continue
        if r < skip_other:
            off = rng.choice([rng.randint(1, 2 * D), -rng.randint(1, 2 * D)])
            psn = (model.expected + off) % PSN_MOD
            items.append(("skip", psn, model.skip(psn)))
            continue
        r -= skip_other
        packets += 1
        if r < dup and (gone or model.history or model.held):
            choices = gone + [p for p, _ in model.history[-2 * D:]] + list(model.held)
            psn = rng.choice(choices)
            if psn in gone:
                gone.remove(psn)
            send(psn, rng.randbytes(lengths()))
        elif r < dup + oow:
            psn = (model.expected + D + rng.randrange(3 * D)) % PSN_MOD
            send(psn, rng.randbytes(lengths()))
        elif r < dup + oow + bad + too_long:
            # Whatever the PSN: a pending one (it comes again, good), or any near the window.
            psn = rng.choice(pending) if pending and rng.random() < 0.8 else \
                (model.expected + rng.randrange(-D, 2 * D)) % PSN_MOD
            if r < dup + oow + bad:
                send(psn, rng.randbytes(lengths()), True)
            else:
                send(psn, rng.randbytes(P + rng.randint(1, 2 * B)))
        elif pending:
            psn = pending.pop(rng.randrange(len(pending)))
            send(psn, rng.randbytes(lengths()))
        else:
            packets -= 1
    return items
