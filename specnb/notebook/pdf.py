"""report.md printed to report.pdf by reportlab (pure Python, from PyPI): no browser needed, so the
PDF is written wherever the report is, a laptop or Colab included.

    markdown_pdf   the markdown the report exports (`report.export_report`) as an A4 PDF: headings,
                   paragraphs, lists, code blocks, figures scaled to the page, and pipe tables
                   whose columns are sized to their content, the type made smaller where a table
                   has many, so that no table is cut at the page's edge and no word is broken
                   inside; a table's header row repeats on every page it spans

Only the markdown the report writes is read: `#` headings, paragraphs, `-`/`*` items, fenced code,
`![caption](file)` figures, `| a | b |` tables, **bold**, *italic*, `code` and [links](url); an
HTML comment (the drafted sections' mark) is left out.
"""

from __future__ import annotations

import html
import re
import textwrap
from pathlib import Path

A4_MARGIN_CM = 1.6
BODY_PT, TABLE_PT, SMALLEST_PT = 9.5, 7.5, 5.0  # a table's type shrinks from TABLE_PT to fit, not below SMALLEST_PT
CODE_COLUMNS = 110  # a code line longer than this wraps


def markdown_pdf(markdown: Path, pdf: Path | None = None) -> Path:
    """`markdown` (a report.md; its figures relative to its folder) as an A4 PDF, by default beside
    it with the suffix .pdf. Returns the PDF's path."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.units import cm
    from reportlab.platypus import SimpleDocTemplate

    markdown = Path(markdown)
    pdf = Path(pdf) if pdf is not None else markdown.with_suffix(".pdf")
    margin = A4_MARGIN_CM * cm
    doc = SimpleDocTemplate(
        str(pdf),
        pagesize=A4,
        leftMargin=margin,
        rightMargin=margin,
        topMargin=margin,
        bottomMargin=margin,
        title=_title(markdown.read_text()),
        author="specnb",
    )
    doc.build(_flowables(markdown.read_text(), markdown.parent, doc.width, doc.height), onLaterPages=_page_number)
    return pdf


def _title(text: str) -> str:
    found = re.search(r"^# (.+)$", text, flags=re.M)
    return found.group(1).strip() if found else "specnb report"


def _page_number(canvas, doc) -> None:
    canvas.saveState()
    canvas.setFont("Helvetica", 7)
    canvas.drawRightString(doc.pagesize[0] - doc.rightMargin, doc.bottomMargin / 2, str(doc.page))
    canvas.restoreState()


def _styles() -> dict:
    from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet

    base = getSampleStyleSheet()
    body = ParagraphStyle("body", parent=base["BodyText"], fontSize=BODY_PT, leading=BODY_PT * 1.3, spaceAfter=4)
    return {
        "body": body,
        "item": ParagraphStyle("item", parent=body, leftIndent=12, bulletIndent=2, spaceAfter=2),
        "caption": ParagraphStyle("caption", parent=body, fontSize=BODY_PT - 1.5, textColor="#444444"),
        "code": ParagraphStyle("code", parent=base["Code"], fontSize=7, leading=8.5, spaceAfter=6),
        1: ParagraphStyle("h1", parent=base["Title"], fontSize=17, spaceAfter=8),
        2: ParagraphStyle("h2", parent=base["Heading2"], fontSize=13.5, spaceBefore=10),
        3: ParagraphStyle("h3", parent=base["Heading3"], fontSize=11.5, spaceBefore=8),
        4: ParagraphStyle("h4", parent=base["Heading4"], fontSize=10, spaceBefore=6),
    }


def _flowables(text: str, folder: Path, width: float, height: float) -> list:
    from reportlab.platypus import Paragraph, Preformatted, Spacer

    styles = _styles()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    lines = text.splitlines()
    out: list = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(Paragraph(_inline(" ".join(paragraph)), styles["body"]))
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
            code = "\n".join(w for raw in lines[i + 1 : end] for w in textwrap.wrap(raw, CODE_COLUMNS) or [""])
            out.append(Preformatted(code, styles["code"]))
            i = end + 1
            continue
        if stripped.startswith("|"):
            flush()
            end = i
            while end < len(lines) and lines[end].strip().startswith("|"):
                end += 1
            out.append(_table(lines[i:end], width))
            out.append(Spacer(1, 6))
            i = end
            continue
        heading = re.match(r"^(#{1,4})\s+(.*)$", line)
        figure = re.match(r"^!\[(.*?)\]\((.+?)\)\s*$", stripped)
        item = re.match(r"^\s*[-*]\s+(.*)$", line)
        if heading:
            flush()
            out.append(Paragraph(_inline(heading.group(2)), styles[len(heading.group(1))]))
        elif figure:
            flush()
            out.extend(_figure(folder / figure.group(2), figure.group(1), width, height, styles["caption"]))
        elif item:
            flush()
            words = [item.group(1)]
            while i + 1 < len(lines) and lines[i + 1].startswith("  ") and lines[i + 1].strip():
                i += 1  # an item's continuation lines
                words.append(lines[i].strip())
            out.append(Paragraph(_inline(" ".join(words)), styles["item"], bulletText="•"))
        elif not stripped:
            flush()
        else:
            paragraph.append(stripped)
        i += 1
    flush()
    return out


def _inline(text: str) -> str:
    """Markdown inline markup as reportlab's: code, bold, italics, links; the rest escaped."""
    spans: list[str] = []

    def keep(markup: str) -> str:
        spans.append(markup)
        return f"\x00{len(spans) - 1}\x00"

    text = re.sub(r"`([^`]+)`", lambda m: keep(f'<font face="Courier">{html.escape(m.group(1))}</font>'), text)
    text = re.sub(
        r"\[([^\]]+)\]\(([^)\s]+)\)",
        lambda m: keep(f'<link href="{html.escape(m.group(2))}" color="#1a4f9c">{html.escape(m.group(1))}</link>'),
        text,
    )
    text = html.escape(text.replace("\\|", "|"), quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], text)


