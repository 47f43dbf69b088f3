"""One limited case in the CI budget (issue 42): the generated cases CI runs (seed 38,
two per store) seldom make calls wait for a slot, so this hand-made one does: a parallel
group of three slow calls through ``[resources.r1] concurrency = 1`` (salt 2 chooses the
limit, the steps and no pools; :mod:`tests.conformance.resources_ops`), the worker
driving it killed mid-call and another stopped, on SQLite (the long mode runs both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import pools_ops, resources_ops
from tests.conformance.runner import simulate


def _member(sid: str) -> dict[str, Any]:
    return {"id": sid, "kind": "act", "undo": "explicit", "retries": 0, "fail_times": 0,
            "whole": False, "on_error": None, "when": None, "slow": 0.8, "confirm": None,
            "group": "g"}


CASE = {"steps": [_member("s0"), _member("s1"), _member("s2")], "timeout": None,
        "rollback": True, "retry_failed": False, "ops": [[1.5, "kill"], [3.0, "zombie"]],
        "answer_delay": 0, "form": "list", "workers": 1, "salt": 2}


def test_a_group_takes_turns_on_one_slot_under_a_kill_and_a_zombie(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resources_ops.limited(CASE) == 1
    assert resources_ops.steps(CASE) == {"s0", "s1", "s2"}
    assert not pools_ops.pooled(CASE)  # one worker of one kind: quicker
    stats = tmp_path / "stats.jsonl"
    monkeypatch.setenv("SIM_STATS", str(stats))
    simulate(CASE, "sqlite")  # fails with every violation of every invariant
    [line] = (tmp_path / "stats.jsonl.resources").read_text().splitlines()
    seen = json.loads(line)
    assert seen["calls"] >= 3  # each member called, one at a time
    assert seen["waits"] >= 1  # and some waited for the slot
