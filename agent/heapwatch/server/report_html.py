"""The HTML report: the memory page as one file that opens from disk.

``heapwatch report`` writes it.  It is the page's own files
(``heapwatch.server.page``) with every script and style sheet inlined, the
favicon a data URL, and the document (``heapwatch.formats.view``) in a
``<script type="application/json">`` element that the page's script reads
instead of fetching.  Its Content-Security-Policy (a ``<meta>``: a file has
no headers) allows exactly these inline scripts and styles, by their sha256,
and nothing from any origin: opened from disk, the report loads nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html as markup
import re
from typing import Any

from heapwatch.formats.view import script_json
from heapwatch.server.page import static_bytes, static_text

__all__ = ["standalone_html"]

_STYLESHEET = re.compile(r'<link rel="stylesheet" href="static/([^"]+)">')
_SCRIPT = re.compile(r'<script src="static/([^"]+)"></script>')
_ICON = '<link rel="icon" href="static/favicon.svg" type="image/svg+xml">'
_BODY = '<body data-source="view">'
_ENDS = re.compile(r"</(script|style)", re.IGNORECASE)


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _inline(name: str) -> str:
    text = static_text(name)
    # An inlined file that closed its own element would end it early.
    if _ENDS.search(text):
        raise ValueError(f"static/{name} holds a closing script or style tag: it cannot be inlined")
    return text


def standalone_html(data: dict[str, Any], title: str = "heapwatch report") -> str:
    """The report of ``data`` as one HTML document."""
    html = static_text("page.html")
    for marker in (_ICON, _BODY, "<title>"):
        if marker not in html:  # page.html and this module change together
            raise ValueError(f"static/page.html has no {marker!r}")
    styles: list[str] = []
    scripts: list[str] = []

    def style(match: re.Match[str]) -> str:
        styles.append(_inline(match.group(1)))
        return "<style>" + styles[-1] + "</style>"

    def script(match: re.Match[str]) -> str:
        scripts.append(_inline(match.group(1)))
        return "<script>" + scripts[-1] + "</script>"

    html = _STYLESHEET.sub(style, html)
    html = _SCRIPT.sub(script, html)
    icon = base64.b64encode(static_bytes("favicon.svg")).decode()
    html = html.replace(_ICON, f'<link rel="icon" href="data:image/svg+xml;base64,{icon}">')
    policy = (
        "default-src 'none'; "
        f"script-src {' '.join(map(_hash, scripts))}; "
        f"style-src {' '.join(map(_hash, styles))}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    head = f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
    html = html.replace(
        "<title>heapwatch: live memory</title>", f"<title>{markup.escape(title)}</title>"
    )
    html = html.replace("<title>", head + "<title>", 1)
    document = (
        '<script type="application/json" id="heapwatch-data">' + script_json(data) + "</script>\n"
    )
    html = html.replace(_BODY, '<body data-source="">\n' + document, 1)
    return html
