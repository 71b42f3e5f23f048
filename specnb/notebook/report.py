"""Report appendices, the index of every run, and the course report (notebook 07).

    export(executed, record)  -> (<stem>.html, <stem>.report.html) beside the executed notebook:
        full    the executed notebook as it ran: code, outputs, everything
        report  what a reader of a report needs, without the code: the markdown, every figure,
                table and computed reading, with the parameters the run was given as a table at
                the top (the code cells' inputs, the papermill parameter cells, prompts, progress
                bars and warnings on stderr are left out)
    write_index(outputs)      -> outputs/index.md and outputs/index.html: every run with its status,
        both forms and its files; index.html shows each run's headline figure inline (the notebook
        names it in its metadata, "specnb": {"headline": "<file>.png"}; otherwise its first figure)

    Report(outputs, runs)     what notebooks/07_report.ipynb shows, part by part in the course brief's
        order: the runs read (the latest finished run of 01, 02 and 03, or those named), the method's
        figures and exactness checks, the results (the brief's grid per pair, 01's pair in depth,
        02's methods, tree attention across batch, prefix and draft length, the best tree per
        engine), the analysis drafted from the tables (`notebook.readings`), reproduce, limitations,
        references, glossary. Tables are markdown (every row), figures images: nbconvert exports both.
    publish(executed, outputs) -> outputs/report.ipynb from 07's executed notebook (the drafted
        analysis as markdown cells the student rewrites; an edited one is kept, never overwritten),
        then export_report(report.ipynb) -> report.html (self-contained), report.md (+ report_files/),
        references.bib and report.pdf (`notebook.pdf`, no browser needed)

    python -m specnb.notebook.report [REPORT.ipynb] [--outputs DIR] [--example DIR]
        report.ipynb exported again (after the student's edits), and the index

The figures are embedded in both HTML forms and in report.html (nbconvert writes them as data URIs),
so each is one self-contained file; the index links the PNGs in the run folders beside it. Tables
are whole: the report renders every row, and the notebooks display every row
(`session.whole_tables`), so an appendix shows what the kernel displayed, not pandas' first and
last five rows.
"""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import nbformat

from . import glossary, references, registry
from .pdf import markdown_pdf
from .places import default_outputs

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


def run_spec(notebook: Path) -> registry.NotebookSpec:
    """The spec of the run's executed notebook (its metadata carries it, `registry`): the notebook's
    own, wherever it was run from; `registry.DEFAULT` where the notebook is missing or unreadable."""
    try:
        return registry.read_spec(notebook)
    except registry.SpecError:
        return replace(registry.DEFAULT, stem=Path(notebook).stem)


def headline(folder: Path, notebook: Path | None = None) -> str | None:
    """The run's headline figure (a file name in `folder`): the one its notebook's spec names when it
    exists, else the first PNG by name; None without figures."""
    name = run_spec(notebook).headline if notebook is not None else None
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
        executed = folder / f"{info.get('notebook')}.ipynb"
        figure = headline(folder, executed)
        rows.append((info, folder.relative_to(outputs), files, figure, run_spec(executed).purpose))
    md = [
        "# specnb runs",
        "",
        "| notebook | run | profile | status | started | duration (s) | commit | appendix | files |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    purposes = {str(info.get("notebook")): purpose for info, _, _, _, purpose in rows}
    md[1:1] = ["", *(f"- **{stem}**: {purpose}" for stem, purpose in sorted(purposes.items()))]
    for info, rel, files, figure, purpose in rows:
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
        body.append(_index_html_row(info, rel, figure, commit, forms, others, purpose))
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
    info: dict,
    rel: Path,
    figure: str | None,
    commit: str,
    forms: list[tuple[str, str]],
    others: list[str],
    purpose: str,
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
        f"<tr><td><b>{html.escape(stem)}</b><br><i>{html.escape(purpose)}</i><br>{html.escape(rel.name)}"
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


# ---- the course report: notebook 07 shows it (`Report`), `publish` hands it in ----

REPORT_IPYNB, REPORT_MD = "report.ipynb", "report.md"  # in outputs/, beside report.html and report.pdf
REPORT_FILES = "report_files"  # the figures of report.md, beside it
SUMMARY_FILE = "run_summary.json"  # written by the runner (`runner.SUMMARY_FILE`)
BIBTEX = "references.bib"  # beside the report: the references for the student's own
MASK_FIGURE = "report_tree_mask.png"  # the method's drawing of a tree and its mask, in 07's run folder
DRAFT_TAG = "draft"  # a code cell of 07 whose markdown output becomes a markdown cell the student rewrites
SKIP_TAGS = ("parameters", "injected-parameters", "notebook-only")  # 07's cells left out of the published report
DRAFT_MARK = "<!-- drafted by specnb from this run's tables: rewrite it in your own words -->\n"
METRICS = (
    ("acceptance_rate", "acceptance rate (accepted / drafted)"),
    ("acceptance_length", "acceptance length (accepted tokens per target call, bonus token excluded)"),
    ("tau", "tau (tokens per target call, bonus token included)"),
)
PRINT_CSS = (  # report.html on paper (report.pdf): nothing cut at a page edge, wide tables kept on the page
    "@page{size:A4;margin:12mm}"
    ".jp-RenderedMarkdown table,.jp-RenderedHTMLCommon table{font-size:8pt;max-width:100%;table-layout:auto}"
    ".jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th{overflow-wrap:anywhere;padding:1px 4px}"
    "img{max-width:100%;height:auto}"
    "pre{white-space:pre-wrap;overflow-wrap:anywhere}"
    "@media print{table,img,pre,figure{break-inside:avoid}h2{break-before:page}h1+*h2{break-before:auto}"
    "h2,h3,h4{break-after:avoid}}"
)


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
        last = registry.spec(notebook).written_last  # its spec's: the file it writes last
        done = info.get("status") == "interactive" and last is not None and (params.parent / last).exists()
        if info.get("status") == "finished" or done:
            found.append((str(info.get("started", "")), params.parent.name, params.parent))
    return max(found)[2] if found else None


class _Doc:
    """A part of the report as blocks (headings, markdown, tables, figures, code), shown in the
    notebook as markdown and images: nbconvert exports them (`export_report`)."""

    def __init__(self, outputs: Path) -> None:
        self.outputs = outputs
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("text", "#" * level + " " + text))

    def text(self, markdown: str) -> None:
        self.blocks.append(("text", markdown))

    def table(self, frame: Any, caption: str = "") -> None:
        self.blocks.append(("text", (f"*{caption}*\n\n" if caption else "") + _markdown_table(frame)))

    def figure(self, path: Path, caption: str) -> None:
        if path.exists():
            self.blocks.append(("figure", (path, caption)))

    def code(self, text: str) -> None:
        self.blocks.append(("text", "```\n" + text.rstrip("\n") + "\n```"))

    def markdown(self) -> str:
        """The text blocks as one markdown string (figures left out): what a draft cell becomes."""
        return "\n\n".join(value for kind, value in self.blocks if kind == "text")

    def show(self) -> None:
        from IPython.display import Image, Markdown, display

        text: list[str] = []
        for kind, value in self.blocks + [("end", None)]:
            if kind == "text":
                text.append(value)
                continue
            if text:
                display(Markdown("\n\n".join(text)))
                text = []
            if kind == "figure":
                path, caption = value
                display(Image(filename=str(path), alt=caption))
                display(Markdown(f"*{caption}*"))


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


