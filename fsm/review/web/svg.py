"""The SVG the review page inlines, rebuilt from an allow-list (V2): the shapes and text
graphviz draws and the attributes that place and paint them, nothing else.

The page inserts the drawing into its own document, so whatever the SVG holds acts there:
a link (`<a href>`, `xlink:href`, `target`), an image or a `url(...)` paint server fetching
elsewhere, a script, an event handler, a `<foreignObject>` of HTML, a `style` attribute. None
of them survive: an element outside the list is dropped with its content (a `<text>` keeps
its text), an attribute outside it is dropped, and a value that could reference anything
(`(`, `:` or `&` outside the few attributes that need parentheses) is dropped too. Graphviz's
tooltip links (`<a xlink:title>`) become groups with a `<title>`, which is how SVG shows a
tooltip. Parsing refuses entity declarations and external references (defusedxml).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
SHAPES = frozenset({"svg", "g", "title", "polygon", "polyline", "path", "ellipse", "circle",
                    "rect", "line", "text", "tspan"})
ATTRIBUTES = frozenset({
    "id", "class", "width", "height", "viewBox", "preserveAspectRatio", "points", "d",
    "cx", "cy", "r", "rx", "ry", "x", "y", "x1", "y1", "x2", "y2", "fill", "stroke",
    "stroke-width", "stroke-dasharray", "stroke-opacity", "fill-opacity", "opacity",
    "text-anchor", "font-family", "font-size", "font-weight", "font-style", "text-decoration",
})
SAFE_VALUE = re.compile(r"[-\w#.,%+ ]*", re.ASCII)
"""Numbers, names, colours, lists of points and path commands: no reference can be spelt."""
SAFE_TRANSFORM = re.compile(r"(?:\s*(?:scale|rotate|translate)\([-0-9.e, ]*\))*\s*")
SAFE_FONT = re.compile(r"[-\w ,]*", re.ASCII)
SAFE_ID = re.compile(r"[-\w:.]*", re.ASCII)
"""Element ids name table edges (`begin:Preparing:AwaitingFirstToken`)."""


class UnsafeSvg(ValueError):
    """What `dot` wrote is not an SVG document the page can show."""


def _local(tag: str) -> tuple[str, str]:
    namespace, _, name = tag[1:].partition("}") if tag.startswith("{") else ("", "", tag)
    return namespace, name


def _allowed_value(name: str, value: str) -> bool:
    if name == "transform":
        return SAFE_TRANSFORM.fullmatch(value) is not None
    if name == "font-family":
        return SAFE_FONT.fullmatch(value) is not None
    if name == "id":
        return SAFE_ID.fullmatch(value) is not None
    return SAFE_VALUE.fullmatch(value) is not None


def _clean(source: ET.Element, into: ET.Element) -> None:
    """Copy the allowed children of `source` into `into`."""
    for child in source:
        namespace, name = _local(child.tag) if isinstance(child.tag, str) else ("", "")
        if namespace == SVG_NS and name == "a":
            group = ET.SubElement(into, "g")
            tip = child.get(f"{{{XLINK_NS}}}title")
            if tip:
                ET.SubElement(group, "title").text = tip
            _clean(child, group)
        elif namespace == SVG_NS and name in SHAPES:
            kept = ET.SubElement(into, name, _attributes(child, name))
            kept.text = child.text if name in ("text", "tspan", "title") else None
            _clean(child, kept)


def _attributes(element: ET.Element, name: str) -> dict[str, str]:
    allowed = ATTRIBUTES | ({"transform"} if name in ("g", "text") else set())
    return {key: value for key, value in element.attrib.items()
            if key in allowed and _allowed_value(key, value)}


def sanitize_svg(data: bytes) -> bytes:
    """The drawing rebuilt from the allow-list, as UTF-8 SVG without a DOCTYPE."""
    try:
        root = fromstring(data, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except (ET.ParseError, DefusedXmlException) as exc:
        raise UnsafeSvg(f"graphviz's `dot` wrote no readable SVG ({type(exc).__name__})") \
            from None
    namespace, name = _local(root.tag)
    if (namespace, name) != (SVG_NS, "svg"):
        raise UnsafeSvg("graphviz's `dot` wrote a document that is not SVG")
    clean = ET.Element("svg", {**_attributes(root, "svg"), "xmlns": SVG_NS})
    _clean(root, clean)
    return bytes(ET.tostring(clean, encoding="utf-8", xml_declaration=False))
