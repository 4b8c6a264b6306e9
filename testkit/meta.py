"""Metadata-stream sources and sinks (``valid``/``ready`` and a record), one pair for both
simulators.

What a source or a sink does in a cycle is decided once, here: which record a source offers
and when it pauses (seeded random idle cycles, or a pause generator as cocotbext-axi's), what
a sink accepts and when it holds ``ready`` low, and the stream rule every sink checks (once
``valid`` is high it stays high with the record unchanged until ``ready`` takes it). Each has
two drivers over that one policy:

* Amaranth's simulator: ``MetaSource(port, records, rng=..., idle=...)`` and
  ``MetaSink(port, count, rng=..., backpressure=...)`` on a ``lib.stream`` port, their
  ``run`` coroutines given to the testbench (``testkit.simtools.run``); records are the
  payload's values. A source puts random junk on the payload while ``valid`` is low, so a
  block that takes a record without ``valid`` fails its test.
* cocotb, on exported Verilog: ``MetaSource.cocotb(dut, prefix, fields, clk)`` and
  ``MetaSink.cocotb(...)`` on the signals ``<prefix>_<field>``, ``<prefix>_valid`` and
  ``<prefix>_ready``, started at once; records are dicts with one key per field, queued with
  ``send_nowait``.
"""

import collections
import random

__all__ = ["MetaSource", "MetaSink"]


def _junk_rng(rng):
    """A generator for the junk under ``valid`` = 0, apart from ``rng`` (a test's random
    draws stay what they were)."""
    return random.Random(hash(rng.getstate()) ^ 0x6A756E6B)


class _Pauses:
    """When to hold ``valid`` (a source) or ``ready`` (a sink) low: with ``probability``,
    drawn from ``rng``, until a pause generator (True = pause this cycle) replaces it."""

    def __init__(self, rng, probability):
        self.rng, self.probability, self.generator = rng, probability, None

    def __call__(self):
        if self.generator is not None:
            return next(self.generator)
        return bool(self.probability) and self.rng.random() < self.probability


class _CocotbPort:
    """The signals of a metadata stream of exported Verilog, by prefix."""

    def __init__(self, dut, prefix, fields, clk):
        self.dut, self.prefix, self.fields, self.clk = dut, prefix, list(fields), clk
        self.valid = getattr(dut, f"{prefix}_valid")
        self.ready = getattr(dut, f"{prefix}_ready")
        self.signals = {n: getattr(dut, f"{prefix}_{n}") for n in self.fields}

    def write(self, record):
        for name, signal in self.signals.items():
            signal.value = record[name]

    def read(self):
        return {name: int(signal.value) for name, signal in self.signals.items()}


