"""Configuration in-process: bad numbers are refused by name, settings are narrow, one loader."""

from __future__ import annotations

import pytest
from traitlets import Float, Int

from daytona_kernel.config import (
    ENV_PREFIX,
    DaytonaKernelConfig,
    DaytonaSettings,
    LocalSettings,
    MirrorSettings,
    SessionSettings,
    config_outside_kernel,
    env_config,
    settings_from,
)

NUMERIC = sorted(name for name, trait in DaytonaKernelConfig.class_traits(config=True).items() if isinstance(trait, (Float, Int)))


def problems_for(environ: dict[str, str]) -> list[str]:
    return config_outside_kernel(env_config({f"{ENV_PREFIX}BACKEND": "local", **environ})).validate()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5"])
@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_setting_refuses_nan_inf_and_negatives_by_name(name: str, value: str) -> None:
    problems = problems_for({ENV_PREFIX + name.upper(): value})
    assert len(problems) == 1 and problems[0].startswith(f"{name} = '{value}' is invalid"), problems
    assert f"{ENV_PREFIX}{name.upper()}" in problems[0]  # and says where to fix it


@pytest.mark.parametrize("value", ["1e308", "1e305", "99999999999999999999"])
@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_setting_has_an_upper_bound(name: str, value: str) -> None:
    """output_limit_mb=1e308 killed the kernel at start, sync_max_file_mb=1e305 hung every cell (issue 20, item 9)."""
    trait = DaytonaKernelConfig.class_traits(config=True)[name]
    assert trait.max is not None, f"{name} has no upper bound"
    problems = problems_for({ENV_PREFIX + name.upper(): value})
    assert len(problems) == 1 and problems[0].startswith(f"{name} = '{value}' is invalid"), problems


def test_the_numeric_settings_are_all_covered() -> None:
    assert {"cell_timeout", "output_limit_mb", "interrupt_grace", "auto_stop_interval", "cpu"} <= set(NUMERIC)


def test_minus_one_still_means_never_for_auto_delete() -> None:
    assert problems_for({f"{ENV_PREFIX}AUTO_DELETE_INTERVAL": "-1"}) == []


def test_a_bad_value_keeps_the_default_and_the_good_ones_apply() -> None:
    config = config_outside_kernel(env_config({f"{ENV_PREFIX}CELL_TIMEOUT": "inf", f"{ENV_PREFIX}INTERRUPT_GRACE": "7"}))
    assert config.cell_timeout == 0.0 and config.interrupt_grace == 7.0


def test_each_component_gets_only_its_own_settings() -> None:
    config = config_outside_kernel(env_config({f"{ENV_PREFIX}CELL_TIMEOUT": "12", f"{ENV_PREFIX}IMAGE": "python:3.12"}))
    assert settings_from(SessionSettings, config).cell_timeout == 12.0
    daytona = settings_from(DaytonaSettings, config)
    assert daytona.image == "python:3.12" and not hasattr(daytona, "cell_timeout")
    assert not hasattr(settings_from(LocalSettings, config), "image")
    assert not hasattr(settings_from(MirrorSettings, config), "cell_timeout")
    with pytest.raises(AttributeError):
        daytona.image = "other"  # type: ignore[misc]


@pytest.mark.slow
def test_a_kernel_with_nan_and_inf_settings_answers_every_cell_with_the_names() -> None:
    from kernels import Kernel

    env = {f"{ENV_PREFIX}OUTPUT_LIMIT_MB": "nan", f"{ENV_PREFIX}CELL_TIMEOUT": "inf"}
    with Kernel("daytona-local", env=env) as k:
        for _ in range(2):
            run = k.execute("print('hi')")
            assert run.status == "error" and run.errors[0]["ename"] == "DaytonaKernelConfigError"
            assert "output_limit_mb = 'nan'" in run.errors[0]["evalue"] and "cell_timeout = 'inf'" in run.errors[0]["evalue"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["daytona-local", "daytona"])
def test_a_kernel_with_huge_settings_starts_and_names_them(kernel: str, daytona_env: object) -> None:
    from kernels import Kernel

    env = {f"{ENV_PREFIX}OUTPUT_LIMIT_MB": "1e308", f"{ENV_PREFIX}SYNC_MAX_FILE_MB": "1e305"}
    with Kernel(kernel, env=env) as k:
        run = k.execute("print('hi')", timeout=60)
        assert run.status == "error" and run.errors[0]["ename"] == "DaytonaKernelConfigError"
        assert "output_limit_mb = '1e308'" in run.errors[0]["evalue"] and "sync_max_file_mb = '1e305'" in run.errors[0]["evalue"]


def test_the_kernels_log_masks_url_credentials_and_tokens_in_every_line() -> None:
    import logging

    from daytona_kernel.app import MaskedRecords

    token = "ghp_" + "z9y8x7w6v5" * 4
    record = logging.LogRecord(
        "daytona_kernel.x", logging.INFO, __file__, 1, "cloning %s failed: %s", (f"https://u:{token}@host/r.git", token), None
    )
    assert MaskedRecords().filter(record)
    assert token not in record.getMessage() and "host/r.git" in record.getMessage()
    try:
        raise RuntimeError(f"clone of https://u:{token}@host/r.git failed")
    except RuntimeError:
        import sys

        failed = logging.LogRecord("daytona_kernel.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert MaskedRecords().filter(failed)
    logged = logging.Formatter().format(failed)
    assert "RuntimeError: clone of https://***@host/r.git failed" in logged and token not in logged