def _csv(folder: Path | None, name: str) -> Any:
    import pandas as pd

    path = folder / name if folder is not None else None
    return pd.read_csv(path) if path is not None and path.exists() else None


def _reading(doc: _Doc, label: str, compute: Any) -> None:
    """A computed reading (`notebook.readings`), or why it could not be computed."""
    try:
        doc.text(compute())
    except Exception as e:
        doc.text(f"*{label}: not computed from this run's tables ({type(e).__name__}: {e}).*")


def _target_model(curve: Any) -> str | None:
    targets = curve[curve["role"] == "target"]["model"] if curve is not None and "role" in curve else []
    return str(targets.iloc[0]) if len(targets) else None


class Report:
    """The course report's parts, each built from the runs of 01, 02 and 03 it reads and shown in
    notebook 07 (one method per part, in the brief's order). `runs` names a run folder per notebook;
    a notebook not named is read from its latest finished run under `outputs` (`latest_run`).
    Figures the report draws itself go into `folder` (07's run folder)."""

    def __init__(self, outputs: Path | str, runs: dict[str, str] | None = None, folder: Path | str | None = None):
        self.outputs = Path(outputs)
        self.folder = Path(folder) if folder is not None else self.outputs
        # the notebooks it reads (the report's spec, `registry`), by their stems
        self.nb_shapes, self.nb_pairs, self.nb_timing = (
            registry.stem(name) for name in ("tree_shapes", "model_pairs", "tree_attention_timing")
        )
        self.runs: dict[str, Path | None] = {}
        for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing):
            given = (runs or {}).get(nb) or ""
            if given and not (Path(given) / "params.json").exists():
                raise FileNotFoundError(
                    f"run folder {given!r} given for {nb} holds no params.json: name a folder listed in "
                    f"{self.outputs / 'index.md'}, or leave it empty for the latest finished run"
                )
            self.runs[nb] = Path(given) if given else latest_run(self.outputs, nb)
        self.info = {nb: json.loads((f / "params.json").read_text()) for nb, f in self.runs.items() if f is not None}
        self.labels = _pair_labels(_csv(self.runs[self.nb_pairs], "grid.csv"))

    def _read(self, folder: Path | None, name: str) -> Any:
        """A run's CSV table (None where it is missing), its pairs named by their labels (`_pair_labels`)."""
        frame = _csv(folder, name)
        if frame is not None and self.labels and "pair" in frame:
            frame["pair"] = frame["pair"].map(lambda p: self.labels.get(p, p))
        return frame

    PARTS = (  # in the report's order; each is built by the method of its name with a leading "_"
        "summary",
        "tree_mask",
        "trees",
        "exactness",
        "grid",
        "attention",
        "one_pair",
        "best_tree",
        "pairs",
        "analysis",
        "limitations",
        "references",
        "reproduce",
        "glossary",
    )

    def show(self, *parts: str) -> None:
        """Display `parts` (names in PARTS) in the notebook: markdown text and tables, figures."""
        self._build(parts).show()

    def text(self, *parts: str) -> str:
        """`parts` as one markdown string, figures left out (for scripts and tests)."""
        return self._build(parts).markdown()

    def _build(self, parts: tuple[str, ...]) -> _Doc:
        unknown = [p for p in parts if p not in self.PARTS]
        if unknown:
            raise ValueError(f"no report part {unknown}: the parts are {', '.join(self.PARTS)}")
        doc = _Doc(self.outputs)
        for part in parts:
            getattr(self, "_" + part)(doc)
        return doc

    def _pair_name(self, pair: str) -> str:
        """'the same tokenizer pair' where `pair` has a label (`_pair_labels`), else 'pair <draft -> target>'."""
        return f"the {self.labels[pair]} pair" if pair in self.labels else f"pair {pair}"

    def _appendix(self, notebook: str) -> str:
        """A markdown link to `notebook`'s appendix (its executed notebook as HTML), relative to the report."""
        folder = self.runs.get(notebook)
        if folder is None:
            return f"{notebook} did not run"
        return f"[{notebook}{REPORT_SUFFIX}]({notebook}/{folder.name}/{notebook}{REPORT_SUFFIX})"

    def _not_run(self, doc: _Doc, notebook: str) -> bool:
        """Says that `notebook` did not run (True), or nothing (False)."""
        if self.runs[notebook] is not None:
            return False
        doc.text(
            f"**{registry.spec(notebook).label} did not run** (no finished run under {self.outputs.name}/{notebook}/). "
            f"Run it with `./run_notebooks.sh course --notebook {notebook}`, then this notebook again."
        )
        return True

    def _summary(self, doc: _Doc) -> None:
        """What was run, on what, and the findings (`readings.findings`) from the tables below."""
        from . import readings

        doc.text(self._framing())
        one, pairs, attention = (self.runs[nb] for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing))
        inputs = (
            self._read(pairs, "grid_best.csv"),
            self._read(pairs, "grid_ranks.csv"),
            self._read(attention, "speedup.csv"),
            _verdict_table(one) if one is not None else None,
            self._read(pairs, "pairs_methods.csv"),
        )
        _reading(
            doc,
            "The findings",
            lambda: readings.findings(*inputs) or "*No findings: 01, 02 and 03 wrote none of its tables.*",
        )

    def _framing(self) -> str:
        """The models run, the device and its decode step, the profiles; whether these are the brief's pairs."""
        models = sorted(
            {str(p.get(k)) for i in self.info.values() for p in _pairs_of(i) for k in ("target", "draft") if p.get(k)}
        )
        devices = sorted({str(i.get("environment", {}).get("device")) for i in self.info.values()} - {"None"})
        profiles = sorted({str(i.get("profile")) for i in self.info.values()})
        decodes = sorted(
            {
                f"{_number(i['timing'].get('decode_ms'), 0)} ms, {str(i['timing']['decode']).split(', median')[0]}"
                if i["timing"].get("decode_ms")
                else str(i["timing"]["decode"])
                for i in self.info.values()
                if i.get("timing", {}).get("decode")
            }
        )
        brief = any(b in m for m in models for b in BRIEF_PAIRS)
        named = " ".join(self.labels)  # the pairs named by their kind: their models are in the legend
        others = [m for m in models if m not in named]
        out = (
            f"Measured with the {', '.join(profiles) or 'no'} profile on {', '.join(devices) or 'an unrecorded device'}"
            + (f" (decode step: {'; '.join(decodes)})" if decodes else "")
            + (
                ". Pairs (draft -> target), named by their kind below: "
                + "; ".join(f"**{label}**, {pair}" for pair, label in self.labels.items())
                if self.labels
                else ""
            )
            + (f"{'; other ' if self.labels else ', '}models {', '.join(others)}" if others or not self.labels else "")
            + ". "
        )
        if brief:
            return out + "These are the brief's Llama models."
        return out + (
            "These are not the brief's Llama pairs (4-bit Llama-2-7B and Llama-3.2-3B targets on a T4) but embedded "
            "stand-ins of the same kinds (no model hub here); the brief's pairs are the t4 profile's "
            "(`./run_notebooks.sh t4` on Colab), not run for this report. Acceptance does not depend on the "
            "device; speed does."
        )

    def _tree_mask(self, doc: _Doc) -> None:
        """A small tree beside the mask and position ids of its one verification."""
        figure = self.folder / MASK_FIGURE
        _draw_mask(figure)
        doc.figure(
            figure,
            "a tree of 6 draft tokens and the mask of its one verification: each node attends to the cached "
            "prefix, the root and its own ancestors; siblings share a position id (prefix + depth)",
        )

    def _trees(self, doc: _Doc) -> None:
        """01's drawing of every shape measured (and the user's trees) at its budgets."""
        figure = self.runs[self.nb_shapes] / "trees.png" if self.runs[self.nb_shapes] else None
        if figure is not None and not figure.exists():
            doc.text(f"*01's run drew no trees.png ({figure.parent.name}).*")
        elif not self._not_run(doc, self.nb_shapes):
            doc.figure(
                figure,
                "01: each shape at its largest budget up to 16 (a node's label: its sibling rank; its row: its depth)",
            )

    def _references(self, doc: _Doc) -> None:
        """The reference list; references.bib written beside the report."""
        self.outputs.mkdir(parents=True, exist_ok=True)
        (self.outputs / BIBTEX).write_text(references.bibtex())
        doc.text(f"Cited above; as BibTeX in `{BIBTEX}` beside this report.\n\n" + references.markdown())

    def _glossary(self, doc: _Doc) -> None:
        doc.text(glossary.markdown())

    def _exactness(self, doc: _Doc) -> None:
        from .readings import greedy_summary

        lines = []
        f = self.runs[self.nb_shapes]
        if f is None:
            lines.append("- 01 did not run: no replay check, no greedy check of its own")
        else:
            agree = self._read(f, "replay_agreement.csv")
            if agree is not None and len(agree):
                same, total = int(agree["identical_steps"].sum()), int(agree["steps_compared"].sum())
                ties, bad = int(agree["tie_steps"].sum()), int(agree["mismatched_steps"].sum())
                methods = ", ".join(f"{r.method} ({r.source})" for r in agree.itertuples())
                lines.append(
                    f"- 01, replay against real runs: **{same}/{total} steps identical**, {ties} numerical ties, "
                    f"{bad} mismatches ({methods})"
                )
            measured = self._read(f, "measured.csv")
            if measured is not None and len(measured):
                lines.append("- 01, end-to-end runs: " + greedy_summary(measured))
        f = self.runs[self.nb_pairs]
        if f is None:
            lines.append("- 02 did not run: no greedy check of its pairs")
        else:
            table = self._read(f, "pairs_methods.csv")
            if table is not None and len(table):
                said = [f"{pair}: " + greedy_summary(t) for pair, t in table.groupby("pair", sort=False)]
                prefix = "greedy outputs against the target's own: "
                lines.append("- 02, " + prefix + "; ".join(x.replace(prefix, "") for x in said))
        f = self.runs[self.nb_timing]
        if f is None:
            lines.append("- 03 did not run: no check of the attention implementations")
        else:
            check = self._read(f, "reference_check.csv")
            if check is not None and len(check):
                tolerances = ", ".join(f"{t:.0e}" for t in dict.fromkeys(check["tolerance"]))
                parts = ", ".join(
                    f"{r.impl} {r.max_abs_error:.1e}"
                    + ("" if r.ok is True or str(r.ok) == "True" else f" **{r.note or 'not ok'}**")
                    for r in check.itertuples()
                )
                lines.append(
                    f"- 03, tree attention, max abs error against the reference (tolerance {tolerances}): {parts}"
                )
        doc.text("\n".join(lines))

    def _grid(self, doc: _Doc) -> None:
        """02's grid: the best tree per budget per pair paired against the runner-up, the draft's rank
        shares, the winner per category, then the grid itself as one table (`_compact_grid`), and the figures."""
        from . import readings

        if self._not_run(doc, self.nb_pairs):
            return
        folder = self.runs[self.nb_pairs]
        grid = self._read(folder, "grid.csv")
        if grid is None or not len(grid):
            doc.text("02's run wrote no grid (its parameter `grid` was off, or no pair ran).")
            return
        best = self._read(folder, "grid_best.csv")
        tokens = self.info.get(self.nb_pairs, {}).get("parameters", {}).get("max_new_tokens")
        doc.text(
            f"{grid['pair'].nunique()} pairs, {int(grid['prompts'].max())} prompts each"
            + (f" x {tokens} new tokens" if tokens else "")
            + ", replayed. Per pair and budget: the winner by held-out tau, the runner-up and the winner's lead "
            "measured per prompt (paired) with its 95% interval, tied where it holds 0."
        )
        if best is not None and len(best):
            doc.table(_best_table(best), "02: the best tree per budget, per pair, paired against the runner-up")
            wide = _wide_intervals(best)
            if wide:
                doc.text(wide)
        ranks = self._read(folder, "grid_ranks.csv")
        if ranks is not None and ranks["share"].notna().any():
            doc.table(
                readings.rank_shares(ranks),
                "02: how often the draft's rank-r token is the target's next (rank 0 squared: about what a second "
                "level under the top token is accepted at)",
            )
        categories = self._read(folder, "grid_categories.csv")
        if categories is not None and len(categories):
            doc.table(
                _category_table(categories),
                "02: the winner and its tau per Spec-Bench category, at each pair's middle budget "
                f"({int(categories['prompts'].max())} prompts each, no interval; *: not the overall winner)",
            )
        doc.text(
            "The grid: tau = 1 + length but on steps without a bonus token (counted below); shapes equal on every "
            "budget share a row; hindsight is in-sample, the oracle a bound. Intervals: 02's appendix "
            f"({self._appendix(self.nb_pairs)})."
        )
        table, said = _compact_grid(grid)
        doc.table(table, "02: acceptance rate / acceptance length per pair and shape, by draft tokens")
        if said:
            doc.text(" ".join(said))
        doc.figure(folder / "grid_tau.png", "02: tau by budget per shape, one panel per pair")

    def _one_pair(self, doc: _Doc) -> None:
        if self._not_run(doc, self.nb_shapes):
            return
        f = self.runs[self.nb_shapes]
        table = self._read(f, "replay.csv")
        if table is None:
            doc.text("01's run wrote no replay.csv.")
        else:
            tokens = self.info.get(self.nb_shapes, {}).get("parameters", {}).get("max_new_tokens")
            doc.text(
                f"{_upper_first(self._pair_name(_pair_of(f)))}: {int(table['prompts'].max())} prompts"
                + (f" x {tokens} new tokens" if tokens else "")
                + f", every shape and budget replayed, up to {int(table['budget'].max())} draft tokens: 01's appendix "
                f"({self._appendix(self.nb_shapes)})."
            )
        doc.figure(f / "tau_vs_budget.png", "01: tau by budget per shape")

    def _pairs(self, doc: _Doc) -> None:
        import pandas as pd

        if self._not_run(doc, self.nb_pairs):
            return
        f = self.runs[self.nb_pairs]
        table = self._read(f, "pairs_methods.csv")
        status = self._read(f, "pairs.csv")
        if status is not None and (status["status"] != "measured").any():  # each pair's models: 02's appendix
            doc.table(status[status["status"] != "measured"], "02: the pairs not measured, and why")
        timed = table.dropna(subset=["speedup"]) if table is not None and "speedup" in table else None
        if timed is not None and len(timed):
            fastest = timed.loc[timed.groupby("pair", sort=False)["speedup"].idxmax()]  # as the findings read it
            rows = pd.concat([_speed_table(t).assign(pair=pair) for pair, t in fastest.groupby("pair", sort=False)])
            rows["method"] = rows["shape"].astype(str) + ":" + rows["budget"].astype(str)
            doc.table(
                rows[["pair", "method", "speed-up", "greedy equal"]],
                f"02: the fastest method per pair run end to end on {int(table['prompts'].max())} prompts, speed-up "
                f"over the target alone [95% interval]; every method: the figure and 02's appendix "
                f"({self._appendix(self.nb_pairs)})",
            )
        doc.figure(f / "speedup.png", "02: tokens/s over the target alone per pair and method")

    def _attention(self, doc: _Doc) -> None:
        from . import readings

        if self._not_run(doc, self.nb_timing):
            return
        f = self.runs[self.nb_timing]
        speed = self._read(f, "speedup.csv")
        if speed is not None and len(speed):
            _speedup_tables(doc, speed, self._appendix(self.nb_timing))
        doc.figure(f / "tree_speedup.png", "03: one tree-masked call against one call per root-to-leaf sequence")
        grid = self._read(f, "attention_grid.csv")
        if grid is not None:
            _grid_tables(doc, grid[grid["impl"] == "sdpa"] if (grid["impl"] == "sdpa").any() else grid)
        curve = self._read(f, "verify_curve.csv")
        if curve is not None and len(curve):
            doc.table(
                readings.verify_cost_table(curve),
                f"03: {_target_model(curve)}'s verify of N draft tokens (N + 1 rows), median ms and in decodes",
            )
        doc.figure(f / "verify_cost.png", "03: a real target's verify cost by tree size, and the cost model")

    def _best_tree(self, doc: _Doc) -> None:
        from ..io.tree_results import DEPLOY_FILE, RESULTS_FILE, read
        from . import readings

        if self._not_run(doc, self.nb_shapes):
            return
        folder = self.runs[self.nb_shapes]
        recommendation = self._read(folder, "recommendation.csv")
        if recommendation is not None and len(recommendation):
            doc.table(
                readings.step_costs(recommendation),
                "01: the fastest tree against the one of highest tau, priced by the cost model (one draft pass a "
                "level, ms on this device)",
            )
        if not (folder / RESULTS_FILE).exists():
            doc.text(f"01's run wrote no {RESULTS_FILE} (a run from before it did).")
            return
        results = read(folder)
        verdict = _verdict_table(folder)
        if verdict is None:
            name = _upper_first(self._pair_name(results.pair))
            doc.text(f"{name}: no tree recommended (nothing had a held-out tau).")
        else:
            doc.table(
                verdict,
                f"01: the tree to deploy for {self._pair_name(results.pair)}, its speed-up over the target alone, "
                "expected (cost model) and measured end to end",
            )
        engines = self._read(folder, "engine_table.csv")
        named = f" ({', '.join(dict.fromkeys(engines['engine']))})" if engines is not None and len(engines) else ""
        doc.text(
            f"Every tree scored, each serving engine's setting{named} against this tree, SGLang's flags and the deploy "
            f"lines ({DEPLOY_FILE}): 01's appendix."
        )

    def _analysis(self, doc: _Doc) -> None:
        """Paragraphs computed from the tables this report shows (`readings.analysis`)."""
        from . import readings

        for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing):
            self._not_run(doc, nb)
        one, pairs, attention = (self.runs[nb] for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing))
        curve = self._read(attention, "verify_curve.csv")
        inputs = (
            self._read(pairs, "grid_best.csv"),
            self._read(pairs, "grid_ranks.csv"),
            self._read(attention, "speedup.csv"),
            curve if curve is not None else self._read(one, "verify_curve.csv"),
            _verdict_table(one) if one is not None else None,
        )
        recommendation = self._read(one, "recommendation.csv")
        costs = readings.step_costs(recommendation) if recommendation is not None and len(recommendation) else None
        _reading(
            doc,
            "The analysis",
            lambda: (
                readings.analysis(*inputs, costs=costs)
                or "*Nothing to analyse: 01, 02 and 03 wrote none of its tables.*"
            ),
        )

    def _reproduce(self, doc: _Doc) -> None:
        import pandas as pd

        profiles = sorted({str(i.get("profile")) for i in self.info.values()}) or ["course"]
        books = " ".join(
            f"--notebook {nb}"
            for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing, registry.report_notebook().stem)
        )
        doc.text("From a clone of specnb (set-up, the embedded models, then the notebooks, then this report):")
        doc.code(
            "\n".join(
                [f"./run_notebooks.sh {p} {books}" for p in profiles]
                + ["./run_notebooks.sh course    # the same notebooks: cpu values, t4 values on a GPU"]
                + ["python -m specnb.notebook.report    # outputs/report.ipynb exported again, after your edits"]
            )
        )
        rows = []
        for nb in (self.nb_shapes, self.nb_pairs, self.nb_timing):
            i = self.info.get(nb)
            if i is None:
                rows.append({"notebook": nb, "run": "did not run"})
                continue
            env, timing = i.get("environment", {}), i.get("timing", {})
            folder = self.runs[nb]
            rows.append(
                {
                    "notebook": nb,
                    "run": folder.name,
                    "profile": i.get("profile"),
                    "started": f"{i.get('started')}"
                    + (", run interactively" if i.get("status") == "interactive" else ""),
                    "commit": (env.get("git_commit") or "")[:12],
                    "decode (ms)": _number(timing.get("decode_ms"), 0),
                    "estimate (s)": _number(timing.get("estimate_s"), 0),
                    "actual (s)": i.get("duration_s"),
                }
            )
        doc.table(pd.DataFrame(rows), "the runs this report reads")
        first = next(iter(self.info.values()), None)
        if first is not None:
            env = first.get("environment", {})
            versions = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v)
            doc.text(f"Python {env.get('python')} on {env.get('platform')}; {versions}.")
        doc.text("Each run's parameters: the top of its appendix, and params.json in its run folder.")

    def _limitations(self, doc: _Doc) -> None:
        """What the runs cannot say, read from their records: the device, the models against the
        brief's, the prompts and tokens each notebook ran, and what replay does not cover."""
        lines = []
        devices = sorted({str(i.get("environment", {}).get("device")) for i in self.info.values()} - {"None"})
        if devices:
            gpu = any(d.startswith("cuda") for d in devices)
            lines.append(
                f"- Device: {', '.join(devices)}. "
                + (
                    "Speeds are this GPU's; a T4 differs."
                    if gpu
                    else "Speed-ups here say nothing about a GPU, where a verify of N tokens costs little more than "
                    "one decode until the GPU saturates; acceptance does not depend on the device."
                )
            )
        models = sorted(
            {str(p.get(k)) for i in self.info.values() for p in _pairs_of(i) for k in ("target", "draft") if p.get(k)}
        )
        if models:
            brief = any(b in m for m in models for b in BRIEF_PAIRS)
            lines.append(
                f"- Models: {', '.join(models)}. "
                + (
                    "These are the brief's Llama models."
                    if brief
                    else "Stand-ins, not the brief's Llama pairs; the t4 profile (the brief's pairs) was not run."
                )
            )
        sizes: dict[str, list[str]] = {}
        for nb, i in self.info.items():
            p = i.get("parameters", {})
            if p.get("max_prompts") and p.get("max_new_tokens"):
                sizes.setdefault(f"{p['max_prompts']} prompts x {p['max_new_tokens']} new tokens", []).append(nb[:2])
        for size, books in sizes.items():
            lines.append(
                f"- {' and '.join(books)}: {size} (intervals over prompts say how far the values could move with other "
                "prompts of the same kind)."
            )
        lines.append(
            "- The grid is greedy (replay is exact for it); sampled acceptance is tested in the suite, not tabled."
        )
        doc.text("\n".join(lines))


