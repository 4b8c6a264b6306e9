"""Small gateware helpers shared by the blocks: priority search, struct assignment, and
:func:`take` for an ``elaborate`` written as one method per section.

They build plain Amaranth expressions and statements, import nothing of the package, and sit
at the bottom of it beside :mod:`mrcnic.base.proto` and :mod:`mrcnic.base.stream`.
"""

from amaranth.hdl import Cat, Const, Mux, Signal
from amaranth.utils import ceil_log2

__all__ = ["first_set", "first_set_of", "assign", "register_copies", "signed_fits", "take",
           "plus_not"]


def take(v, names):
    """The values namespace ``v`` holds under ``names`` (space separated), in order: what an
    ``elaborate`` split into one method per section passes from one section to the next."""
    return [getattr(v, name) for name in names.split()]


def first_set(vec):
    """``(found, index)`` of the lowest set bit of ``vec``: a binary tree of 2:1 muxes (the
    left half of each node is a power of two, so the right half's index just gains its top
    bit: no adder on the path). Pass a Signal (or use :func:`first_set_of`): every node
    slices ``vec``, and a slice of an expression repeats the whole expression in the exported
    Verilog."""
    def tree(lo, hi):
        if hi - lo == 1:
            return vec[lo], Const(0, 0)
        k = ceil_log2(hi - lo) - 1
        mid = lo + (1 << k)
        fl, il = tree(lo, mid)
        fh, ih = tree(mid, hi)
        left = Cat(il, Const(0, k - len(il)), Const(0, 1))
        right = Cat(ih, Const(0, k - len(ih)), Const(1, 1))
        return fl | fh, Mux(fl, left, right)
    return tree(0, len(vec))


def first_set_of(m, vec, name):
    """:func:`first_set` of ``vec`` held in a Signal ``name`` of module ``m`` first."""
    held = Signal(len(vec), name=name)
    m.d.comb += held.eq(vec)
    return first_set(held)


def assign(view, **fields):
    """Statements setting the named fields of a struct view; the other fields to 0."""
    stmts = []
    for name, _ in view.shape():
        stmts.append(getattr(view, name).eq(fields.pop(name, 0)))
    if fields:
        raise ValueError(f"no fields {', '.join(fields)} in {view.shape()!r}")
    return stmts


def plus_not(a, b):
    """``a`` + ~``b`` with ``b`` taken as wide as the wider of the two (W bits): ``a`` -
    ``b`` - 1 on W + 1 bits, whose top bit is the carry (``a`` > ``b``), as one
    subtraction. Synthesis for the ECP5 folds a subtraction's inversion of its subtrahend
    into the carry chain's cells, but leaves an inversion written out (``~b``) as a LUT
    level of its own before the chain: a level and a route on a chain's every path."""
    width = max(len(a), len(b))
    # (2a + 2^(W + 1) - (2b + 1)) / 2 = a + (2^W - 1 - b): the same bits, no inverter.
    return (Cat(Const(0, 1), a, Const(0, width - len(a)), Const(1, 1)) -
            Cat(Const(1, 1), b))[1:width + 2]


def signed_fits(value, bits):
    """``value`` (two's complement) fits a signed ``bits``-bit field."""
    top = value[bits - 1:]
    return (top == 0) | (top == (1 << len(top)) - 1)


def register_copies(sig, names):
    """Up to three registers meant to hold the same value as register ``sig`` (the caller
    loads them alike), named ``{sig.name}_{name}``: each feeds a share of ``sig``'s loads,
    so that no one net of a wide fanout (a RAM's address, a shifter's amount) slows every
    path that reads it. Synthesis merges registers loaded alike unless their resets differ,
    so each copy's reset differs from ``sig``'s (whose reset value must be 0) and the
    others': a reset value of all ones, no reset, no reset with initial value all ones."""
    kinds = ({"init": (1 << len(sig)) - 1}, {"reset_less": True},
             {"reset_less": True, "init": (1 << len(sig)) - 1})
    if len(names) > len(kinds):
        raise ValueError(f"at most {len(kinds)} copies of a register, not {len(names)}")
    return [Signal(len(sig), name=f"{sig.name}_{n}", **k) for n, k in zip(names, kinds)]
