"""run_at_low_priority (app.base.threads): a model's load and warm-up beside models already
serving run on a thread of their own at nice 19, and the calling thread (the engine's, which
serves afterwards) keeps its own priority."""

from __future__ import annotations

import os
import threading

import pytest

from app.base.threads import LOWEST_NICE, run_at_low_priority


def test_it_runs_on_another_thread_at_the_lowest_priority_and_the_caller_keeps_its_own():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen = run_at_low_priority(lambda: (threading.get_native_id(),
                                        os.getpriority(os.PRIO_PROCESS, 0)))
    assert seen[0] != threading.get_native_id()
    assert seen[1] == LOWEST_NICE
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_its_error_is_raised_on_the_caller():
    def fail() -> None:
        raise ValueError("the load failed")

    with pytest.raises(ValueError, match="the load failed"):
        run_at_low_priority(fail)