BRIEF_PAIRS = ("Llama-2-7b", "Llama-3.2-3B")  # the brief's targets (a 7B and a 3B Llama in 4-bit, on a T4)


def _draw_mask(path: Path) -> None:
    import matplotlib.pyplot as plt

    from ..core.trees import Tree
    from . import plots

    path.parent.mkdir(parents=True, exist_ok=True)
    plt.close(plots.tree_mask(Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), 3, path))


def _first_only(column: Any) -> Any:
    """`column` with each run of equal values written on its first row only (a pair names its rows once)."""
    return column.where(column != column.shift(), "")


def _upper_first(text: str) -> str:
    """`text` with its first letter upper case, the rest as it is (model names keep their case)."""
    return text[:1].upper() + text[1:]


def _pair_labels(grid: Any) -> dict[str, str]:
    """Each pair's name in the report's tables and prose: its kind ('same tokenizer', 'other tokenizer',
    'self-draft') where the pairs' kinds differ, so that long model names are written once, in the
    report's first paragraph; {} (the full names everywhere) where two pairs share a kind."""
    if grid is None or not {"pair", "kind"} <= set(grid):
        return {}
    kinds = grid.drop_duplicates("pair").set_index("pair")["kind"].dropna().astype(str)
    return dict(kinds) if len(kinds) > 1 and kinds.is_unique else {}


