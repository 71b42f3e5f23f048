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

    write_report(outputs)     -> outputs/report.md and outputs/report.html: the latest finished run
        of 01, 02 and 03 brought together in the course brief's order: 1 method (how specnb
        measures, the conventions, the exactness checks of these runs), 2 results (shape x budget
        tables of acceptance rate, acceptance length and tau with intervals, per pair; the
        tree-attention grid; the best tree on held-out prompts and its deploy lines), 3 analysis
        (the notebooks' readings, `notebook.readings`, recomputed from the saved tables), 4
        reproduce (commands, parameters, versions, commit, device, decode step, estimate and
        actual time). A notebook that did not run is said so in each section.

    python -m specnb.notebook.report [--outputs DIR]      the report and the index again

The figures are embedded in both HTML forms (nbconvert writes them as data URIs) and in report.html
(base64 PNGs), so each is one self-contained file; the index links the PNGs in the run folders
beside it. Tables are whole: the report renders every row, and the notebooks display every row
(`session.whole_tables`), so an appendix shows what the kernel displayed, not pandas' first and
last five rows.
"""

from __future__ import annotations

import copy
import html
import json
import os
import sys
from pathlib import Path
from typing import Any

import nbformat

from . import glossary, references
from .references import cite

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
        + (f"<br><i>{html.escape(str(info['error']))}</i>" if info.get("error") else "")
        + f"<br>{html.escape(str(info.get('started')))}"
        f"<br>commit {html.escape(commit)}</td><td>{image}</td>"
        f"<td>{'<br>'.join(link(f, label) for label, f in forms)}</td>"
        f"<td style='font-size:small'>{' '.join(link(f) for f in others)}</td></tr>"
    )


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)  # strings quoted: an empty one stays visible
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- the report: outputs/report.md and report.html, from the latest finished runs of 01-03 ----

REPORT_NOTEBOOKS = {
    "01_tree_shapes": "01 tree shapes and budgets",
    "02_model_pairs": "02 model pairs",
    "03_tree_attention_timing": "03 tree-attention timing",
}
REPORT_MD, REPORT_HTML = "report.md", "report.html"
SUMMARY_FILE = "run_summary.json"  # written by the runner (`runner.SUMMARY_FILE`)
BIBTEX = "references.bib"  # beside the report: the references for the student's own
MASK_FIGURE = "report_tree_mask.png"  # the method's drawing of a tree and its mask, beside the report
METRICS = (
    ("acceptance_rate", "acceptance rate (accepted / drafted)"),
    ("acceptance_length", "acceptance length (accepted tokens per target call, bonus token excluded)"),
    ("tau", "tau (tokens per target call, bonus token included)"),
)
CONVENTIONS = (
    "- **acceptance rate** = accepted draft tokens / drafted tokens\n"
    "- **acceptance length** = accepted draft tokens per target call (verification step), the bonus token "
    "**excluded**\n"
    "- **tau** = tokens per target call, the bonus token **included** (tau = 1 + acceptance length)\n"
    "- a cell `x [low, high]` holds a 95% interval (bootstrap over prompts); no interval where a run had fewer "
    "than 3 prompts"
)
METHOD = (
    "specnb runs exact tree speculative decoding on stock Hugging Face transformers models "
    f"{cite('leviathan2023fast', 'chen2023accelerating', 'miao2024specinfer')}. A draft proposes a "
    "tree of N draft tokens below the last accepted token (the root). The target verifies the root and every "
    "node in **one forward pass** on top of its KV cache: each node sits at position prefix + depth and its "
    "attention mask is the whole prefix plus its own ancestors (a tree mask passed to the model's stock "
    "attention, no patched kernels). The target's logits at the root and at every node decide the longest "
    "accepted branch (greedy: the target's argmax; sampling: the lossless acceptance rule); the cache then keeps "
    "the prefix, the root and the accepted branch only, and the target's own next token (the bonus token) "
    "becomes the next root.\n\n"
    "**Replay.** Notebooks 01 and 02 collect, once per pair, the draft's top-k tokens at every position of the "
    "target's own greedy output on each prompt. The acceptance of any tree (preset shapes, trees designed from the "
    f"data: Sequoia's {cite('chen2024sequoia')} and Medusa-style {cite('cai2024medusa')}, dynamic trees "
    f"{cite('li2024eagle2')}) is then computed from that collection without running the models again; a draft of "
    f"another tokenizer {cite('timor2025heterogeneous')} is re-drafted along the target's output instead. Because "
    "replay is exact only if it agrees with real runs, 01 runs some methods end to end and compares them with "
    "their replay step by step. Trees fitted to the data (Sequoia's design, Medusa-style trees, the hindsight "
    "tree) are scored on held-out prompts: fitted on some folds of prompts, scored on the others.\n\n"
    "**Exactness.** Speculative decoding must not change the output. Every greedy output is compared with the "
    "target's own greedy output token for token. Where they differ, a numerical tie is named as one: the "
    "target's top two logits closer than the tie margin where the outputs first differ. Notebook 03 checks "
    "every tree-attention implementation against a reference before timing it.\n\n"
    f"**Prompts.** Spec-Bench's {cite('xia2024unlocking')} 13 categories, shipped with specnb."
)


LAST_WRITTEN = {  # the file each notebook writes last: an interactive run that has it ran to the end
    "01_tree_shapes": "tree_results.json",
    "02_model_pairs": "by_category.csv",
    "03_tree_attention_timing": "cost_model.csv",
}


def latest_run(outputs: Path, notebook: str) -> Path | None:
    """The newest run folder of `notebook` under `outputs` (by its start time, then name) that
    finished: under the runner (status "finished"), or interactively, cell by cell in Jupyter or
    Colab (status "interactive"), when it holds the file the notebook writes last."""
    found = []
    for params in Path(outputs).glob(f"{notebook}/*/params.json"):
        try:
            info = json.loads(params.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        last = LAST_WRITTEN.get(notebook)
        done = info.get("status") == "interactive" and last is not None and (params.parent / last).exists()
        if info.get("status") == "finished" or done:
            found.append((str(info.get("started", "")), params.parent.name, params.parent))
    return max(found)[2] if found else None


class _Doc:
    """A report written once as blocks and rendered as markdown and as self-contained HTML."""

    def __init__(self, outputs: Path) -> None:
        self.outputs = outputs
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def text(self, markdown: str) -> None:
        self.blocks.append(("text", markdown))

    def table(self, frame: Any, caption: str = "") -> None:
        self.blocks.append(("table", (frame, caption)))

    def figure(self, path: Path, caption: str) -> None:
        if path.exists():
            self.blocks.append(("figure", (path, caption)))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def markdown(self) -> str:
        out = []
        for kind, value in self.blocks:
            if kind == "heading":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "text":
                out.append(value)
            elif kind == "table":
                frame, caption = value
                out.append((f"*{caption}*\n\n" if caption else "") + _markdown_table(frame))
            elif kind == "figure":
                path, caption = value
                out.append(f"![{caption}]({path.relative_to(self.outputs)})\n\n*{caption}*")
            elif kind == "code":
                out.append("```\n" + value.rstrip("\n") + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        import base64

        import mistune

        body = []
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                anchor = f' id="{_anchor(text)}"' if level == 2 else ""
                body.append(f"<h{level}{anchor}>{html.escape(text)}</h{level}>")
            elif kind == "text":
                body.append(mistune.html(value))
            elif kind == "table":
                frame, caption = value
                cap = f"<caption>{mistune.html(caption)[3:-5]}</caption>" if caption else ""
                table = frame.to_html(index=False, na_rep="", border=0, escape=True)
                body.append(table.replace('<table class="dataframe">', f'<table class="dataframe">{cap}', 1))
            elif kind == "figure":
                path, caption = value
                data = base64.b64encode(path.read_bytes()).decode()
                body.append(
                    f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
            elif kind == "code":
                body.append(f"<pre>{html.escape(value)}</pre>")
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{REPORT_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n"
        )


REPORT_CSS = (
    "body{font-family:sans-serif;max-width:62em;margin:1.5em auto;padding:0 1em;line-height:1.4;color:#111}"
    "table{border-collapse:collapse;margin:0.6em 0 1.2em;font-size:0.85em}"
    "caption{text-align:left;font-style:italic;padding-bottom:0.3em}"
    "th,td{border:1px solid #bbb;padding:2px 6px;text-align:right;overflow-wrap:anywhere}th{background:#eee}"
    "td:first-child,th:first-child{text-align:left}"
    "figure{margin:1em 0}img{max-width:100%;height:auto}figcaption{font-size:0.85em;color:#444}"
    "pre{background:#f4f4f4;padding:0.6em;white-space:pre-wrap;word-break:break-all;font-size:0.8em}"
    "h2{border-bottom:2px solid #333;margin-top:2em}h3{margin-top:1.5em}"
    "@media print{body{max-width:none;margin:0}h2{break-before:page}h2:first-of-type{break-before:auto}"
    "table,figure,pre{break-inside:avoid}a{color:inherit}}"
)


def _anchor(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _markdown_table(frame: Any) -> str:
    """A pipe table of every row and column (no truncation), '|' escaped."""
    cell = lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v).replace("|", "\\|")  # noqa: E731
    head = "| " + " | ".join(cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def _number(value: Any, digits: int = 2) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "" if value is None else str(value)
    return "" if v != v else f"{v:.{digits}f}"


def with_interval(row: Any, metric: str, digits: int = 2, low: str = "_ci_low", high: str = "_ci_high") -> str:
    """'x [low, high]', or 'x' where the row has no interval for `metric`."""
    value = _number(row.get(metric), digits)
    lo, hi = _number(row.get(metric + low), digits), _number(row.get(metric + high), digits)
    return f"{value} [{lo}, {hi}]" if value and lo and hi else value


def pivot(frame: Any, metric: str, index: str = "shape", columns: str = "budget", digits: int = 2) -> Any:
    """`index` x `columns` of `metric` (with its interval where the table has one), rows in the
    table's order; every row kept."""
    import pandas as pd

    cells = frame.copy()  # one block: the caller's frame may have been built column by column
    cells["_cell"] = [with_interval(r, metric, digits) for _, r in frame.iterrows()]
    table = cells.pivot_table(index=index, columns=columns, values="_cell", aggfunc="first")
    order = [k for k in pd.unique(frame[index]) if k in table.index]
    table = table.reindex(order).fillna("")
    table.columns = [str(c) for c in table.columns]
    return table.reset_index()


def _csv(folder: Path, name: str) -> Any:
    import pandas as pd

    path = folder / name
    return pd.read_csv(path) if path.exists() else None


def _reading(doc: _Doc, label: str, compute: Any) -> None:
    """A computed reading (`notebook.readings`), or why it could not be computed."""
    try:
        doc.text(compute())
    except Exception as e:
        doc.text(f"*{label}: not computed from this run's tables ({type(e).__name__}: {e}).*")


def _not_run(doc: _Doc, notebook: str, outputs: Path) -> None:
    doc.text(
        f"**{REPORT_NOTEBOOKS[notebook]} did not run** (no finished run under {outputs.name}/{notebook}/). "
        f"Run it with `./run_notebooks.sh course --notebook {notebook}`."
    )


def _target_model(curve: Any) -> str | None:
    targets = curve[curve["role"] == "target"]["model"] if curve is not None and "role" in curve else []
    return str(targets.iloc[0]) if len(targets) else None


def write_report(outputs: Path) -> tuple[Path, Path]:
    """outputs/report.md and report.html from the latest finished run of 01, 02 and 03: method,
    results, analysis, reproduce. A notebook without a finished run is said so in each section."""
    outputs = Path(outputs)
    runs = {nb: latest_run(outputs, nb) for nb in REPORT_NOTEBOOKS}
    info = {nb: json.loads((f / "params.json").read_text()) for nb, f in runs.items() if f is not None}
    doc = _Doc(outputs)
    doc.heading(1, "Tree speculative decoding: report")
    ran = ", ".join(
        f"{REPORT_NOTEBOOKS[nb]} ({info[nb].get('profile')}, {info[nb].get('started')}"
        + (", run interactively" if info[nb].get("status") == "interactive" else "")
        + ")"
        for nb in info
    )
    doc.text(
        f"From the latest finished run of each notebook under `{outputs}`: {ran or 'none'}. "
        "Sections: 1 Method, 2 Results, 3 Analysis, 4 Reproduce, 5 Limitations, 6 References, 7 Glossary. The "
        "per-notebook appendices (every table and figure, with the code) are linked in section 4."
    )
    _method(doc, runs)
    _results(doc, runs, outputs)
    _analysis(doc, runs, outputs)
    _reproduce(doc, runs, info, outputs)
    _limitations(doc, info)
    doc.heading(2, "6 References")
    doc.text(f"Cited above; as BibTeX in `{BIBTEX}` beside this report.\n\n" + references.markdown())
    doc.heading(2, "7 Glossary")
    doc.text(glossary.markdown())
    md = outputs / REPORT_MD
    page = outputs / REPORT_HTML
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / BIBTEX).write_text(references.bibtex())
    md.write_text(doc.markdown())
    page.write_text(doc.html("specnb report"))
    return md, page