class MetaSource:
    """Offers ``records`` in order, one a handshake, pausing between records as its pauses
    say (never while a record waits for ``ready``); a ``None`` among the records is one idle
    cycle, and nothing is offered while ``hold`` is set. ``sent`` counts the records taken,
    ``cycles`` holds the cycle of each handshake (counted from the start, holds included),
    and ``done`` is set when the Amaranth ``run`` has sent them all."""

    def __init__(self, port, records=(), *, rng=None, idle=0.0):
        self.port = port
        self.queue = collections.deque(records)
        self.rng = rng or random.Random(0)
        self.pauses = _Pauses(self.rng, idle)
        self.sent = 0
        self.cycles = []
        self.hold = False
        self.done = False

    @classmethod
    def cocotb(cls, dut, prefix, fields, clk):
        """A source on the cocotb signals ``<prefix>_*``, started: feed it ``send_nowait``."""
        source = cls(_CocotbPort(dut, prefix, fields, clk))
        source.port.valid.value = 0
        import cocotb
        cocotb.start_soon(source._run_cocotb())
        return source

    def set_pause_generator(self, generator):
        self.pauses.generator = generator

    def send_nowait(self, record):
        self.queue.append(record)

    # The policy, the same for both simulators.

    def _offer(self):
        """The record to put on the stream in a cycle where none waits: the next one, unless
        there is none, the source is held, the next is an idle cycle or this cycle pauses."""
        if self.hold or not self.queue:
            return None
        if self.queue[0] is None:
            self.queue.popleft()
            return None
        if not self.pauses():
            return self.queue[0]
        return None

    def _taken(self, cycle):
        self.queue.popleft()
        self.sent += 1
        self.cycles.append(cycle)

    # Amaranth's simulator.

    def _idle(self, ctx):
        payload = self.port.payload
        payload = payload.as_value() if hasattr(payload, "as_value") else payload
        ctx.set(self.port.valid, 0)
        ctx.set(payload, self._junk.getrandbits(len(payload)))

    async def run(self, ctx):
        """Offer every queued record; returns when the last one is taken."""
        self._junk = _junk_rng(self.rng)
        self._idle(ctx)
        cycle = 0
        while self.queue:
            record = self._offer()
            if record is None:
                self._idle(ctx)
                await ctx.tick()
                cycle += 1
                continue
            ctx.set(self.port.payload, record)
            ctx.set(self.port.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(self.port.ready)
                cycle += 1
                if ready:
                    break
            self._taken(cycle - 1)
        self._idle(ctx)
        self.done = True

    # cocotb.

    async def _run_cocotb(self):
        from cocotb.triggers import RisingEdge
        port, driving, cycle = self.port, False, 0
        while True:
            await RisingEdge(port.clk)
            # what we drive is only seen in the next time step: the record driven before
            # this edge is taken at it when ready was high
            if driving and port.ready.value == 1:
                self._taken(cycle)
                driving = False
            if not driving:
                record = self._offer()
                if record is not None:
                    port.write(record)
                    driving = True
            port.valid.value = int(driving)
            cycle += 1


class MetaSink:
    """Takes records, holding ``ready`` low as its pauses say, and checks the stream rule
    at every edge. ``records`` holds what it took and ``cycles`` the cycle of each; with
    Amaranth's simulator ``run`` returns after ``count`` records and fails after
    ``max_cycles``."""

    def __init__(self, port, count=None, *, rng=None, backpressure=0.0, max_cycles=100_000):
        self.port, self.count, self.max_cycles = port, count, max_cycles
        self.rng = rng or random.Random(0)
        self.pauses = _Pauses(self.rng, backpressure)
        self.records = []
        self.cycles = []
        self._held = None

    @classmethod
    def cocotb(cls, dut, prefix, fields, clk):
        """A sink on the cocotb signals ``<prefix>_*``, started: it takes records for ever."""
        sink = cls(_CocotbPort(dut, prefix, fields, clk))
        import cocotb
        cocotb.start_soon(sink._run_cocotb())
        return sink

    def set_pause_generator(self, generator):
        self.pauses.generator = generator

    # The policy, the same for both simulators.

    def _ready(self):
        return not self.pauses()

    def _edge(self, cycle, ready, valid, record):
        """One clock edge as the sink saw it: the stream rule checked, the record taken when
        ``valid`` and ``ready``."""
        if self._held is not None and (not valid or record != self._held):
            raise AssertionError(f"{self._name()}, cycle {cycle}: valid dropped or record "
                                 f"changed before ready ({self._held} -> "
                                 f"{record if valid else 'no valid'})")
        if valid and ready:
            self.records.append(record)
            self.cycles.append(cycle)
            self._held = None
        elif valid:
            self._held = record

    def _name(self):
        return f"sink {self.port.prefix}" if isinstance(self.port, _CocotbPort) else "sink"

    # Amaranth's simulator.

    async def run(self, ctx):
        cycle = 0
        while len(self.records) < self.count:
            if cycle >= self.max_cycles:
                raise AssertionError(f"sink: {len(self.records)}/{self.count} records after "
                                     f"{cycle} cycles")
            ready = self._ready()
            ctx.set(self.port.ready, ready)
            _, _, valid, record = await ctx.tick().sample(self.port.valid,
                                                           self.port.payload.as_value())
            self._edge(cycle, ready, valid, record)
            cycle += 1
        ctx.set(self.port.ready, 0)

    # cocotb.

    async def _run_cocotb(self):
        from cocotb.triggers import RisingEdge
        port, cycle = self.port, 0
        while True:
            ready = self._ready()
            port.ready.value = int(ready)
            await RisingEdge(port.clk)
            valid = port.valid.value == 1
            self._edge(cycle, ready, valid, port.read() if valid else None)
            cycle += 1
