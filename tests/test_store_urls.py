"""Store URLs in messages: one redact function hides every password, whatever the backend."""

from __future__ import annotations

from pathlib import Path

import pytest

import pitstop
from pitstop.store.contract.urls import redact


def test_redact_hides_userinfo_passwords_and_password_options() -> None:
    assert redact("postgresql://u:p%40ss@h:5/db?sslmode=require") == (
        "postgresql://u:***@h:5/db?sslmode=require"
    )
    assert redact("postgresql://h/db?password=abc&sslpassword=d") == (
        "postgresql://h/db?password=***&sslpassword=***"
    )
    assert redact("host=h password='a b' dbname=d") == "host=h password=*** dbname=d"
    assert redact("sqlite:///runs.db") == "sqlite:///runs.db"


def test_open_store_errors_never_show_a_password() -> None:
    with pytest.raises(pitstop.UnsupportedStoreError) as info:
        pitstop.open_store("mysql://u:hunter2@h/db?password=hunter2")
    assert "hunter2" not in str(info.value)
    assert "mysql://u:***@h/db?password=***" in str(info.value)


@pytest.mark.parametrize(
    "conninfo", ["host=localhost dbname=app", "dbname=app user=u password=hunter2", " port=5432"]
)
def test_open_store_refuses_a_libpq_string_instead_of_making_a_file(
    conninfo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pitstop.UnsupportedStoreError, match="libpq connection string") as info:
        pitstop.open_store(conninfo)
    assert "hunter2" not in str(info.value)
    assert "postgresql://" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after it


def test_a_path_with_an_equals_sign_is_still_a_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pitstop.open_store("runs=2026.db") as store:
        assert store.latest("nothing") is None