def _method(doc: _Doc, runs: dict[str, Path | None]) -> None:
    from .readings import greedy_summary

    doc.heading(2, "1 Method")
    doc.text(METHOD)
    doc.heading(3, "One verification of a tree")
    figure = doc.outputs / MASK_FIGURE
    _draw_mask(figure)
    doc.figure(
        figure,
        "a tree of 6 draft tokens and the mask of its one verification: each node attends to the cached prefix, "
        "the root and its own ancestors; siblings share a position id (prefix + depth)",
    )
    f = runs["01_tree_shapes"]
    if f is not None and (f / "trees.png").exists():
        doc.heading(3, "The trees measured")
        doc.figure(
            f / "trees.png",
            "01: each shape at up to three budgets (a node's label: its rank among its siblings; its row: its depth); "
            "your trees at their node count, your shape rules filled as the presets are",
        )
    doc.heading(3, "Conventions")
    doc.text(CONVENTIONS)
    doc.heading(3, "Exactness checks in this run")
    lines = []
    f = runs["01_tree_shapes"]
    if f is None:
        lines.append("- 01 did not run: no replay check, no greedy check of its own")
    else:
        agree = _csv(f, "replay_agreement.csv")
        if agree is not None and len(agree):
            same, total = int(agree["identical_steps"].sum()), int(agree["steps_compared"].sum())
            ties, bad = int(agree["tie_steps"].sum()), int(agree["mismatched_steps"].sum())
            methods = ", ".join(f"{r.method} ({r.source})" for r in agree.itertuples())
            lines.append(
                f"- 01, replay against real runs: **{same}/{total} steps identical**, {ties} numerical ties, "
                f"{bad} mismatches ({methods})"
            )
        measured = _csv(f, "measured.csv")
        if measured is not None and len(measured):
            lines.append("- 01, end-to-end runs: " + greedy_summary(measured))
    f = runs["02_model_pairs"]
    if f is None:
        lines.append("- 02 did not run: no greedy check of its pairs")
    else:
        table = _csv(f, "pairs_methods.csv")
        if table is not None and len(table):
            for pair, t in table.groupby("pair", sort=False):
                lines.append(f"- 02, {pair}: " + greedy_summary(t))
    f = runs["03_tree_attention_timing"]
    if f is None:
        lines.append("- 03 did not run: no check of the attention implementations")
    else:
        check = _csv(f, "reference_check.csv")
        if check is not None and len(check):
            parts = ", ".join(
                f"{r.impl} {r.max_abs_error:.1e} (tolerance {r.tolerance:.0e})"
                + ("" if r.ok is True or str(r.ok) == "True" else f" **{r.note or 'not ok'}**")
                for r in check.itertuples()
            )
            lines.append(f"- 03, tree attention against the reference (max abs error): {parts}")
    doc.text("\n".join(lines))


