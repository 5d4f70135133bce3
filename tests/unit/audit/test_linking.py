"""The linker's pause of Python's cyclic garbage collector (application/audit/linking.py)."""

import gc

import pytest

from taskgate.application.audit.linking import collector_paused


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_during_a_batch_and_on_after_it(collector_state):
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_on_when_a_batch_fails(collector_state):
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the batch failed")
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(collector_state):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
