"""The mirror's planning (mirror/plan.py): pure decisions on a change report and a scan, in-process."""

from __future__ import annotations

from daytona_kernel.config import MirrorSettings
from daytona_kernel.mirror.plan import (
    MAX_REPORTED_PATHS,
    MB,
    Landing,
    Refusal,
    SyncReport,
    UpPlan,
    choose_up,
    landing_of,
    plan_down,
    reported_paths,
    why_not_down,
)
from daytona_kernel.protocol import FileChanges
from daytona_kernel.runtime.pathrules import MirrorRules

RULES = MirrorRules("/nonexistent-notebook-folder", gitignore=False)


def test_the_one_decision_names_editor_settings_secrets_and_excluded_paths() -> None:
    nothing = Landing()
    assert why_not_down("results/table.csv", RULES, nothing) is None
    assert why_not_down(".vscode/tasks.json", RULES, nothing)[0] is Refusal.REFUSED  # type: ignore[index]
    assert why_not_down("sub/.devcontainer/devcontainer.json", RULES, nothing)[0] is Refusal.REFUSED  # type: ignore[index]
    assert why_not_down(".env", RULES, nothing)[0] is Refusal.SECRET  # type: ignore[index]
    assert why_not_down("__pycache__/x.pyc", RULES, nothing)[0] is Refusal.EXCLUDED  # type: ignore[index]


def test_code_never_comes_down_and_no_gitignore_or_setting_widens_that() -> None:
    """The valve (issue 20): environments, files every Python runs, repositories and files tools run on open."""
    everything = MirrorRules("/nonexistent-notebook-folder", defaults=(), secrets=(), gitignore=False)  # excludes nothing
    reported = ["myenv/pyvenv.cfg", "myenv/bin/python", "conda/conda-meta/history", "r/HEAD", "r/objects/ab/cd", "r/refs/x"]
    landing = landing_of(reported) | landing_of(["env/pyvenv.cfg", "vendored/HEAD", "vendored/refs/heads/main"])  # here
    assert landing.envs == {"myenv", "conda", "env"} and landing.repos == {"r", "vendored"}
    refused = [
        *reported, "env/lib/python3.12/site-packages/x.py", "vendored/config", "a/b/zz.PTH", "SiteCustomize.py",
        "lib/usercustomize.py", "x/__pycache__/m.cpython-312.pyc", "m.cpython-312-x86_64-linux-gnu.so", "lib/site-packages/y.py",
        ".devcontainer.json", "p.code-workspace", ".VSCODE/tasks.json", ".idea/x.xml", ".envrc", ".env", ".env.local",
        ".pre-commit-config.yaml", "sub/.exrc", ".dir-locals.el", ".mcp.json", ".claude/settings.json", ".npmrc",
        "sub/.autoenv.zsh",
    ]  # fmt: skip
    for rel in refused:
        refusal = why_not_down(rel, everything, landing)
        assert refusal is not None and refusal[0] is Refusal.REFUSED, rel
        assert f"%download {rel}" in refusal[1]
    for rel in (
        "results/table.csv",
        "refs/paper.bib",
        "HEAD.txt",
        "objects/list.json",
        "helpers.py",
        "env.yaml",
        "notes/env.local.md",
    ):
        assert why_not_down(rel, everything, landing) is None, rel
    assert landing_of(["data/HEAD", "data/notes.txt"]).repos == frozenset()  # HEAD alone is not a repository


def test_a_report_is_planned_from_its_typed_value_and_an_oversized_one_is_named() -> None:
    report = SyncReport()
    changes = FileChanges({"b.txt": (3, 4, 0o644), "a.txt": (1, 2)}, ["gone.txt"], truncated=True)
    assert reported_paths(changes, report) == ([("a.txt", (1, 2, -1)), ("b.txt", (3, 4, 0o644))], ["gone.txt"])
    assert [path for path, _ in report.skipped] == ["(sandbox folder)"] and not report.refused
    huge = FileChanges({f"f{i}": (1, 1) for i in range(MAX_REPORTED_PATHS)}, ["one more"])
    assert reported_paths(huge, report) == ([], [])
    assert [path for path, _ in report.refused] == ["(change report)"]


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
    choose_up(
        plan, [("big.bin", 3 * MB), ("a", MB), ("b", MB), ("c", 10)], MirrorSettings(sync_max_file_mb=2, sync_max_total_mb=1.5)
    )
    assert plan.todo == ["a", "c"] and plan.total == MB + 10
    assert [path for path, _ in plan.skipped] == ["big.bin"]
    assert plan.waiting == [("b", MB)]  # past this sync's total: the cell is told (FolderNotSynced), the next sync sends it