def _draw_mask(path: Path) -> None:
    import matplotlib.pyplot as plt

    from ..core.trees import Tree
    from . import plots

    path.parent.mkdir(parents=True, exist_ok=True)
    plt.close(plots.tree_mask(Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), 3, path))


def _results(doc: _Doc, runs: dict[str, Path | None], outputs: Path) -> None:
    doc.heading(2, "2 Results")
    doc.heading(3, "The brief's grid: every pair x tree shape x budget (02, replayed)")
    f = runs["02_model_pairs"]
    grid = _csv(f, "grid.csv") if f is not None else None
    if f is None:
        _not_run(doc, "02_model_pairs", outputs)
    elif grid is None or not len(grid):
        doc.text("02's run wrote no grid (its parameter `grid` was off, or no pair ran).")
    else:
        _pairs_grid(doc, f, grid)
    doc.heading(3, "Acceptance by tree shape and budget, one pair in depth (01, replayed)")
    f = runs["01_tree_shapes"]
    if f is None:
        _not_run(doc, "01_tree_shapes", outputs)
    else:
        table = _csv(f, "replay.csv")
        if table is None:
            doc.text("01's run wrote no replay.csv.")
        else:
            pair = _pair_of(f)
            doc.text(
                f"Pair {pair}: {int(table['prompts'].max())} prompts; rows: tree shape, columns: draft tokens "
                "(budget). dynamic: a tree grown per step from the draft's confidence; oracle: the best tree "
                "drawn from the draft's top-k in hindsight of every step (a bound, not a method)."
            )
            for metric, label in METRICS:
                if metric in table:
                    doc.table(pivot(table, metric), f"{label}; 01, {pair}")
        doc.figure(f / "tau_vs_budget.png", "01: tau by budget per shape")
        doc.figure(f / "rate_vs_budget.png", "01: acceptance rate by budget per shape")
        measured = _csv(f, "measured.csv")
        if measured is not None and len(measured):
            doc.table(_speed_table(measured), "01: run end to end on the check prompts (wall clock on this device)")
    doc.heading(3, "Acceptance and speed by model pair (02)")
    f = runs["02_model_pairs"]
    if f is None:
        _not_run(doc, "02_model_pairs", outputs)
    else:
        table = _csv(f, "pairs_methods.csv")
        status = _csv(f, "pairs.csv")
        if status is not None and len(status):
            doc.table(status, "02: the pairs and whether each was measured")
        for pair, t in table.groupby("pair", sort=False) if table is not None else ():
            doc.heading(4, f"02: {pair}")
            for metric, label in METRICS:
                doc.table(pivot(t, metric), f"{label}; 02, {pair}")
            doc.table(_speed_table(t), f"02, {pair}: speed and greedy equality")
        doc.figure(f / "speedup.png", "02: tokens/s over the target alone per pair and method")
    doc.heading(3, "Tree-attention time by batch size, prefix length and draft length (03)")
    f = runs["03_tree_attention_timing"]
    if f is None:
        _not_run(doc, "03_tree_attention_timing", outputs)
    else:
        speed = _csv(f, "speedup.csv")
        if speed is not None and len(speed):
            _speedup_tables(doc, speed)
        doc.figure(f / "tree_speedup.png", "03: one tree-masked call against one call per root-to-leaf sequence")
        grid = _csv(f, "attention_grid.csv")
        if grid is not None:
            _grid_tables(doc, grid)
        doc.figure(f / "time_vs_nodes.png", "03: attention time by draft tokens")
        doc.figure(f / "time_vs_prefix_batch.png", "03: attention time by prefix length and batch size")
    doc.heading(3, "The best tree per pair, on held-out prompts (01)")
    f = runs["01_tree_shapes"]
    if f is None:
        _not_run(doc, "01_tree_shapes", outputs)
    else:
        _best_tree(doc, f)


