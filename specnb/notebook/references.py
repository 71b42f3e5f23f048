"""The papers specnb's method and readings follow, listed in the report
(`markdown`) and written beside it as BibTeX (`bibtex`). Each entry's venue and identifier were read
from the paper's arXiv or proceedings page."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    key: str  # the BibTeX key and the label cited in the text
    kind: str  # BibTeX entry type
    authors: tuple[str, ...]  # "Last, First" each
    title: str
    venue: str  # booktitle or journal
    year: int
    url: str
    used_for: str  # what specnb takes from it (the reference list says so)

    more: bool = False  # the list names the first authors only ("and others")
    tag: str = ""  # after the year where two cited papers share first author and year (2024a, 2024b)

    def label(self) -> str:
        """'Miao et al. 2024', 'Leviathan et al. 2023': how the text cites it."""
        last = [a.split(",")[0] for a in self.authors]
        year = f"{self.year}{self.tag}"
        if len(last) == 1 and not self.more:
            return f"{last[0]} {year}"
        if len(last) == 2 and not self.more:
            return f"{last[0]} and {last[1]} {year}"
        return f"{last[0]} et al. {year}"


REFERENCES: dict[str, Reference] = {
    r.key: r
    for r in (
        Reference(
            "miao2024specinfer",
            "inproceedings",
            (
                "Miao, Xupeng",
                "Oliaro, Gabriele",
                "Zhang, Zhihao",
                "Cheng, Xinhao",
                "Wang, Zeyu",
                "Zhang, Zhengxin",
                "Wong, Rae Ying Yee",
                "Zhu, Alan",
                "Yang, Lijie",
                "Shi, Xiaoxiang",
                "Shi, Chunan",
                "Chen, Zhuoming",
                "Arfeen, Daiyaan",
                "Abhyankar, Reyna",
                "Jia, Zhihao",
            ),
            "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and "
            "Verification",
            "Proceedings of the 29th ACM International Conference on Architectural Support for Programming "
            "Languages and Operating Systems (ASPLOS '24), Volume 3",
            2024,
            "https://doi.org/10.1145/3620666.3651335",
            "token trees verified in one forward pass with a tree attention mask (the brief's reference); merged trees",
        ),
        Reference(
            "leviathan2023fast",
            "inproceedings",
            ("Leviathan, Yaniv", "Kalman, Matan", "Matias, Yossi"),
            "Fast Inference from Transformers via Speculative Decoding",
            "Proceedings of the 40th International Conference on Machine Learning (ICML)",
            2023,
            "https://arxiv.org/abs/2211.17192",
            "speculative decoding and its lossless acceptance rule for sampling",
        ),
        Reference(
            "chen2023accelerating",
            "article",
            (
                "Chen, Charlie",
                "Borgeaud, Sebastian",
                "Irving, Geoffrey",
                "Lespiau, Jean-Baptiste",
                "Sifre, Laurent",
                "Jumper, John",
            ),
            "Accelerating Large Language Model Decoding with Speculative Sampling",
            "arXiv preprint arXiv:2302.01318",
            2023,
            "https://arxiv.org/abs/2302.01318",
            "speculative sampling (the same lossless rule, derived independently)",
        ),
        Reference(
            "cai2024medusa",
            "inproceedings",
            (
                "Cai, Tianle",
                "Li, Yuhong",
                "Geng, Zhengyang",
                "Peng, Hongwu",
                "Lee, Jason D.",
                "Chen, Deming",
                "Dao, Tri",
            ),
            "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads",
            "Proceedings of the 41st International Conference on Machine Learning (ICML)",
            2024,
            "https://arxiv.org/abs/2401.10774",
            "trees as lists of rank paths; the Medusa-style tree search from per-depth acceptance; typical acceptance",
        ),
        Reference(
            "li2024eagle",
            "inproceedings",
            ("Li, Yuhui", "Wei, Fangyun", "Zhang, Chao", "Zhang, Hongyang"),
            "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
            "Proceedings of the 41st International Conference on Machine Learning (ICML)",
            2024,
            "https://arxiv.org/abs/2401.15077",
            "the EAGLE-1 draft head on the target's features",
            tag="a",
        ),
        Reference(
            "li2024eagle2",
            "inproceedings",
            ("Li, Yuhui", "Wei, Fangyun", "Zhang, Chao", "Zhang, Hongyang"),
            "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
            "Proceedings of the 2024 Conference on Empirical Methods in Natural Language Processing (EMNLP)",
            2024,
            "https://arxiv.org/abs/2406.16858",
            "dynamic trees: the nodes of highest cumulative draft probability, rebuilt every step",
            tag="b",
        ),
        Reference(
            "chen2024sequoia",
            "article",
            (
                "Chen, Zhuoming",
                "May, Avner",
                "Svirschevski, Ruslan",
                "Huang, Yuhsun",
                "Ryabinin, Max",
                "Jia, Zhihao",
                "Chen, Beidi",
            ),
            "Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding",
            "arXiv preprint arXiv:2402.12374",
            2024,
            "https://arxiv.org/abs/2402.12374",
            "the dynamic programme that designs a tree from the measured acceptance per sibling rank",
        ),
        Reference(
            "xia2024unlocking",
            "inproceedings",
            ("Xia, Heming", "Yang, Zhe", "Dong, Qingxiu", "Wang, Peiyi", "Li, Yongqi", "Ge, Tao", "Liu, Tianyu"),
            "Unlocking Efficiency in Large Language Model Inference: A Comprehensive Survey of Speculative Decoding",
            "Findings of the Association for Computational Linguistics: ACL 2024",
            2024,
            "https://arxiv.org/abs/2401.07851",
            "Spec-Bench: the prompts (13 categories) and the mean-accepted-tokens convention",
            more=True,
        ),
        Reference(
            "timor2025heterogeneous",
            "inproceedings",
            (
                "Timor, Nadav",
                "Mamou, Jonathan",
                "Korat, Daniel",
                "Berchansky, Moshe",
                "Jain, Gaurav",
                "Pereg, Oren",
                "Wasserblat, Moshe",
                "Harel, David",
            ),
            "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies",
            "Proceedings of the 42nd International Conference on Machine Learning (ICML), PMLR 267",
            2025,
            "https://arxiv.org/abs/2502.05202",
            "drafting across tokenizers (transformers' universal assisted generation, hf_uag)",
        ),
        Reference(
            "xiao2024streaming",
            "inproceedings",
            ("Xiao, Guangxuan", "Tian, Yuandong", "Chen, Beidi", "Han, Song", "Lewis, Mike"),
            "Efficient Streaming Language Models with Attention Sinks",
            "The Twelfth International Conference on Learning Representations (ICLR)",
            2024,
            "https://arxiv.org/abs/2309.17453",
            "a bounded KV cache of attention sinks and a recent window (notebook 04)",
        ),
    )
}


def markdown(keys: list[str] | None = None) -> str:
    """The reference list as markdown bullets, each with what specnb takes from the paper."""
    chosen = [REFERENCES[k] for k in keys] if keys else list(REFERENCES.values())
    return "\n".join(
        f"- [{r.label()}] {_names(r.authors, r.more).removesuffix('.')}. {r.title}. *{r.venue}*, {r.year}. {r.url} "
        f"(used for: {r.used_for})"
        for r in chosen
    )


def bibtex() -> str:
    """Every reference as BibTeX, for the student's own report."""
    out = []
    for r in REFERENCES.values():
        place = "journal" if r.kind == "article" else "booktitle"
        out.append(
            f"@{r.kind}{{{r.key},\n  author = {{{' and '.join(r.authors + (('others',) if r.more else ()))}}},\n"
            f"  title = {{{r.title}}},\n"
            f"  {place} = {{{r.venue}}},\n  year = {{{r.year}}},\n  url = {{{r.url}}}\n}}"
        )
    return "\n\n".join(out) + "\n"


def _names(authors: tuple[str, ...], more: bool = False) -> str:
    names = [" ".join(reversed(a.split(", "))) for a in authors]
    return ", ".join(names[:3]) + (" et al." if len(names) > 3 or more else "")