def _pair_of(folder: Path) -> str:
    from ..io.tree_results import RESULTS_FILE, read

    if (folder / RESULTS_FILE).exists():
        try:
            return read(folder).pair
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return "(pair not recorded)"


def _best_table(best: Any) -> Any:
    """02's best tree per budget per pair, each number as the analysis writes it."""
    import pandas as pd

    from .readings import percent

    return pd.DataFrame(
        {
            "pair": _first_only(best["pair"]),
            "budget": best["budget"],
            "best shape": [
                r["best_shape"] + (f" (= {r['same_as_winner']})" if r.get("same_as_winner") else "")
                for _, r in best.fillna({"same_as_winner": ""}).iterrows()
            ]
            if "same_as_winner" in best
            else best["best_shape"],
            "tau held out": [with_interval(r, "tau_heldout") for _, r in best.iterrows()],
            "runner-up": best["runner_up"],
            "lead, paired [95%]": [
                f"{r['lead']:+.2f}"
                + (
                    f" [{r['lead_ci_low']:.2f}, {r['lead_ci_high']:.2f}]"
                    if r["lead_ci_low"] == r["lead_ci_low"]
                    else ""
                )
                if r.get("lead") == r.get("lead") and r.get("lead") is not None
                else ""
                for _, r in best.iterrows()
            ],
            "verdict": best["verdict"].fillna("") if "verdict" in best else "",
            "of oracle tau": [
                percent(t / o) if o == o and o else "" for t, o in zip(best["tau_heldout"], best["oracle_tau"])
            ],
        }
    )


