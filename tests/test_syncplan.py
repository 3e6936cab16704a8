"""The mirror's planning (syncplan.py): pure decisions on a change report and a scan, in-process."""

from __future__ import annotations

from daytona_kernel.config import MirrorSettings
from daytona_kernel.runtime.pathrules import MirrorRules
from daytona_kernel.syncplan import (
    MB,
    Refusal,
    SyncReport,
    UpPlan,
    choose_up,
    parse_report,
    plan_down,
    why_not_down,
)

RULES = MirrorRules("/nonexistent-notebook-folder", gitignore=False)


def test_the_one_decision_names_editor_settings_secrets_and_excluded_paths() -> None:
    assert why_not_down("results/table.csv", RULES) is None
    assert why_not_down(".vscode/tasks.json", RULES)[0] is Refusal.REFUSED  # type: ignore[index]
    assert why_not_down("sub/.devcontainer/devcontainer.json", RULES)[0] is Refusal.REFUSED  # type: ignore[index]
    assert why_not_down(".env", RULES)[0] is Refusal.SECRET  # type: ignore[index]
    assert why_not_down("__pycache__/x.pyc", RULES)[0] is Refusal.EXCLUDED  # type: ignore[index]


def test_a_malformed_report_is_named_and_nothing_is_planned() -> None:
    report = SyncReport()
    assert parse_report(["not", "a", "mapping"], report) == ([], [])
    assert parse_report({"changed": {"a.txt": [1, 2], "bad.txt": [True, 1]}, "deleted": ["gone.txt", 3]}, report) == (
        [("a.txt", (1, 2, -1))],
        ["gone.txt"],
    )
    assert [path for path, _ in report.refused] == ["(change report)", "bad.txt"]


def test_plan_down_refuses_acknowledges_and_defers_by_the_limits() -> None:
    config = MirrorSettings(sync_max_file_mb=1, sync_max_total_mb=1.5)
    changed = [
        ("../escape.txt", (1, 1, 0o644)),
        (".vscode/settings.json", (1, 1, 0o644)),
        (".env", (1, 1, 0o600)),
        ("big.bin", (2 * MB, 1, 0o644)),
        ("a.csv", (MB, 1, 0o644)),
        ("b.csv", (MB, 1, 0o644)),
        ("failed.txt", (5, 1, 0o644)),
    ]
    report = SyncReport()
    plan = plan_down(changed, report, config, RULES, failed={"failed.txt": (5, 1, 0o644)}, secrets_noticed=set())
    assert [rel for rel, _, _ in plan.wanted] == ["a.csv"]
    assert [raw for raw, _ in plan.acked] == ["../escape.txt", ".vscode/settings.json", ".env", "big.bin"]
    assert [path for path, _ in report.left_behind] == ["b.csv"]  # over the total: comes after a later cell
    assert report.secrets_down == [".env"]
    assert [path for path, _ in report.refused] == ["../escape.txt", ".vscode/settings.json"]
    again = SyncReport()
    plan_down([(".env", (1, 1, 0o600))], again, config, RULES, failed={}, secrets_noticed={".env"})
    assert again.secrets_down == []  # named once


def test_choose_up_keeps_to_the_file_and_total_limits() -> None:
    plan = UpPlan()
    choose_up(plan, [("big.bin", 3 * MB), ("a", MB), ("b", MB), ("c", 10)], MirrorSettings(sync_max_file_mb=2, sync_max_total_mb=1.5))
    assert plan.todo == ["a", "c"] and plan.total == MB + 10
    assert [path for path, _ in plan.skipped] == ["big.bin", "b"]