def _pairs_grid(doc: _Doc, folder: Path, grid: Any) -> None:
    """02's grid: the best tree per budget per pair, then per pair each metric as shape x budget
    (value [95% interval]), the notes of rows without values, and the figures."""
    best = _csv(folder, "grid_best.csv")
    doc.text(
        f"{grid['pair'].nunique()} pairs, {int(grid['prompts'].max())} prompts each, replayed from one collection per "
        "pair (re-drafted across tokenizers). Rows: tree shape, columns: draft tokens (budget); each cell "
        "value [95% interval over prompts]. Designs (sequoia, medusa) are fitted to these prompts: their held-out "
        "tau is in the best-tree table; hindsight is the in-sample ceiling, oracle a bound."
    )
    if best is not None and len(best):
        shown = best.assign(tau_heldout=[with_interval(r, "tau_heldout") for _, r in best.iterrows()])
        doc.table(
            shown[["pair", "kind", "budget", "best_shape", "tau_heldout", "runner_up", "runner_up_tau", "oracle_tau"]],
            "02: the best tree per budget, per pair (held-out tau, bonus included)",
        )
    doc.figure(folder / "grid_best.png", "02: the best tree per budget, the pairs compared")
    for pair, t in grid.groupby("pair", sort=False):
        doc.heading(4, f"02: {pair} ({t['kind'].iloc[0]})")
        for metric, label in METRICS:
            doc.table(pivot(t, metric), f"{label}; 02, {pair}")
        notes = t[t["tau"].isna() & t["note"].notna()].drop_duplicates("shape")
        for r in notes.itertuples():
            doc.text(f"{r.shape}: {r.note}.")
    doc.figure(folder / "grid_tau.png", "02: tau by budget per shape, one panel per pair")
    doc.figure(folder / "grid_rate.png", "02: acceptance rate by budget per shape, one panel per pair")