def _wide_intervals(best: Any) -> str:
    """The headline's paired intervals wider than `ranking.WIDTH_GOAL`, each with the prompt whose own
    lead lies farthest from the pooled lead (what the width owes most to); '' where none is."""
    from ..analysis.ranking import WIDTH_GOAL

    if "interval_width" not in best:
        return ""
    width = best["interval_width"]  # `ranking.headline`'s, carried by `grid.best_per_budget`
    wide = best[width > WIDTH_GOAL]
    if not len(wide):
        return f"Every paired interval is at most {WIDTH_GOAL} tau wide."
    return (
        f"Paired intervals wider than {WIDTH_GOAL} tau (width, prompts; the prompt farthest from the lead, its own): "
        + "; ".join(
            f"{r['pair']} at {r['budget']}: {w:.2f}, {int(r['prompts_compared'])}; {r['widest_category']} "
            f"#{r['widest_prompt']}, {r['widest_lead']:+.2f}"
            for (_, r), w in zip(wide.iterrows(), width[wide.index])
        )
        + "."
    )


def _compact_grid(grid: Any) -> tuple[Any, list[str]]:
    """02's grid as one table, (pair, shape) x budget, each cell 'rate / length' (the
    oracle: its length only, its rate being 1 by definition); a shape whose cells equal an earlier
    shape's on every budget shares that row ('chain (= hindsight)'), a shape without values is left
    out. Returns the table and the sentences that say what was left out (per pair, the reason once)
    and the steps each pair's table counts."""
    import pandas as pd

    cells = grid.copy()
    cells["_cell"] = [
        (f"{_number(r['acceptance_rate'])} / " if r["shape"] != "oracle" else "") + _number(r["acceptance_length"])
        if _number(r.get("acceptance_length"))
        else ""
        for _, r in grid.iterrows()
    ]
    parts, said, counts = [], [], []
    for pair, t in cells.groupby("pair", sort=False):
        wide = pivot(t.assign(_shown=t["_cell"]), "_shown")
        budgets = [c for c in wide.columns if c != "shape"]
        rows: dict[tuple, list[str]] = {}
        for _, r in wide.iterrows():
            key = tuple(r[budgets])
            if not any(key):
                continue
            rows.setdefault(key, []).append(str(r["shape"]))
        kind = f" ({t['kind'].iloc[0]})" if "kind" in t and t["kind"].iloc[0] != pair else ""
        parts.append(
            pd.DataFrame(
                [
                    {"pair": pair + kind, "shape": names[0] + (f" (= {', '.join(names[1:])})" if names[1:] else "")}
                    | dict(zip(budgets, key))
                    for key, names in rows.items()
                ]
            )
        )
        missing = t[t["tau"].isna() & t["note"].notna()].drop_duplicates("shape")
        if len(missing):
            reasons = missing["note"].astype(str).str.split(":").str[0].unique()
            said.append(f"{pair}: {', '.join(missing['shape'])} {'; '.join(reasons)} (02's appendix says why).")
        if {"steps", "no_bonus_steps", "cut_steps"} <= set(t):
            counts.append(f"{pair} " + "/".join(str(int(t[c].sum())) for c in ("steps", "no_bonus_steps", "cut_steps")))
    if counts:
        said.append(f"Steps / without a bonus token / drafted short by the end: {'; '.join(counts)}.")
    table = pd.concat(parts, ignore_index=True).fillna("")
    budgets = sorted((c for c in table.columns if c not in ("pair", "shape")), key=float)
    table["pair"] = _first_only(table["pair"])
    return table[["pair", "shape", *budgets]], said