def _cells(line: str) -> list[str]:
    """A pipe table row's cells ('\\|' is a bar inside a cell)."""
    body = line.strip().strip("|")
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def _table(lines: list[str], width: float):
    """A pipe table as a reportlab Table that fits `width`: each column at least its longest word
    wide, the rest shared by content length; the type made smaller until the words fit."""
    from reportlab.lib import colors
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.pdfbase.pdfmetrics import stringWidth
    from reportlab.platypus import Paragraph, Table, TableStyle

    rows = [_cells(line) for line in lines if not re.fullmatch(r"\|?[\s:|-]*-[\s:|-]*\|?", line.strip())]
    columns = max(len(r) for r in rows)
    rows = [r + [""] * (columns - len(r)) for r in rows]
    plain = [[re.sub(r"[*`]", "", c) for c in r] for r in rows]
    pad = 6.0  # points of padding per cell
    size = TABLE_PT
    while True:
        longest_word = [
            max((stringWidth(w, "Helvetica-Bold", size) for r in plain for w in r[k].split()), default=0) + pad
            for k in range(columns)
        ]
        if sum(longest_word) <= width or size <= SMALLEST_PT:
            break
        size -= 0.5
    content = [max(stringWidth(r[k], "Helvetica", size) for r in plain) + pad for k in range(columns)]
    spare = max(width - sum(longest_word), 0)
    want = [max(c - m, 0) for c, m in zip(content, longest_word)]
    share = min(1.0, spare / sum(want)) if sum(want) else 0.0
    widths = [m + w * share for m, w in zip(longest_word, want)]
    if sum(widths) > width:  # the smallest type and still too wide: scale (long words then wrap inside)
        widths = [w * width / sum(widths) for w in widths]
    style = ParagraphStyle("cell", fontName="Helvetica", fontSize=size, leading=size * 1.2)
    head = ParagraphStyle("head", parent=style, fontName="Helvetica-Bold")
    data = [[Paragraph(_inline(c), head if n == 0 else style) for c in r] for n, r in enumerate(rows)]
    table = Table(data, colWidths=widths, repeatRows=1, hAlign="LEFT")
    table.setStyle(
        TableStyle(
            [
                ("GRID", (0, 0), (-1, -1), 0.25, colors.HexColor("#bbbbbb")),
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eeeeee")),
                ("VALIGN", (0, 0), (-1, -1), "TOP"),
                ("LEFTPADDING", (0, 0), (-1, -1), pad / 2),
                ("RIGHTPADDING", (0, 0), (-1, -1), pad / 2),
                ("TOPPADDING", (0, 0), (-1, -1), 1.5),
                ("BOTTOMPADDING", (0, 0), (-1, -1), 1.5),
            ]
        )
    )
    return table


def _figure(path: Path, caption: str, width: float, height: float, style) -> list:
    """A figure scaled to the frame's width and at most 45% of its height, its caption below, kept together."""
    from reportlab.lib.utils import ImageReader
    from reportlab.platypus import Image, KeepTogether, Paragraph

    if not path.exists():
        return [Paragraph(_inline(f"*(figure not found: {path.name})* {caption}"), style)]
    w, h = ImageReader(str(path)).getSize()
    scale = min(width / w, 0.45 * height / h)
    parts = [Image(str(path), width=w * scale, height=h * scale, hAlign="LEFT")]
    if caption and caption not in ("png", "jpeg", "svg"):  # nbconvert's alt text: the caption is the next line
        parts.append(Paragraph(_inline(caption), style))
    return [KeepTogether(parts)]