def _pair_of(folder: Path) -> str:
    from ..io.tree_results import RESULTS_FILE, read

    if (folder / RESULTS_FILE).exists():
        try:
            return read(folder).pair
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return "(pair not recorded)"


def _speed_table(table: Any) -> Any:
    import pandas as pd

    rows = []
    for _, r in table.iterrows():
        rows.append(
            {
                "shape": r.get("shape"),
                "budget": r.get("budget"),
                "source": r.get("source", "measured"),
                "prompts": r.get("prompts"),
                "tokens/s": _number(r.get("tokens_per_s")),
                "target alone tokens/s": _number(r.get("baseline_tokens_per_s")),
                "speed-up": with_interval(r, "speedup"),
                "greedy equal": f"{int(r['greedy_equal'])}/{int(r['prompts'])}" if "greedy_equal" in r else "",
            }
        )
    return pd.DataFrame(rows)


def _grid_tables(doc: _Doc, grid: Any) -> None:
    """Per implementation: (shape, batch, prefix) x draft tokens of the median time in ms, with its
    quartiles for the tree implementations; skipped points said."""
    device = ", ".join(sorted({str(d) for d in grid.get("device", [])}))
    dtype = ", ".join(sorted({str(d) for d in grid.get("dtype", [])}))
    doc.text(
        f"Median time of one attention call in ms [25th, 75th percentile], on {device or 'the device'} in "
        f"{dtype or 'its dtype'}; rows: batch size and longest prefix (sequence length) in the batch, columns: "
        "draft tokens per tree. causal: plain causal attention over the same tokens (the floor, no tree mask)."
    )
    g = grid.copy()
    ok = g["status"].eq("ok") if "status" in g else g["impl"].notna()
    g["_cell"] = [_ms_cell(r) if good else "skipped" for (_, r), good in zip(g.iterrows(), ok)]
    index = ["shape", "batch", "prefix"] if g["shape"].nunique() > 1 else ["batch", "prefix"]
    for impl, t in g.groupby("impl", sort=False):
        table = t.pivot_table(index=index, columns="nodes", values="_cell", aggfunc="first").fillna("")
        table.columns = [str(c) for c in table.columns]
        doc.table(table.reset_index(), f"03: {impl}, ms by draft tokens")
    notes = sorted({str(n) for n in g.loc[~ok, "note"] if n == n}) if "note" in g else []
    if notes:
        doc.text("Skipped points: " + "; ".join(notes))