def _category_table(categories: Any) -> Any:
    """Per pair, at its middle budget: each category's winning shape and tau ('*' where it is not the
    overall winner), the categories as rows, the pairs as columns."""
    import pandas as pd

    columns = {}
    for pair, t in categories.groupby("pair", sort=False):
        budgets = sorted(t["budget"].unique())
        mid = budgets[len(budgets) // 2]
        at = t[t["budget"] == mid].set_index("category")
        columns[f"{pair}, {mid} tokens"] = {
            c: f"{r.winner} {r.winner_tau:.2f}" + ("" if r.same_winner else "*") for c, r in at.iterrows()
        }
    return pd.DataFrame(columns).fillna("").rename_axis("category").reset_index()


def _verdict_table(folder: Path) -> Any:
    """01's recommendation as one row (tree, held-out tau, expected and measured speed-up, the steady
    state predicted while it was measured against the measurement, verdict), or None where 01
    recommended nothing."""
    import pandas as pd

    from ..io.tree_results import RESULTS_FILE, read

    results = read(folder) if (folder / RESULTS_FILE).exists() else None
    rec = results.recommendation if results is not None else None
    if rec is None:
        return None
    interval = lambda v, lo, hi: f"{v:.2f}x" + (f" [{lo:.2f}, {hi:.2f}]" if lo == lo and hi == hi else "")  # noqa: E731
    check = rec.check  # `sweeps.prediction_check`: re-priced while the measurement ran, steps after each prompt's first
    return pd.DataFrame(
        [
            {
                "tree": f"{rec.tree.name} with {rec.tree.budget} draft tokens",
                "fitted": "fitted" if rec.tree.fitted else "preset",
                "tau held out": f"{rec.tree.tau_heldout:.2f} [{rec.tau_low:.2f}, {rec.tau_high:.2f}]",
                "expected speed-up": interval(rec.speedup, rec.speedup_low, rec.speedup_high),
                "measured speed-up": "" if rec.measured_speedup is None else f"{rec.measured_speedup:.2f}x",
                "measured on": "" if rec.measured_speedup is None else rec.measured_prompts,
                "steady state predicted": interval(check["predicted"], check["low"], check["high"]) if check else "",
                "steady state measured": f"{check['measured']:.2f}x ({check['check']})" if check else "",
                "verdict": rec.verdict,
            }
        ]
    )


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
        f"Median ms of one attention call [25th, 75th percentile] on {device or 'the device'}, {dtype or 'its dtype'}; "
        "rows: batch size and longest prefix (sequence length), columns: draft tokens."
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


def _speedup_tables(doc: _Doc, speed: Any, appendix: str) -> None:
    """The brief's question about tree attention: how much one tree-masked call saves over one call
    per root-to-leaf sequence (per_sequence_over_tree) by (batch, prefix) x draft tokens, and its
    median by each axis; `appendix` links 03's appendix (every other table of 03)."""
    from . import readings

    doc.text(
        "One tree-masked call (SDPA) against one call per root-to-leaf sequence: per-sequence time / tree time, above "
        "1 the tree call is faster. The trees timed, the mask's cost over causal attention and every "
        f"implementation's times: 03's appendix ({appendix})."
    )
    index = ["shape", "batch", "prefix"] if speed["shape"].nunique() > 1 else ["batch", "prefix"]
    for column, caption in (
        ("per_sequence_over_tree", "03: speed-up of one tree call over one call per sequence (x), by draft tokens"),
    ):
        if column in speed:
            cells = speed.assign(_cell=speed[column].map(_number))
            table = cells.pivot_table(index=index, columns="nodes", values="_cell", aggfunc="first").fillna("")
            table.columns = [str(c) for c in table.columns]
            doc.table(table.reset_index(), caption)
    if speed["per_sequence_over_tree"].notna().any():
        doc.table(readings.trend_table(speed), "03: the speed-up's median over the other axes")


def _ms_cell(row: Any) -> str:
    value, low, high = (_number(row.get(k), 3) for k in ("median_ms", "q25_ms", "q75_ms"))
    return f"{value} [{low}, {high}]" if low and high else value


def _pairs_of(info: dict) -> list[dict]:
    """The pairs a run's parameters name: 02's list, or 01's and 03's one pair."""
    p = info.get("parameters", {})
    return list(p.get("pairs") or []) + (
        [{"target": p.get("target"), "draft": p.get("draft")}] if p.get("target") else []
    )


def publish(executed: Path, outputs: Path) -> dict[str, Path]:
    """outputs/report.ipynb from 07's executed notebook, then exported (`export_report`): each draft
    cell's output becomes a markdown cell the student rewrites, the parameter and set-up cells are
    left out, the rest kept (code hidden in the export). A report.ipynb the student edited since it
    was published is kept, renamed report.edited-<time>.ipynb, never overwritten."""
    nb = nbformat.read(executed, as_version=4)
    cells = []
    for cell in nb.cells:
        tags = set(cell.metadata.get("tags", []))
        if tags & set(SKIP_TAGS):
            continue
        if cell.cell_type == "code" and DRAFT_TAG in tags:
            text = "\n\n".join(o["data"]["text/markdown"] for o in cell.outputs if "text/markdown" in o.get("data", {}))
            cells.append(nbformat.v4.new_markdown_cell(DRAFT_MARK + text, metadata={"tags": [DRAFT_TAG]}))
            continue
        if cell.cell_type == "code":
            cell.outputs = [
                o for o in cell.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
            ]
        cells.append(cell)
    nb.cells = cells
    nb.metadata.setdefault("specnb", {})["published"] = _digest(nb)
    outputs = Path(outputs)
    path = outputs / REPORT_IPYNB
    if path.exists() and _edited(path):
        kept = path.with_name(time.strftime("report.edited-%Y%m%d-%H%M%S.ipynb", time.localtime(path.stat().st_mtime)))
        path.rename(kept)
        print(f"== your edited report kept as {kept} (copy your text into the new {path.name})", flush=True)
    nbformat.write(nb, path)
    return export_report(path)


def _digest(nb: nbformat.NotebookNode) -> str:
    """A hash of the markdown cells' text: what `publish` wrote, to tell a student's edit."""
    import hashlib

    text = "\x00".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _edited(path: Path) -> bool:
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return False
    return nb.metadata.get("specnb", {}).get("published") != _digest(nb)


def export_report(path: Path) -> dict[str, Path]:
    """report.ipynb exported by nbconvert, without code: report.html (self-contained, the figures
    inlined), report.md with its figures in report_files/, references.bib, and report.pdf printed
    from report.md (`pdf.markdown_pdf`). Returns the files written, by suffix."""
    from nbconvert import HTMLExporter, MarkdownExporter

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    hidden = dict(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    page, _ = HTMLExporter(**hidden).from_notebook_node(nb, resources={"metadata": {"name": "specnb report"}})
    html_file = path.with_suffix(".html")
    page = re.sub(r"<script[^>]*\ssrc=\"https?:[^\"]*\"[^>]*>\s*</script>", "", page)  # require.js, MathJax: unused
    html_file.write_text(page.replace("</head>", f"<style>{PRINT_CSS}</style></head>", 1))
    text, resources = MarkdownExporter(**hidden).from_notebook_node(
        nb, resources={"output_files_dir": REPORT_FILES, "unique_key": path.stem}
    )
    figures = path.parent / REPORT_FILES
    if figures.exists():
        shutil.rmtree(figures)
    for name, data in resources.get("outputs", {}).items():
        (path.parent / name).parent.mkdir(parents=True, exist_ok=True)
        (path.parent / name).write_bytes(data)
    md_file = path.with_suffix(".md")
    md_file.write_text(text)
    (path.parent / BIBTEX).write_text(references.bibtex())
    pdf = markdown_pdf(md_file)  # reportlab, from PyPI: wherever the report is made, Colab included
    return {".ipynb": path, ".html": html_file, ".md": md_file, ".pdf": pdf}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.report",
        description="Export outputs/report.ipynb (07's report, after your edits) to report.html, report.md and "
        "report.pdf; rewrite outputs/index.md and index.html.",
    )
    ap.add_argument("report", type=Path, nargs="?", default=None, help="default: OUTPUTS/report.ipynb")
    ap.add_argument("--outputs", type=Path, default=None, help="default: $SPECNB_OUTPUTS, else outputs/")
    ap.add_argument(
        "--example",
        type=Path,
        default=None,
        help="also copy the report (markdown, its figures, references.bib) into this folder, e.g. docs/example",
    )
    args = ap.parse_args(argv)
    outputs = args.outputs or default_outputs()
    report = (args.report or outputs.expanduser() / REPORT_IPYNB).expanduser()
    if not report.exists():
        print(
            f"no {report}: run the report first, ./run_notebooks.sh course (01-03, then 07), or after runs of 01-03: "
            f"./run_notebooks.sh course --notebook {registry.report_notebook().stem}",
            file=sys.stderr,
        )
        return 2
    write_index(report.parent)
    written = export_report(report)
    print("\n".join(str(p) for p in written.values()))
    if args.example is not None:
        print(copy_example(report.parent, args.example))
    return 0


def copy_example(outputs: Path, folder: Path) -> Path:
    """The report's markdown, its figures and references.bib copied into `folder` (emptied first): a
    report one can read in the repository."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shutil.copytree(outputs / REPORT_FILES, folder / REPORT_FILES)
    for name in (REPORT_MD, BIBTEX):  # not the PDF: the same figures again, megabytes
        if (outputs / name).exists():
            shutil.copyfile(outputs / name, folder / name)
    return folder / REPORT_MD


if __name__ == "__main__":
    sys.exit(main())
