"""Report appendices: each executed notebook in two HTML forms, and the index of every run.

    export(executed, record)  -> (<stem>.html, <stem>.report.html) beside the executed notebook:
        full    the executed notebook as it ran: code, outputs, everything
        report  what a reader of a report needs, without the code: the markdown, every figure,
                table and computed reading, with the parameters the run was given as a table at
                the top (the code cells' inputs, the papermill parameter cells, prompts, progress
                bars and warnings on stderr are left out)
    write_index(outputs)      -> outputs/index.md and outputs/index.html: every run with its status,
        both forms and its files; index.html shows each run's headline figure inline (the notebook
        names it in its metadata, "specnb": {"headline": "<file>.png"}; otherwise its first figure)

The figures are embedded in both HTML forms (nbconvert writes them as data URIs), so an appendix is
one self-contained file; the index links the PNGs in the run folders beside it.
"""

from __future__ import annotations

import copy
import html
import json
from pathlib import Path
from typing import Any

import nbformat

REPORT_SUFFIX = ".report.html"
HIDDEN_CELL_TAGS = ("parameters", "injected-parameters")  # their values go into the parameters table


def export(executed: Path, record: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write the full and the report HTML of an executed notebook; `record` is the run's params.json
    (its "parameters" become the report's parameters table). Returns (full, report)."""
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    full = executed.with_suffix(".html")
    full.write_text(HTMLExporter().from_notebook_node(nb)[0])
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    report = executed.with_name(executed.stem + REPORT_SUFFIX)
    report.write_text(exporter.from_notebook_node(report_notebook(nb, (record or {}).get("parameters", {})))[0])
    return full, report


def report_notebook(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> nbformat.NotebookNode:
    """The notebook a report shows: parameter cells replaced by one table of the run's parameters
    (after the title), stderr streams (progress bars, warnings) dropped from the outputs."""
    out = copy.deepcopy(nb)
    cells = []
    for cell in out.cells:
        if cell.cell_type == "code" and set(cell.metadata.get("tags", [])) & set(HIDDEN_CELL_TAGS):
            continue
        if cell.cell_type == "code":
            cell.outputs = [
                o for o in cell.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
            ]
        cells.append(cell)
    if parameters:
        rows = "\n".join(f"| `{k}` | `{_short(v)}` |" for k, v in parameters.items() if k != "run_dir")
        table = nbformat.v4.new_markdown_cell(f"**Parameters of this run**\n\n| parameter | value |\n|---|---|\n{rows}")
        first_markdown = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"), -1)
        cells.insert(first_markdown + 1, table)
    out.cells = cells
    return out


def headline(folder: Path, notebook: Path | None = None) -> str | None:
    """The run's headline figure (a file name in `folder`): the one its notebook names in metadata
    "specnb": {"headline": ...} when it exists, else the first PNG by name; None without figures."""
    if notebook is not None and notebook.exists():
        try:
            name = nbformat.read(notebook, as_version=4).metadata.get("specnb", {}).get("headline")
        except (OSError, ValueError):
            name = None
        if name and (folder / name).exists():
            return name
    pngs = sorted(p.name for p in folder.glob("*.png"))
    return pngs[0] if pngs else None


def write_index(outputs: Path) -> None:
    """outputs/index.md and index.html: every run folder with its status, both appendix forms, its
    files, and (index.html) its headline figure inline."""
    rows = []
    for params in sorted(outputs.glob("*/*/params.json")):
        folder = params.parent
        try:
            info = json.loads(params.read_text())
        except json.JSONDecodeError:
            continue
        files = sorted(p.name for p in folder.iterdir() if p.suffix in (".html", ".ipynb", ".csv", ".png"))
        figure = headline(folder, folder / f"{info.get('notebook')}.ipynb")
        rows.append((info, folder.relative_to(outputs), files, figure))
    md = [
        "# specnb runs",
        "",
        "| notebook | run | profile | status | started | duration (s) | commit | appendix | files |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for info, rel, files, figure in rows:
        stem = str(info.get("notebook"))
        commit = (info.get("environment", {}).get("git_commit") or "")[:12]
        forms = [
            (label, f)
            for label, f in (("report", stem + REPORT_SUFFIX), ("full notebook", stem + ".html"))
            if f in files
        ]
        others = [f for f in files if f not in {f for _, f in forms}]
        md.append(
            f"| {stem} | {rel.name} | {info.get('profile')} | {info.get('status')} | {info.get('started')} | "
            f"{info.get('duration_s', '')} | {commit} | "
            + " ".join(f"[{label}]({rel / f})" for label, f in forms)
            + " | "
            + " ".join(f"[{f}]({rel / f})" for f in others)
            + " |"
        )
        body.append(_index_html_row(info, rel, figure, commit, forms, others))
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "index.md").write_text("\n".join(md) + "\n")
    (outputs / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>specnb runs</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}td{vertical-align:top;padding:6px}"
        "table{border-collapse:collapse}tr{border-bottom:1px solid #ccc}</style>"
        "<h1>specnb runs</h1><p>Each run: its headline figure, its appendix as a report (no code) and as the full "
        "executed notebook, and its tables and figures.</p>"
        "<table><tr><th>run</th><th>headline figure</th><th>appendix</th><th>files</th></tr>"
        + "".join(body)
        + "</table>\n"
    )


def _index_html_row(
    info: dict, rel: Path, figure: str | None, commit: str, forms: list[tuple[str, str]], others: list[str]
) -> str:
    """One run's row of index.html: its facts, its headline figure inline, its appendix forms and files."""
    stem = str(info.get("notebook"))
    link = lambda f, text=None: f'<a href="{html.escape(str(rel / f))}">{html.escape(text or f)}</a>'  # noqa: E731
    image = (
        (
            f'<a href="{html.escape(str(rel / figure))}"><img src="{html.escape(str(rel / figure))}" '
            f'alt="{html.escape(stem)}: {html.escape(figure)}" style="max-width:420px;max-height:280px"></a>'
        )
        if figure
        else ""
    )
    return (
        f"<tr><td><b>{html.escape(stem)}</b><br>{html.escape(rel.name)}"
        f"<br>profile {html.escape(str(info.get('profile')))}"
        f"<br>{html.escape(str(info.get('status')))}, {info.get('duration_s', '')} s"
        f"<br>{html.escape(str(info.get('started')))}"
        f"<br>commit {html.escape(commit)}</td><td>{image}</td>"
        f"<td>{'<br>'.join(link(f, label) for label, f in forms)}</td>"
        f"<td style='font-size:small'>{' '.join(link(f) for f in others)}</td></tr>"
    )


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)  # strings quoted: an empty one stays visible
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."
