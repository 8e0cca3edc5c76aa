"""The suite's two workers (pyproject.toml's addopts, docs/testing.md): the tests of a group go to one worker, so the
run they share is made once."""

import os

import pytest


def test_the_tests_of_a_group_run_on_one_worker(request):
    """tests/conftest.py puts this file's test in the group "test_workers"; pytest-xdist's ``--dist loadgroup`` sends a
    group to one worker by the "@group" its test ids end with. Without it, every worker makes each shared run again."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.config.getoption("loadgroup", default=False)):
        pytest.skip("a test of pytest-xdist's workers under --dist loadgroup, the default run")
    assert request.node.nodeid.endswith("@test_workers"), (
        f"{request.node.nodeid}: pytest-xdist's --dist loadgroup groups nothing under this pytest (pytest 9.2 with "
        "pytest-xdist 3.8, pytest-xdist#1386); install the pytest of the dev extra: pip install -e '.[dev]'"
    )
