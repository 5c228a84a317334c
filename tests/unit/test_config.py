import json
import subprocess
import sys

import pytest
from rstar.config import SettingsInvalid, load_settings


def test_defaults_point_at_user_dirs_and_embedded_model():
    settings = load_settings()
    assert settings.model == "default"
    assert settings.resolved_database_url == f"sqlite:///{settings.data_dir / 'rstar.db'}"
    assert settings.models_dir == settings.cache_dir / "models"


def test_environment_uses_prefix_and_nested_delimiter(monkeypatch):
    monkeypatch.setenv("RSTAR_PORT", "9123")
    monkeypatch.setenv("RSTAR_ENGINE__MAX_MODEL_LEN", "2048")
    monkeypatch.setenv("RSTAR_SANDBOX__TIMEOUT_S", "7.5")
    settings = load_settings()
    assert (settings.port, settings.engine.max_model_len, settings.sandbox.timeout_s) == (9123, 2048, 7.5)


def test_cli_overrides_beat_environment_and_none_means_not_given(monkeypatch):
    monkeypatch.setenv("RSTAR_PORT", "9123")
    monkeypatch.setenv("RSTAR_ENGINE__DTYPE", "float32")
    settings = load_settings(port=9999, host=None, engine={"max_model_len": 1024})
    assert settings.port == 9999
    assert settings.host == "127.0.0.1"
    # A nested override merges with the environment rather than replacing the whole section.
    assert (settings.engine.max_model_len, settings.engine.dtype) == (1024, "float32")


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False), ("auto", "auto"), (None, "auto")])
def test_enforce_eager_is_true_false_or_auto(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("RSTAR_ENGINE__ENFORCE_EAGER", value)
    assert load_settings().engine.enforce_eager == expected


def test_enforce_eager_refuses_other_words(monkeypatch):
    monkeypatch.setenv("RSTAR_ENGINE__ENFORCE_EAGER", "sometimes")
    with pytest.raises(SettingsInvalid, match="RSTAR_ENGINE__ENFORCE_EAGER"):
        load_settings()


def test_unknown_setting_is_rejected(monkeypatch):
    with pytest.raises(SettingsInvalid, match="no_such_knob"):
        load_settings(no_such_knob=1)


def test_a_bad_environment_value_is_one_line_naming_the_variable_for_any_command(tmp_path):
    env = {"RSTAR_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "RSTAR_API__TOOL_PROTOCOL": "paper"}
    for command in (["serve"], ["eval", "list"]):
        done = subprocess.run([sys.executable, "-m", "rstar.cli", *command], capture_output=True, text=True, env=env)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [
            "rstar: invalid setting: api.tool_protocol (RSTAR_API__TOOL_PROTOCOL): Input should be 'released' or 'improved', got 'paper'"
        ]
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_config_show_prints_json_with_the_api_key_masked(monkeypatch, tmp_path):
    env = {"RSTAR_API_KEY": "s3cret", "RSTAR_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "rstar.cli", "config", "show"], capture_output=True, text=True, env=env, check=True).stdout
    shown = json.loads(out)
    assert shown["api_key"] == "***"
    assert shown["data_dir"] == str(tmp_path)
    assert "s3cret" not in out


def test_config_show_masks_every_secret(tmp_path):
    url = "postgresql+psycopg://rstar:db-pass-9@postgres:5432/rstar"
    env = {"RSTAR_API_KEY": "s3cret", "RSTAR_ADMIN_KEY": "adm1n", "RSTAR_DATABASE_URL": url, "RSTAR_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "rstar.cli", "config", "show"], capture_output=True, text=True, env=env, check=True).stdout
    shown = json.loads(out)
    assert (shown["api_key"], shown["admin_key"]) == ("***", "***")
    assert shown["database_url"] == "postgresql+psycopg://rstar:***@postgres:5432/rstar"
    assert "db-pass-9" not in out and "adm1n" not in out and "s3cret" not in out


def test_db_upgrade_prints_its_url_without_the_password(tmp_path, monkeypatch, capsys):
    from rstar import cli
    from rstar.server import db

    monkeypatch.setattr(db, "make_engine", lambda url: url)
    monkeypatch.setattr(db, "upgrade", lambda engine: None)
    monkeypatch.setattr(db, "current_revision", lambda engine: "head")
    cli.db_upgrade(database_url="postgresql+psycopg://rstar:db-pass-9@postgres:5432/rstar")
    assert capsys.readouterr().out.strip() == "postgresql+psycopg://rstar:***@postgres:5432/rstar: schema at revision head"
