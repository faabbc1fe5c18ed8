"""server/runtime/jvm_archive.py: where the archive is and the JVM options that map it (no JVM here)."""
from __future__ import annotations

import os

import pyspark
import pytest

from iox_spark.server.cli import build_jvm_archive
from iox_spark.server.runtime.jvm_archive import DUMP_OPTION, ENV, archive_path, java_options


def test_the_default_archive_is_per_pyspark_version_and_java_binary(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    first = archive_path()
    assert first.endswith(".jsa") and f"spark-{pyspark.__version__}-" in first
    os.utime(java, ns=(1, 2))  # the same path, another build of Java: another archive
    assert archive_path() != first


def test_an_explicit_path_or_off(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "x.jsa"))
    assert archive_path() == str(tmp_path / "x.jsa")
    monkeypatch.setenv(ENV, "off")
    assert archive_path() is None and java_options() == ""
    assert build_jvm_archive.main(["--path"]) == 2


def test_options_map_an_existing_archive_and_never_one_being_dumped(monkeypatch, tmp_path):
    path = tmp_path / "a.jsa"
    monkeypatch.setenv(ENV, str(path))
    assert java_options() == ""  # not built: the JVM starts without
    path.write_bytes(b"x")
    opts = java_options()
    assert f"-XX:SharedArchiveFile={path}" in opts and "-Xshare:auto" in opts
    assert java_options(f"-Xmx1g {DUMP_OPTION}/tmp/new.jsa") == ""


@pytest.mark.parametrize("args,code", [(["--path"], 0), ([], 0)])
def test_the_command_prints_the_path_or_leaves_an_archive_in_place(monkeypatch, tmp_path, capsys, args, code):
    path = tmp_path / "a.jsa"
    path.write_bytes(b"x")
    monkeypatch.setenv(ENV, str(path))
    assert build_jvm_archive.main(args) == code
    assert str(path) in capsys.readouterr().out
