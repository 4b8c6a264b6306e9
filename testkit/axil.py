"""AXI4-Lite master for Amaranth's simulator, and a protocol checker built into it.

``AxiLiteSimMaster(ctx, port)`` drives the master side of ``port`` (a component's
``s_axil``) from an async testbench. One transaction at a time per direction; a read
testbench and a write testbench may share one port, since each touches only its own
channels.

Delays model a slow or erratic master: ``aw_delay``/``w_delay``/``ar_delay`` are the
cycles before ``*valid`` rises; ``b_delay``/``r_delay`` the cycles ``*ready`` stays low
after ``*valid`` rose (0: ready is already high when the response arrives). ``None``
draws a delay from ``rng`` (0 half of the time, else 1..``max_delay``), or 0 without rng.

While it waits the master checks what a slave owes it: no B before both AW and W were
accepted, no response without a request, and a response that stays valid and stable until
taken. A transaction taking more than ``timeout`` cycles raises (a hung slave).
"""


__all__ = ["AxiLiteSimMaster", "AxiLiteError", "AxiLiteProtocolError", "OKAY", "SLVERR"]

OKAY, EXOKAY, SLVERR, DECERR = range(4)
_RESP = {OKAY: "OKAY", EXOKAY: "EXOKAY", SLVERR: "SLVERR", DECERR: "DECERR"}


class AxiLiteError(Exception):
    """A response other than OKAY."""

    def __init__(self, kind, addr, resp):
        super().__init__(f"{kind} at {addr:#x}: {_RESP[resp]} ({resp:#04b})")
        self.addr = addr
        self.resp = resp


class AxiLiteProtocolError(AssertionError):
    """The slave broke an AXI rule, or did not answer in time."""


def _check_held(what, held, valid, value):
    """A response seen while its ready was low must stay valid and unchanged (AXI rule)."""
    if held is None:
        return
    if not valid:
        raise AxiLiteProtocolError(f"{what} valid dropped before ready")
    if value != held:
        raise AxiLiteProtocolError(f"{what} response changed while held")


class AxiLiteSimMaster:
    def __init__(self, ctx, port, *, rng=None, max_delay=4, timeout=1000):
        self.ctx = ctx
        self.port = port
        self.rng = rng
        self.max_delay = max_delay
        self.timeout = timeout
        self.data_width = len(port.wdata)
        self.cycles = 0          # clock edges spent in transactions, for rate figures

    def _delay(self, given):
        if given is not None:
            return given
        if self.rng is None or self.rng.random() < 0.5:
            return 0
        return self.rng.randint(1, self.max_delay)

    # --- Raising API ---

    async def read(self, addr, **delays):
        data, resp = await self.read_resp(addr, **delays)
        if resp != OKAY:
            raise AxiLiteError("read", addr, resp)
        return data

    async def write(self, addr, value, strb=None, **delays):
        resp = await self.write_resp(addr, value, strb, **delays)
        if resp != OKAY:
            raise AxiLiteError("write", addr, resp)

    # --- Response-returning API ---

    async def write_resp(self, addr, value, strb=None, *, aw_delay=None, w_delay=None,
                         b_delay=None):
        """Write ``value`` with byte enables ``strb`` (default all); returns BRESP."""
        ctx, p = self.ctx, self.port
        if strb is None:
            strb = (1 << (self.data_width // 8)) - 1
        aw_wait, w_wait, b_wait = (self._delay(aw_delay), self._delay(w_delay),
                                   self._delay(b_delay))
        aw_done = w_done = False
        held = None              # (bresp,) seen while bready was low
        ctx.set(p.awaddr, addr)
        ctx.set(p.awprot, 0)
        ctx.set(p.wdata, value)
        ctx.set(p.wstrb, strb)
        for _ in range(self.timeout):
            aw_valid = not aw_done and aw_wait == 0
            w_valid = not w_done and w_wait == 0
            ctx.set(p.awvalid, aw_valid)
            ctx.set(p.wvalid, w_valid)
            ctx.set(p.bready, b_wait == 0)
            aw_hs = aw_valid and ctx.get(p.awready)
            w_hs = w_valid and ctx.get(p.wready)
            bvalid = ctx.get(p.bvalid)
            bresp = ctx.get(p.bresp)
            if bvalid and not (aw_done and w_done):
                raise AxiLiteProtocolError(f"write {addr:#x}: bvalid before AW and W were "
                                           f"both accepted")
            _check_held(f"write {addr:#x}: B", held, bvalid, bresp)
            await ctx.tick()
            self.cycles += 1
            if bvalid and b_wait == 0:
                ctx.set(p.bready, 0)
                return bresp
            if bvalid:
                held = bresp
                b_wait -= 1
            aw_done |= aw_hs
            w_done |= w_hs
            if not aw_done and aw_wait:
                aw_wait -= 1
            if not w_done and w_wait:
                w_wait -= 1
            if aw_hs:
                ctx.set(p.awvalid, 0)
            if w_hs:
                ctx.set(p.wvalid, 0)
        raise AxiLiteProtocolError(f"write {addr:#x}: no response in {self.timeout} cycles")

    async def read_resp(self, addr, *, ar_delay=None, r_delay=None):
        """Read the word at ``addr``; returns ``(rdata, rresp)``."""
        ctx, p = self.ctx, self.port
        ar_wait, r_wait = self._delay(ar_delay), self._delay(r_delay)
        ar_done = False
        held = None              # (rdata, rresp) seen while rready was low
        ctx.set(p.araddr, addr)
        ctx.set(p.arprot, 0)
        for _ in range(self.timeout):
            ar_valid = not ar_done and ar_wait == 0
            ctx.set(p.arvalid, ar_valid)
            ctx.set(p.rready, r_wait == 0)
            ar_hs = ar_valid and ctx.get(p.arready)
            rvalid = ctx.get(p.rvalid)
            got = (ctx.get(p.rdata), ctx.get(p.rresp))
            if rvalid and not ar_done:
                raise AxiLiteProtocolError(f"read {addr:#x}: rvalid before AR was accepted")
            _check_held(f"read {addr:#x}: R", held, rvalid, got)
            await ctx.tick()
            self.cycles += 1
            if rvalid and r_wait == 0:
                ctx.set(p.rready, 0)
                return got
            if rvalid:
                held = got
                r_wait -= 1
            ar_done |= ar_hs
            if not ar_done and ar_wait:
                ar_wait -= 1
            if ar_hs:
                ctx.set(p.arvalid, 0)
        raise AxiLiteProtocolError(f"read {addr:#x}: no response in {self.timeout} cycles")
