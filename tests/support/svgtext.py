"""Where an SVG's text lands: each <text> element's estimated box, to check that no label runs off the plot."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from pytest_dflash.report.plots import text_width

NS = "{http://www.w3.org/2000/svg}"


def overflowing_texts(svg: str) -> list[str]:
    """The texts (with their estimated extent) that reach outside the SVG's width; rotated ones are skipped."""
    root = ET.fromstring(svg)
    width = float(root.get("width") or 0)
    base = float(root.get("font-size") or 11)
    out = []
    for element in root.iter(f"{NS}text"):
        if element.get("transform"):
            continue
        text = visible_text(element)
        size = float(element.get("font-size") or base)
        x, w = float(element.get("x") or 0), text_width(text, size)
        anchor = element.get("text-anchor") or "start"
        left = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
        if left < 0 or left + w > width:
            out.append(f"{text!r} spans {left:.0f}..{left + w:.0f} px of {width:.0f}")
    return out


def visible_text(element: ET.Element) -> str:
    """A <text> element's drawn text: its own and its children's tails, not a <title> tooltip."""
    return (element.text or "") + "".join(child.tail or "" for child in element)


def texts(svg: str) -> list[str]:
    """Every drawn text of an SVG."""
    return [visible_text(t) for t in ET.fromstring(svg).iter(f"{NS}text")]
