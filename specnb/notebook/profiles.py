"""Profiles and parameter files, resolved to each notebook's parameters (the runner runs them).

    notebooks, declared_parameters   the numbered notebooks and the parameters each declares
    profile_chain, load_profile, runner_settings
                           a profile (notebooks/profiles/<name>.yaml), the ones it `extends`, its
                           parameter sections and its `runner:` settings (`RunnerSettings`)
    resolve                each notebook's parameters: its defaults <- the profile <- -f files <- -p
                           values, every name checked against what the notebooks declare
    hub_models, published_heads, strings_in   the hub models and published heads parameters name
    parse_value            a -p value as YAML reads it

`notebook.runner` documents the profile format; `notebook.estimate` reads profiles through this
module too.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..experiments.checks import ParameterError
from ..io.prompts import SOURCES
from . import parameters
from .places import NOTEBOOKS, PROFILES

RESERVED = ("run_dir",)  # set by the runner, never by a profile
PROFILE_KEYS = ("extends", "runner")  # keys of a profile that are not parameter sections
RUNNER_KEYS = ("env", "standins", "notebooks")
SECTION = re.compile(r"^\d\d_\w+$")  # a notebook's section in a parameter file: 01_tree_shapes
AUTO = "auto"  # `extends: auto`: t4 where CUDA is present, else cpu
DEVICES = ("cpu", "cuda")  # `extends: {cpu: NAME, cuda: NAME}`: the parent by where it runs


class RunnerError(Exception):
    """A problem with the request (profile, parameter, notebook): nothing was run."""


def notebooks(folder: Path = NOTEBOOKS, only: list[str] | None = None) -> list[Path]:
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        names = {p.stem: p for p in found}
        missing = [n for n in only if n not in names]
        if missing:
            raise RunnerError(f"no notebook named {missing}; have {sorted(names)}")
        found = [names[n] for n in only]
    return found


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's parameters cell (the first code cell tagged 'parameters'): name -> default
    value, each a literal (`name: type = value  # help`, as papermill reads it: `parameters.declared`)."""
    try:
        return {name: d.default for name, d in parameters.declared(notebook).items()}
    except ParameterError as e:
        raise RunnerError(str(e)) from None


@dataclass(frozen=True)
class RunnerSettings:
    """A profile's `runner:` section: what the runner does before any notebook runs."""

    env: tuple[tuple[str, str], ...] = ()  # (name, value) set for the run, values as written
    standins: bool = False  # install stand-ins of the hub models the notebooks name into $HF_HOME
    notebooks: tuple[str, ...] = ()  # the notebooks the profile runs; empty: all

    def environment(self) -> dict[str, str]:
        """The variables with "{cache}", "~" and $VARS expanded."""
        from ..io.embedded import cache_dir

        return {k: os.path.expanduser(os.path.expandvars(v.replace("{cache}", str(cache_dir())))) for k, v in self.env}


def auto_profile() -> str:
    """What `auto` means: the t4 profile where CUDA is present, else cpu."""
    return parent_profile({"cpu": "cpu", "cuda": "t4"})


def parent_profile(extends: str | dict | None) -> str | None:
    """The profile `extends` names here: a name, `auto`, or {cpu: NAME, cuda: NAME} by whether CUDA is
    present (a profile whose values differ by device: course takes course-cpu on a CPU, t4 on a GPU)."""
    if isinstance(extends, dict):
        import torch

        return extends["cuda" if torch.cuda.is_available() else "cpu"]
    return auto_profile() if extends == AUTO else extends


def profile_chain(name: str, folder: Path = PROFILES) -> list[str]:
    """The profile and the ones it extends, in order (`auto` and devices resolved)."""
    chain = [name]
    while len(chain) < 20:
        path = folder / f"{chain[-1]}.yaml"
        parent = parent_profile(_read_yaml(path, profile=True).get("extends") if path.exists() else None)
        if parent is None:
            break
        chain.append(parent)
    return chain


def device_profile(name: str, folder: Path = PROFILES) -> str:
    """The profile a run of `name` takes its values from on this device: where `name` extends one
    profile per device ({cpu: NAME, cuda: NAME}: the course), that one (followed on), else `name`. A
    run's times are recorded under it (`estimate.record`), so that a GPU never reads a CPU's."""
    path = folder / f"{name}.yaml"
    extends = _read_yaml(path, profile=True).get("extends") if path.exists() else None
    return device_profile(parent_profile(extends), folder) if isinstance(extends, dict) else name


