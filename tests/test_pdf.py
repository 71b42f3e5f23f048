"""report.pdf by reportlab (`specnb.notebook.pdf`): every block the report's markdown holds, and
tables that fit the page: each column at least its longest word wide, the type made smaller for
wide tables, the header repeated."""

import re

import pytest

pytest.importorskip("reportlab")
from reportlab.pdfbase.pdfmetrics import stringWidth

from specnb.notebook.pdf import SMALLEST_PT, TABLE_PT, _inline, _table, markdown_pdf

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f6b3ad0000000049454e44ae426082"
)
WIDTH = 500.0


def pipe(rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])] + [
        "| " + " | ".join(r) + " |" for r in rows[1:]
    ]


def fits(table) -> tuple[bool, float]:
    """(every word of every cell fits its column, the type size used)."""
    size = table._cellvalues[0][0].style.fontSize
    for row in table._cellvalues:
        for width, cell in zip(table._colWidths, row):
            words = re.sub(r"<[^>]+>", "", cell.text).split()
            if any(stringWidth(w, "Helvetica-Bold", size) > width for w in words):
                return False, size
    return True, size


def test_a_narrow_table_keeps_its_type_and_every_word_whole():
    table = _table(
        pipe([["shape", "acceptance rate", "tau held out"], ["dynamic", "0.44 [0.40, 0.49]", "3.16"]]), WIDTH
    )
    ok, size = fits(table)
    assert ok and size == TABLE_PT and sum(table._colWidths) <= WIDTH and table.repeatRows == 1


def test_a_wide_table_shrinks_its_type_to_fit_the_page_and_never_cuts_a_word():
    head = [f"acceptance rate {i}" for i in range(14)]
    table = _table(pipe([head, ["0.44 [0.40, 0.49]"] * 14, ["dynamic:16"] * 14]), WIDTH)
    ok, size = fits(table)
    assert ok and SMALLEST_PT <= size < TABLE_PT
    assert sum(table._colWidths) <= WIDTH + 1e-6, "the table is cut at the page edge"
    # words too long for the page even in the smallest type: the columns still fit it (the words wrap)
    paths = _table(pipe([["a"] * 12, ["02_model_pairs/cpu-0000/02_model_pairs.report.html"] * 12]), WIDTH)
    assert sum(paths._colWidths) <= WIDTH + 1e-6


def test_inline_markup_and_escaping():
    assert _inline("**bold** *it* `a<b` [x](https://e.org) 3 < 4 \\| ok") == (
        '<b>bold</b> <i>it</i> <font face="Courier">a&lt;b</font> '
        '<link href="https://e.org" color="#1a4f9c">x</link> 3 &lt; 4 | ok'
    )
    assert _inline("2 * 3 * 4") == "2 * 3 * 4", "a bare star is no italics"


def test_markdown_pdf_prints_every_block(tmp_path):
    (tmp_path / "report_files").mkdir()
    (tmp_path / "report_files" / "fig.png").write_bytes(PNG)
    rows = "\n".join(f"| shape{i} | {i / 7:.2f} [0.10, 0.90] |" for i in range(120))  # longer than a page
    md = tmp_path / "report.md"
    md.write_text(
        "# Title\n\n<!-- drafted -->\nA paragraph\nover two lines with **bold**.\n\n## 1 Method\n\n"
        "- an item\n  continued\n"
        "- another\n\n```\nprint('code')\n```\n\n![png](report_files/fig.png)\n\n*a caption*\n\n"
        f"| shape | tau |\n|---|---|\n{rows}\n\n![png](report_files/missing.png)\n"
    )
    pdf = markdown_pdf(md)
    data = pdf.read_bytes()
    assert pdf == tmp_path / "report.pdf" and data.startswith(b"%PDF")
    assert len(re.findall(rb"/Type\s*/Page[^s]", data)) >= 3, "the long table spans pages"
    assert b"/Subtype /Image" in data, "the figure is in the PDF"