def test_with_sync_code_down_off_only_data_comes_back_and_code_is_named_once() -> None:
    config = MirrorSettings(sync_code_down=False)
    changed = [
        ("analysis.py", (1, 1, 0o644)),
        ("out/report.ipynb", (1, 1, 0o644)),
        ("run", (1, 1, 0o755)),
        ("Makefile", (1, 1, 0o644)),
        (".github/workflows/ci.yml", (1, 1, 0o644)),
        ("plot.png", (1, 1, 0o644)),
        ("results/table.csv", (1, 1, 0o644)),
        ("model.pkl", (1, 1, 0o644)),
    ]
    report = SyncReport()
    plan = plan_down(changed, report, config, RULES, failed={}, secrets_noticed=set())
    assert [rel for rel, _, _ in plan.wanted] == ["plot.png", "results/table.csv", "model.pkl"]
    assert sorted(report.code_kept) == ["Makefile", "analysis.py", "out/report.ipynb", "run"]
    assert "sync_code_down is off" in report.notices() and "%download Makefile" in report.notices()
    assert [path for path, _ in report.refused] == [".github/workflows/ci.yml"]  # hidden: refused whatever the setting
    again = SyncReport()
    plan_down(changed, again, config, RULES, failed={}, secrets_noticed=set(report.code_kept))
    assert again.code_kept == []  # named once
    assert [rel for rel, _, _ in plan_down(changed, SyncReport(), MirrorSettings(), RULES, {}, set()).wanted] == [
        r for r, _ in changed if r[0] != "."
    ]


# -- issue 31: the mirror judges the end state, on normalised names -------------------------------------------------


NOTHING = Landing()


def refused(rel: str, landing: Landing = NOTHING, rules: MirrorRules = RULES) -> bool:
    """The rule keeps ``rel`` from being written here (refused, excluded or a secret: anything but None)."""
    return why_not_down(rel, rules, landing) is not None


def test_a_repository_completed_over_two_reports_is_refused_in_any_order() -> None:
    """Item 2: cell 1's objects/, refs/ and config are already here; cell 2's HEAD would complete a repository."""
    for where in ("", "sub/"):
        here = landing_of([f"{where}objects/info/packs", f"{where}refs/heads/main", f"{where}config"])
        assert not here.repos  # no HEAD: not a repository, so cell 1's files came down
        report = landing_of([f"{where}HEAD"])
        assert refused(f"{where}HEAD", report | here), where
        head_here = landing_of([f"{where}HEAD"])  # the other order: HEAD first, then the rest
        for rel in ("objects/ab/cd", "refs/heads/main", "commondir"):
            assert refused(f"{where}{rel}", landing_of([f"{where}{rel}"]) | head_here), (where, rel)
    assert not refused("sub/notes.txt", landing_of(["sub/notes.txt"]) | landing_of(["sub/HEAD"]))  # HEAD alone is data
    assert refused("HEAD", landing_of(["HEAD"]) | landing_of(["config"]))  # a config with its core.fsmonitor: enough
    assert refused("sub/config", landing_of(["sub/config"]) | landing_of(["sub/HEAD"]))
    assert not refused("config", landing_of(["config"]))  # a config alone is data


def test_folder_keys_are_case_folded_and_normalised() -> None:
    """Item 3: Evil/HEAD beside evil/objects/ is one repository on a case-insensitive disk; so are the variants."""
    assert refused("Evil/HEAD", landing_of(["Evil/HEAD", "evil/objects/ab/cd"]))
    assert refused("evil/objects/ab/cd", landing_of(["Evil/HEAD", "evil/objects/ab/cd"]))
    assert refused("EVIL./head", landing_of(["EVIL./head"]) | landing_of(["evil/Refs/heads/main"]))
    assert refused("e\u200dvil/HEAD", landing_of(["e\u200dvil/HEAD"]) | landing_of(["evil/objects/x"]))
    assert refused("Venv2/lib/x.py", landing_of(["venv2/PyVenv.CFG"]))


def test_names_are_normalised_before_every_rule() -> None:
    """Item 3: what Windows, macOS or HFS+ would open as a refused name is refused under every spelling."""
    everything = MirrorRules("/nonexistent-notebook-folder", defaults=(), gitignore=False)
    for rel in (
        ".git./hooks/pre-commit", ".git /hooks/pre-commit", ".git. . /config", "GIT~1/hooks/pre-commit", "git~1/config",
        ".vscode./tasks.json", "VSCODE~1/tasks.json", "sitecustomize.py.", "Sitecustomize.PY ", "SITECU~1.PY",
        ".g\u200cit/config", ".\u200bvscode/tasks.json", "site\u00adcustomize.py", "cafe\u0301/sitecustomize.py",
        ".ENV.", "x.pth.", "\u200b/data.csv", ". ./data.csv",
        ".git::$INDEX_ALLOCATION/hooks/pre-commit", "sitecustomize.py::$DATA", ".vscode:x/tasks.json",
    ):  # fmt: skip
        assert refused(rel, rules=everything), repr(rel)
    for rel in ("data~/x.csv", "backup.csv~", "caf\u00e9/table.csv", "a.b.c.csv", "v~1.0.tar.gz.csv"):
        assert not refused(rel, rules=everything), repr(rel)