def load_profile(name: str, folder: Path = PROFILES) -> dict[str, dict]:
    """The profile's parameter sections, with `extends:` applied (the parent's first)."""
    return _load_chain(name, folder)[0]


def runner_settings(name: str, folder: Path = PROFILES) -> RunnerSettings:
    """The profile's `runner:` section, merged over the profiles it extends."""
    return _load_chain(name, folder)[1]


def _load_chain(name: str, folder: Path, seen: tuple[str, ...] = ()) -> tuple[dict[str, dict], RunnerSettings]:
    if name in seen:
        raise RunnerError(f"profile {seen[0]!r}: extends goes round in a circle ({' -> '.join(seen + (name,))})")
    path = folder / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise RunnerError(f"unknown profile {name!r}; profiles: {known} (in {folder})")
    data = _read_yaml(path, profile=True)
    sections, settings = {}, RunnerSettings()
    parent = parent_profile(data.pop("extends", None))
    if parent is not None:
        sections, settings = _load_chain(parent, folder, seen + (name,))
        sections = {k: dict(v or {}) for k, v in sections.items()}
    runner = data.pop("runner", None) or {}
    unknown = sorted(set(runner) - set(RUNNER_KEYS))
    if (
        unknown
        or not isinstance(runner.get("env", {}) or {}, dict)
        or not isinstance(runner.get("standins", False), bool)
        or not isinstance(runner.get("notebooks", []), list)
    ):
        raise RunnerError(
            f"{path}: runner: takes env (a mapping of names to strings), standins (true or "
            f"false) and notebooks (a list of notebook names){f'; unknown {unknown}' if unknown else ''}"
        )
    env = dict(settings.env) | {str(k): str(v) for k, v in (runner.get("env") or {}).items()}
    books = tuple(str(b) for b in runner["notebooks"]) if "notebooks" in runner else settings.notebooks
    settings = RunnerSettings(tuple(sorted(env.items())), runner.get("standins", settings.standins), books)
    for section, values in data.items():
        sections[section] = {**(sections.get(section) or {}), **(values or {})}
    return sections, settings


def resolve(
    profile: str, overrides: dict[str, Any], extra_files: list[Path], books: list[Path], profiles: Path = PROFILES
) -> dict[str, dict[str, Any]]:
    """Parameters per notebook: defaults <- profile <- -f files <- -p overrides, all checked."""
    layers = [load_profile(profile, profiles)] + [_read_yaml(f) for f in extra_files]
    declared = {nb.stem: declared_parameters(nb) for nb in books}
    # a parameter of the notebooks not selected this time is no typo: checked against every notebook
    known = {nb.stem: declared_parameters(nb) for nb in notebooks(books[0].parent)} | declared if books else declared
    resolved = {stem: dict(params) for stem, params in declared.items()}
    for source, layer in zip([f"profile {profile}"] + [str(f) for f in extra_files], layers):
        for section, values in layer.items():
            values = values or {}
            if section == "all":
                targets = list(declared)
                _check_known(values, known, source)
            elif section in declared:
                targets = [section]
                unknown = sorted(set(values) - set(declared[section]))
                if unknown:
                    raise RunnerError(
                        f"{source}: {unknown} not parameters of {section}; it declares {sorted(declared[section])}"
                    )
            elif any(section == p.stem for p in notebooks(books[0].parent) if books):
                continue  # a section for a notebook not selected this time
            else:
                raise RunnerError(f"{source}: section {section!r} is neither 'all' nor a notebook ({sorted(declared)})")
            for stem in targets:
                resolved[stem].update({k: v for k, v in values.items() if k in declared[stem]})
    _check_known(overrides, known, "-p", declared)
    for stem in resolved:
        resolved[stem].update({k: v for k, v in overrides.items() if k in declared[stem]})
        if "profile" in declared[stem]:
            resolved[stem]["profile"] = profile
        prompts = resolved[stem].get("prompts")
        if (
            isinstance(prompts, str)
            and prompts not in SOURCES
            and prompts.strip()
            and Path(prompts).expanduser().exists()
        ):
            # a file named from where the command was typed: the kernel runs in the notebooks' folder
            resolved[stem]["prompts"] = str(Path(prompts).expanduser().absolute())
    return resolved


