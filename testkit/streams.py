"""AXI-Stream and metadata-stream drivers for Amaranth-simulator testbenches.

``AxisSource`` sends frames (``bytes``) beat by beat with seeded random idle cycles,
``AxisSink`` collects frames with seeded random backpressure and records the cycle of every
accepted beat, so tests can count bubbles. Each is one async testbench:
``run(dut, src.run, sink.run, ...)``. The metadata-stream pair, for both simulators, is
:mod:`testkit.meta`.

A protocol check rides along in every sink: once ``valid`` is high it must stay high with the
payload unchanged until ``ready`` takes it (AXI-Stream's rule), or the sink raises. Every
source puts random junk on its data and sideband signals while ``valid`` is low, so a block
that takes anything from them without ``valid`` fails its test.
"""

import random


def _junk_rng(rng):
    """A generator for the junk under ``valid`` = 0, apart from ``rng`` (a test's random
    draws stay what they were)."""
    return random.Random(hash(rng.getstate()) ^ 0x6A756E6B)


def frame_to_beats(frame, keep_width, user=0):
    """[(tdata, tkeep, tlast, tuser)] of ``frame`` on a ``keep_width``-byte bus."""
    if not frame:
        raise ValueError("an AXI-Stream frame has at least one byte")
    beats = []
    for off in range(0, len(frame), keep_width):
        chunk = frame[off:off + keep_width]
        last = off + keep_width >= len(frame)
        beats.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, int(last),
                      user if last else 0))
    return beats


def beats_to_frame(beats, keep_width):
    out = bytearray()
    for i, (data, keep, last, _user) in enumerate(beats):
        n = bin(keep).count("1")
        if keep != (1 << n) - 1 or n == 0:
            raise AssertionError(f"beat {i}: tkeep {keep:#x} is not contiguous from byte 0")
        if not last and keep != (1 << keep_width) - 1:
            raise AssertionError(f"beat {i}: partial tkeep before tlast")
        out += (data & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
    return bytes(out)


class AxisSource:
    def __init__(self, port, frames, *, rng=None, idle=0.0, users=None):
        self.port = port
        self.frames = list(frames)
        self.users = users or [0] * len(self.frames)
        self.rng = rng or random.Random(0)
        self.idle = idle
        self.keep_width = len(port.tkeep)
        self.junk = _junk_rng(self.rng)
        self.done = False

    def _idle(self, ctx):
        p = self.port
        ctx.set(p.tvalid, 0)
        for sig in (p.tdata, p.tkeep, p.tlast, p.tuser):
            ctx.set(sig, self.junk.getrandbits(len(sig)))

    async def run(self, ctx):
        p = self.port
        self._idle(ctx)
        for frame, user in zip(self.frames, self.users):
            for data, keep, last, tuser in frame_to_beats(frame, self.keep_width, user):
                while self.idle and self.rng.random() < self.idle:
                    self._idle(ctx)
                    await ctx.tick()
                ctx.set(p.tdata, data)
                ctx.set(p.tkeep, keep)
                ctx.set(p.tlast, last)
                ctx.set(p.tuser, tuser)
                ctx.set(p.tvalid, 1)
                await ctx.tick().until(p.tready)
        self._idle(ctx)
        self.done = True


class AxisSink:
    def __init__(self, port, count, *, rng=None, backpressure=0.0, max_cycles=100_000):
        self.port = port
        self.count = count
        self.rng = rng or random.Random(0)
        self.backpressure = backpressure
        self.max_cycles = max_cycles
        self.frames = []
        self.users = []
        self.beat_cycles = []       # cycle number of every accepted beat

    async def run(self, ctx):
        p = self.port
        beats = []
        held = None
        cycle = 0
        while len(self.frames) < self.count:
            if cycle >= self.max_cycles:
                raise AssertionError(f"sink: {len(self.frames)}/{self.count} frames after "
                                     f"{cycle} cycles")
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            ctx.set(p.tready, ready)
            _, _, valid, data, keep, last, user = await ctx.tick().sample(
                p.tvalid, p.tdata, p.tkeep, p.tlast, p.tuser)
            beat = (data, keep, last, user)
            if held is not None and (not valid or beat != held):
                raise AssertionError(f"cycle {cycle}: tvalid dropped or payload changed "
                                     f"before tready ({held} -> {valid}, {beat})")
            if valid and ready:
                beats.append(beat)
                self.beat_cycles.append(cycle)
                held = None
                if last:
                    self.frames.append(beats_to_frame(beats, len(p.tkeep)))
                    self.users.append(user)
                    beats = []
            elif valid:
                held = beat
            cycle += 1
        ctx.set(p.tready, 0)






def handshake_watcher(port, cycles, done):
    """A testbench that appends to ``cycles`` the cycle of every handshake on metadata
    stream ``port``, until the list ``done`` is not empty."""
    async def watch(ctx):
        cycle = 0
        while not done:
            _, _, v, r = await ctx.tick().sample(port.valid, port.ready)
            if v and r:
                cycles.append(cycle)
            cycle += 1
    return watch


def gated(started, body, done=None):
    """A testbench that waits until the list ``started`` is not empty, runs ``body(ctx)``
    (a source's ``run``), then appends True to ``done`` if given."""
    async def tb(ctx):
        while not started:
            await ctx.tick()
        await body(ctx)
        if done is not None:
            done.append(True)
    return tb