ITEM_4 = [
    ".pdbrc", "opencode.json", ".opencode/plugin/x.js", ".roo/mcp.json", ".kiro/settings/mcp.json", ".amazonq/mcp.json",
    ".codex/config.toml", ".kilocode/rules.md", ".aider.conf.yml", ".pnpmfile.cjs", "bunfig.toml", ".cargo/config.toml",
    ".vimrc", "_vimrc", "_exrc", ".helix/languages.toml", ".lazy.lua", "mise.local.toml", ".mise.local.toml",
    "mise.dev.toml", "mise/config.toml", ".tool-versions", ".flaskenv", "libx.so.1", "lib/libx.so.1.2.3", "x.dylib",
    "x.dll", "sub/.pdbrc",
    # agent instruction files direct tools that run commands
    "AGENTS.md", "sub/CLAUDE.md", "CLAUDE.local.md", "GEMINI.md", ".cursorrules", ".windsurfrules", ".clinerules",
    ".github/copilot-instructions.md",
]  # fmt: skip


def test_hidden_names_tool_files_shared_libraries_and_agent_instructions_never_come_down() -> None:
    """Item 4: dot-named files and folders are configuration, refused as a class but for a short allow-list."""
    everything = MirrorRules("/nonexistent-notebook-folder", defaults=(), secrets=(), gitignore=False)
    for rel in ITEM_4:
        refusal = why_not_down(rel, everything, Landing())
        assert refusal is not None and refusal[0] is Refusal.REFUSED, rel
    for rel in (
        ".gitignore",
        "sub/.gitkeep",
        ".keep",
        "README.md",
        "notes/agents.md.csv",
        "mise.csv",
        "libx.so.txt",
        "data/x.json",
    ):
        assert why_not_down(rel, everything, Landing()) is None, rel


def test_a_flood_of_refusals_for_one_reason_is_one_line() -> None:
    """A cell that makes a venv (or a .tox/) refuses thousands of files for one reason: one line names them."""
    changed = [(f"env/lib/python3.12/site-packages/pkg/m{i}.py", (1, 1, 0o644)) for i in range(3000)]
    changed += [("env/pyvenv.cfg", (1, 1, 0o644)), (".pdbrc", (1, 1, 0o644)), ("table.csv", (1, 1, 0o644))]
    report = SyncReport()
    plan = plan_down(changed, report, MirrorSettings(), RULES, {}, set(), landing_of([rel for rel, _ in changed]))
    assert [rel for rel, _, _ in plan.wanted] == ["table.csv"] and len(report.refused) == 3002
    lines = report.notices().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("Refused 3001 paths the sandbox reported (env/lib/python3.12/site-packages/pkg/m0.py, ")
    assert "and 2981 more): it could run code here: env/ is a Python environment" in lines[0]
    assert lines[0].endswith("Fetch one with %download PATH if you trust it")
    assert lines[1].startswith("Refused a path the sandbox reported: .pdbrc: it could run code here: .pdbrc is a hidden name")


def test_the_rule_looks_up_only_the_folders_on_the_path_s_way() -> None:
    """A report of N files in N folders costs N lookups, not N passes over every folder (quadratic: 11 s for
    5,000 run folders): the rule may look a folder up in the Landing, never walk all of them."""
    from collections.abc import Iterator, Mapping

    class LookupsOnly(Mapping[str, frozenset[str]]):
        def __init__(self, data: dict[str, frozenset[str]]) -> None:
            self.data = data

        def __getitem__(self, key: str) -> frozenset[str]:
            return self.data[key]

        def __iter__(self) -> Iterator[str]:
            raise AssertionError("the rule walked every folder of the Landing")

        def __len__(self) -> int:
            return len(self.data)

    landing = Landing(
        LookupsOnly(
            {**{f"runs/r{i}": frozenset() for i in range(100)}, **landing_of(["runs/r7/HEAD", "runs/r7/objects/x"]).markers}
        )
    )
    assert why_not_down("runs/r1/metrics.csv", RULES, landing) is None
    assert refused("runs/r7/metrics.csv", landing) and refused("runs/R7./refs/heads/main", landing)