def hub_models(resolved: dict[str, dict[str, Any]]) -> list[str]:
    """Hub ids with a committed config (`io.model_configs`) that resolved parameters name."""
    from ..io.model_configs import known_models

    known = set(known_models())
    return sorted({s for s in strings_in(resolved) if s in known})


def published_heads(resolved: dict[str, dict[str, Any]]) -> list[str]:
    """The published head checkpoints (`io.published.published_checkpoints`: Medusa's, EAGLE's)
    that resolved parameters name."""
    from ..io.published import published_checkpoints

    named = set(strings_in(resolved))
    return [repo for repo in published_checkpoints() if repo in named]


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside nested dicts, lists and tuples."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)


def _check_known(values: dict, declared: dict[str, dict], source: str, selected: dict[str, dict] | None = None) -> None:
    """Refuse a name no notebook declares (with the nearest names: a typo), one the runner sets, and,
    given `selected` (the notebooks of this run; for -p), one that only notebooks not selected declare."""
    everywhere = set().union(*declared.values()) if declared else set()
    reserved = sorted(set(values) & set(RESERVED))
    if reserved:
        raise RunnerError(
            f"{source}: {reserved} is set by the runner, not by parameters: choose where runs are written with "
            "--outputs DIR or the environment variable SPECNB_OUTPUTS (each run gets its own folder inside)"
        )
    problems = []
    for name in sorted(set(values) - everywhere):
        near = difflib.get_close_matches(name, sorted(everywhere), n=3, cutoff=0.6)
        problems.append(
            f"{name!r} is no notebook's parameter; "
            + (
                f"did you mean {' or '.join(repr(n) for n in near)}?"
                if near
                else "each notebook's are listed in docs/notebooks.md"
            )
        )
    if selected is not None:
        here = set().union(*selected.values()) if selected else set()
        for name in sorted((set(values) & everywhere) - here):
            owners = sorted(stem for stem, names in declared.items() if name in names)
            problems.append(
                f"{name!r} is a parameter of {', '.join(owners)} only, which this run does not select "
                f"({', '.join(sorted(selected))}): add --notebook {owners[0]}, or leave it out"
            )
    if problems:
        raise RunnerError(f"{source}: " + "; ".join(problems))


def _read_yaml(path: Path, profile: bool = False) -> dict[str, Any]:
    """A parameter file's sections; a profile may also hold `extends: NAME` and `runner:`. A parameter
    file with no section at all (papermill's `-f` file: `custom_trees: {...}` at the top) is `all:`."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RunnerError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise RunnerError(f"{path}: expected sections ('all:' or a notebook name) holding name: value pairs")
    if not profile and data and not any(k == "all" or k in PROFILE_KEYS or SECTION.match(str(k)) for k in data):
        data = {"all": data}  # papermill's own -f file: parameters at the top, for every notebook
    extra = [k for k in PROFILE_KEYS if k in data]
    if extra and not profile:
        raise RunnerError(f"{path}: {extra} belong in a profile (notebooks/profiles/*.yaml), not a parameter file")
    extends = data.get("extends")
    by_device = (
        isinstance(extends, dict) and set(extends) == set(DEVICES) and all(isinstance(v, str) for v in extends.values())
    )
    if "extends" in data and not (isinstance(extends, str) or by_device):
        raise RunnerError(
            f"{path}: extends names one profile (or auto), or one per device as {{cpu: NAME, cuda: NAME}}; "
            f"got {extends!r}"
        )
    if not all(isinstance(v, (dict, type(None))) for k, v in data.items() if k != "extends"):
        raise RunnerError(f"{path}: expected sections ('all:' or a notebook name) holding name: value pairs")
    return data


def parse_value(text: str) -> Any:
    """A -p value as YAML reads it, except a number in exponent form without a dot ("1e-3"), which
    YAML 1.1 leaves a string: it is the number."""
    value = yaml.safe_load(text)
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return float(value)
    return value
