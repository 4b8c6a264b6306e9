"""Register maps as Markdown tables, for the docs pages (docs/blocks/, docs/csr.md)."""

__all__ = ["markdown"]


def markdown(regmap):
    """A Markdown title line and table: one row per register, then one per field."""
    def row(*cells):
        cells = (" ".join(str(c).split()).replace("|", "\\|") for c in cells)
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
    hexw = regmap.data_width // 4
    lines = [
        f"**{regmap.name}**: {len(regmap)} registers, {regmap.data_width}-bit AXI4-Lite, "
        f"addr_width {regmap.addr_width}",
        "",
        "| offset | register | field | bits | access | reset | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(regmap, key=lambda r: r.offset):
        lines.append(row(f"0x{r.offset:02x}", f"`{r.name}`", "", "", "",
                         f"0x{r.reset:0{hexw}x}", r.desc))
        for f in sorted(r.fields.values(), key=lambda f: f.offset):
            lines.append(row("", "", f"`{f.name}`", f.bits, f.access, f"{f.reset:#x}",
                             f.desc))
    return "\n".join(lines) + "\n"
