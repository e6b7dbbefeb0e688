"""The HTML shell of the ``gyre runs`` pages: inline style, plain tables, nothing fetched."""

from __future__ import annotations

import html

STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222}"
    "h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:2px 6px;"
    "text-align:left} th{background:#f4f4f4} .num{text-align:right;font-variant-numeric:tabular-nums}"
    ".chart{display:block;margin:.4em 0} .frame{fill:none;stroke:#999} .grid{stroke:#eee}"
    ".title{font-size:13px;font-weight:600} .tick,.legend{font-size:11px;fill:#444}"
    ".none{color:#777;font-style:italic} .missing{color:#b35} img{max-width:100%}"
    ".scroll{max-height:32em;overflow:auto}"
)


def page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escape on the way in)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'
