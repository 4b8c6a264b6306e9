"""Test helpers shared by the Amaranth-simulator tests (``sim/``) and the cocotb tests
(``cocotb_tests/``): stream sources and sinks, the AXI4-Lite masters, the cocotb harness.

The repository root is on ``sys.path`` in a pytest run (``pythonpath`` in pyproject.toml), so
a test imports ``testkit.streams`` and the like by name.
"""

from pathlib import Path

__all__ = ["ROOT", "docs_page"]

ROOT = Path(__file__).resolve().parent.parent


def docs_page(*parts):
    """A page of docs/, e.g. ``docs_page("blocks", "roce-rx.md")``."""
    return ROOT.joinpath("docs", *parts)