def _speedup_tables(doc: _Doc, speed: Any) -> None:
    """The brief's question about tree attention: how much one tree-masked call saves over one call
    per root-to-leaf sequence (per_sequence_over_tree), and what the tree mask costs over plain
    causal attention on the same tokens (mask_overhead), by (batch, prefix) x draft tokens."""
    doc.text(
        "How much one tree-masked call (SDPA with the tree mask) saves over one call per root-to-leaf sequence "
        "(what verifying each candidate continuation separately costs): per_sequence / tree time, above 1 the tree "
        "call is faster; leaves: the sequences one tree call replaces. Then the tree mask's own cost: tree time over "
        "plain causal attention on the same number of tokens (1 = free)."
    )
    index = ["shape", "batch", "prefix"] if speed["shape"].nunique() > 1 else ["batch", "prefix"]
    for column, caption in (
        ("per_sequence_over_tree", "03: speed-up of one tree call over one call per sequence (x), by draft tokens"),
        ("mask_overhead", "03: tree mask over plain causal attention (x), by draft tokens"),
    ):
        if column in speed:
            table = speed.pivot_table(index=index, columns="nodes", values=column, aggfunc="first").round(2)
            table.columns = [str(c) for c in table.columns]
            doc.table(table.reset_index(), caption)
    if "leaves" in speed:
        leaves = speed.drop_duplicates(["shape", "nodes"])[["shape", "nodes", "leaves", "depth"]]
        doc.table(leaves, "03: the trees timed (leaves: sequences one tree call replaces)")


def _ms_cell(row: Any) -> str:
    value, low, high = (_number(row.get(k), 3) for k in ("median_ms", "q25_ms", "q75_ms"))
    return f"{value} [{low}, {high}]" if low and high else value


def _best_tree(doc: _Doc, folder: Path) -> None:
    import pandas as pd

    from ..io.tree_results import DEPLOY_FILE, RESULTS_FILE, read
    from . import readings

    if not (folder / RESULTS_FILE).exists():
        doc.text(f"01's run wrote no {RESULTS_FILE} (a run from before it did).")
        return
    results = read(folder)
    rec = results.recommendation
    if rec is None:
        doc.text(f"{results.pair}: no tree recommended (nothing had a held-out tau).")
    else:
        measured = (
            f"; run end to end on {rec.measured_prompts} prompts: {rec.measured_speedup:.2f}x"
            + readings.against_expected(rec.measured_speedup, rec.speedup_low, rec.speedup_high)
            if rec.measured_speedup is not None
            else ""
        )
        doc.text(
            f"**{results.pair}**: deploy **{rec.tree.name} with {rec.tree.budget} draft tokens** "
            f"({'fitted to the data' if rec.tree.fitted else 'a preset'}), held-out tau {rec.tree.tau_heldout:.2f} "
            f"[{rec.tau_low:.2f}, {rec.tau_high:.2f}], expected {rec.speedup:.2f}x [{rec.speedup_low:.2f}, "
            f"{rec.speedup_high:.2f}] the target alone on {rec.device or 'its device'}: **{rec.verdict}**{measured} "
            "(nan: too few prompts for an interval)."
        )
    trees = results.table()
    if len(trees):
        trees = trees.drop(columns="paths")  # the recommended tree's paths are in its deploy lines below
        trees = trees.assign(**{c: trees[c].map(_number) for c in ("tau_in_sample", "tau_heldout")})
        doc.table(pd.DataFrame(trees), "01: every tree scored, per budget (tau in-sample and on held-out prompts)")
    engines = _csv(folder, "engine_choice.csv")
    if engines is not None and len(engines):
        doc.table(engines, "01: the fastest tree each serving engine drafts as verified, and what it gives up")
    if (folder / DEPLOY_FILE).exists():
        doc.text(f"Deploy lines ({DEPLOY_FILE} in 01's run folder):")
        doc.code((folder / DEPLOY_FILE).read_text())
    doc.figure(folder / "tree_best.png", "01: the tree of highest held-out tau")


