"""A pytest plugin (tests/conftest.py loads it): every test leaves the process in the folder it found
it in. A test worker left standing in a test's temporary folder fails later, far from the cause, once
that folder is removed: os.getcwd() raises (papermill calls it), and every subprocess it starts dies
(importing torch from a removed folder: "Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so").
The test that moved the process fails, named, and the process is put back, so the tests after it
run where they should."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def the_working_folder_is_kept():
    try:
        before = os.getcwd()
    except FileNotFoundError:
        os.chdir(ROOT)
        pytest.fail(f"this process stood in a removed folder before the test (moved to {ROOT})")
    yield
    try:
        after = os.getcwd()
    except FileNotFoundError:
        after = "a removed folder"
    if after != before:
        os.chdir(before if os.path.isdir(before) else ROOT)
        pytest.fail(f"the test left the process in {after}, not in {before} (moved back)")
