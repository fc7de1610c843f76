"""The suite's own scheduling (tests/conftest.py): under `--dist loadgroup` the tests of a module
that share one of its module-scoped fixtures carry that module's xdist group, and pytest-xdist
schedules by it (the group is a suffix of the node id it sends to a worker). With pytest 9.2
and pytest-xdist 3.8 the marks stayed but the suffix did not (pytest keeps node ids elsewhere
since), so every worker built each shared fixture again: pyproject.toml bounds pytest below it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shared_by_the_module():
    return object()


def test_a_test_sharing_a_module_fixture_is_scheduled_in_its_module_group(request, shared_by_the_module):
    assert [m.args for m in request.node.iter_markers("xdist_group")] == [("test_grouping",)]
    if request.config.getoption("dist", "no") == "loadgroup" and hasattr(request.config, "workerinput"):
        assert request.node.nodeid.endswith("@test_grouping"), request.node.nodeid