def _analysis(doc: _Doc, runs: dict[str, Path | None], outputs: Path) -> None:
    from . import readings

    doc.heading(2, "3 Analysis")
    doc.text("The readings each notebook computed, recomputed here from the tables of its run (no fixed text).")
    doc.heading(3, "Tree shapes and budgets (01)")
    f = runs["01_tree_shapes"]
    if f is None:
        _not_run(doc, "01_tree_shapes", outputs)
    else:
        _reading(doc, "01's reading", lambda: readings.replay_reading(*_replay_inputs(f)))
        curve = _csv(f, "verify_curve.csv")
        if curve is not None:
            _reading(doc, "01's verify curve", lambda: readings.curve_reading(curve, _target_model(curve)))
    doc.heading(3, "Model pairs (02)")
    f = runs["02_model_pairs"]
    if f is None:
        _not_run(doc, "02_model_pairs", outputs)
    else:
        best = _csv(f, "grid_best.csv")
        if best is not None and len(best):
            _reading(doc, "02's grid", lambda: readings.grid_reading(best, _csv(f, "grid_ranks.csv")))
        table, versus = _csv(f, "pairs_methods.csv"), _csv(f, "versus_transformers.csv")
        _reading(doc, "02's reading", lambda: readings.pairs_reading(table, versus))
        by_category = _csv(f, "by_category.csv")
        if by_category is not None and len(by_category):
            _reading(doc, "02's categories", lambda: readings.categories_note(by_category))
    doc.heading(3, "Tree-attention timing and the budget on this device (03)")
    f = runs["03_tree_attention_timing"]
    if f is None:
        _not_run(doc, "03_tree_attention_timing", outputs)
    else:
        curve, cost = _csv(f, "verify_curve.csv"), _csv(f, "cost_model.csv")
        if curve is not None:
            _reading(doc, "03's verify curve", lambda: readings.curve_reading(curve, _target_model(curve)))
        if cost is not None:
            source = (
                readings.RECOMMENDATION_03_FROM_01
                if cost["shape"].astype(str).str.startswith("01:").any()
                else readings.RECOMMENDATION_03
            )
            _reading(doc, "03's recommendation", lambda: readings.recommendation(cost, source))
        speed = _csv(f, "speedup.csv")
        if speed is not None and len(speed):
            _reading(doc, "03's tree attention", lambda: readings.attention_reading(speed))
        doc.figure(f / "verify_cost.png", "03: verify cost by tree size and the cost model")


def _replay_inputs(folder: Path) -> tuple:
    """What `readings.replay_reading` takes, from 01's saved tables and tree_results.json."""
    from ..analysis.heldout import Choice
    from ..io.tree_results import RESULTS_FILE, read

    table, agreement, held = (_csv(folder, n) for n in ("replay.csv", "replay_agreement.csv", "heldout.csv"))
    if table is None or agreement is None or held is None:
        raise FileNotFoundError("replay.csv, replay_agreement.csv or heldout.csv missing")
    held["fitted"] = held["fitted"].astype(bool)
    choice = None
    if (folder / RESULTS_FILE).exists() and read(folder).recommendation is not None:
        rec = read(folder).recommendation
        choice = Choice(
            rec.tree.name,
            rec.tree.budget,
            rec.tree.tree,
            rec.tree.fitted,
            rec.tree.tau_heldout,
            rec.tau_low,
            rec.tau_high,
            rec.speedup,
            rec.speedup_low,
            rec.speedup_high,
            rec.verdict,
        )
    return (
        table,
        agreement,
        held,
        choice,
        _csv(folder, "recommended_measured.csv"),
        _csv(folder, "recommendation_folds.csv"),
    )


def _reproduce(doc: _Doc, runs: dict[str, Path | None], info: dict[str, dict], outputs: Path) -> None:
    import pandas as pd

    doc.heading(2, "4 Reproduce")
    profiles = sorted({str(i.get("profile")) for i in info.values()}) or ["course"]
    books = " ".join(f"--notebook {nb}" for nb in REPORT_NOTEBOOKS)
    doc.text("From a clone of specnb (set-up, the embedded models, then the notebooks, then this report):")
    doc.code(
        "\n".join(
            [f"./run_notebooks.sh {p} {books}" for p in profiles]
            + ["./run_notebooks.sh course    # the same three notebooks: cpu values, t4 values on a GPU"]
            + ["python -m specnb.notebook.report    # this report again, from the runs under outputs/"]
        )
    )
    rows = []
    for nb in REPORT_NOTEBOOKS:
        i = info.get(nb)
        if i is None:
            rows.append({"notebook": nb, "run": "did not run"})
            continue
        env, timing = i.get("environment", {}), i.get("timing", {})
        rows.append(
            {
                "notebook": nb,
                "run": runs[nb].name,
                "profile": i.get("profile"),
                "started": i.get("started"),
                "commit": (env.get("git_commit") or "")[:12],
                "device": env.get("device"),
                "torch threads": env.get("torch_threads"),
                "decode (ms)": _number(timing.get("decode_ms"), 0),
                "estimate (s)": _number(timing.get("estimate_s"), 0),
                "actual (s)": i.get("duration_s"),
                "appendix": f"{runs[nb].relative_to(outputs)}/{nb}{REPORT_SUFFIX}",
            }
        )
    doc.table(pd.DataFrame(rows), "the runs this report reads")
    decodes = {str(i.get("timing", {}).get("decode")) for i in info.values() if i.get("timing", {}).get("decode")}
    if decodes:
        doc.text("Decode step: " + "; ".join(sorted(decodes)) + ".")
    first = next(iter(info.values()), None)
    if first is not None:
        env = first.get("environment", {})
        versions = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v)
        doc.text(f"Python {env.get('python')} on {env.get('platform')}; {versions}.")
    for nb, i in info.items():
        params = {k: v for k, v in i.get("parameters", {}).items() if k != "run_dir"}
        table = pd.DataFrame({"parameter": list(params), "value": [_short(v, 100_000) for v in params.values()]})
        doc.table(table, f"{nb}: parameters (params.json in its run folder)")


BRIEF_PAIRS = ("Llama-2-7b", "Llama-3.2-3B")  # the brief's targets (a 7B and a 3B Llama in 4-bit, on a T4)


def _limitations(doc: _Doc, info: dict[str, dict]) -> None:
    """What the runs cannot say, read from their records: the device, the models against the
    brief's, the prompts and tokens each notebook ran, and what replay does not cover."""
    doc.heading(2, "5 Limitations")
    lines = []
    devices = sorted({str(i.get("environment", {}).get("device")) for i in info.values()} - {"None"})
    if devices:
        gpu = any(d.startswith("cuda") for d in devices)
        lines.append(
            f"- Device: {', '.join(devices)}. "
            + (
                "Speeds are this GPU's; a T4 differs."
                if gpu
                else "A CPU: wall-clock speed-ups here say nothing about a GPU, where a verify of N tokens costs "
                "little more than one decoded token until the GPU saturates (notebook 03's curve shows this "
                "machine's); acceptance (rate, length, tau) does not depend on the device."
            )
        )
    models = sorted(
        {str(p.get(k)) for i in info.values() for p in _pairs_of(i) for k in ("target", "draft") if p.get(k)}
    )
    if models:
        brief = any(b in m for m in models for b in BRIEF_PAIRS)
        lines.append(
            f"- Models: {', '.join(models)}. "
            + (
                "These are the brief's Llama models."
                if brief
                else "Not the brief's Llama pairs (no model hub here): the embedded stand-ins of the same kinds "
                "(a smaller model of the family, a draft of another tokenizer, a quantized self-draft); the t4 "
                "profile runs the brief's pairs on Colab."
            )
        )
    for nb, i in info.items():
        p = i.get("parameters", {})
        if p.get("max_prompts") and p.get("max_new_tokens"):
            lines.append(
                f"- {REPORT_NOTEBOOKS.get(nb, nb)}: {p['max_prompts']} prompts x {p['max_new_tokens']} new tokens "
                "(intervals over prompts say how far the values could move with other prompts of the same kind)."
            )
    lines.append(
        "- Greedy decoding throughout the grid: replay is exact for greedy outputs; sampled acceptance is tested "
        "statistically in the test suite, not tabled here."
    )
    doc.text("\n".join(lines))


def _pairs_of(info: dict) -> list[dict]:
    """The pairs a run's parameters name: 02's list, or 01's and 03's one pair."""
    p = info.get("parameters", {})
    return list(p.get("pairs") or []) + (
        [{"target": p.get("target"), "draft": p.get("draft")}] if p.get("target") else []
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specnb.notebook.report", description=__doc__.split("\n")[0])
    ap.add_argument("--outputs", type=Path, default=None, help="default: $SPECNB_OUTPUTS, else outputs/")
    ap.add_argument(
        "--example",
        type=Path,
        default=None,
        help="also copy the report (markdown, its figures, references.bib) into this folder, e.g. docs/example",
    )
    args = ap.parse_args(argv)
    outputs = args.outputs or Path(os.environ.get("SPECNB_OUTPUTS") or Path(__file__).resolve().parents[2] / "outputs")
    outputs = outputs.expanduser()
    write_index(outputs)
    md, page = write_report(outputs)
    print(f"{page}\n{md}")
    if args.example is not None:
        print(copy_example(outputs, args.example))
    return 0


def copy_example(outputs: Path, folder: Path) -> Path:
    """The report's markdown, the figures it shows (at their relative paths) and references.bib,
    copied into `folder` (emptied first): a report one can read in the repository, small."""
    import re
    import shutil

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    text = (outputs / REPORT_MD).read_text()
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        target = folder / link
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(outputs / link, target)
    shutil.copyfile(outputs / BIBTEX, folder / BIBTEX)
    (folder / REPORT_MD).write_text(text)
    return folder / REPORT_MD


if __name__ == "__main__":
    sys.exit(main())
