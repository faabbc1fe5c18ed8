"""server/runtime/spark_home.py: the Spark home made of links to a PySpark package's entries, less its
sources zip (a fake package directory here; the real one in tests/integration/runtime/test_spark_home.py)."""
from __future__ import annotations

import os

import pytest

from iox_spark.server.runtime import spark_home


@pytest.fixture
def package(tmp_path, monkeypatch):
    src = tmp_path / "site-packages" / "pyspark"
    for d in ("bin", "jars", "sbin", "python/lib", "python/pyspark"):
        (src / d).mkdir(parents=True)
    (src / "jars" / "spark-core.jar").write_bytes(b"jar")
    (src / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (src / "python" / "lib" / "pyspark.zip").write_bytes(b"zip")
    (src / "python" / "lib" / "py4j-src.zip").write_bytes(b"py4j")
    (src / "python" / "pyspark" / "shell.py").write_text("")  # bin/pyspark's PYTHONSTARTUP
    (src / "__init__.py").write_text("")
    home = tmp_path / "prefix" / "share" / "iox" / "spark-home-9.9"
    monkeypatch.setattr(spark_home, "pyspark_dir", lambda: str(src))
    monkeypatch.setattr(spark_home, "path", lambda: str(home))
    return src, home


def test_the_home_links_every_entry_but_the_sources_zip(package):
    src, home = package
    assert spark_home.ensure() == str(home)
    assert sorted(os.listdir(home)) == ["__init__.py", "bin", "jars", "python", "sbin"]
    assert os.path.realpath(home / "jars" / "spark-core.jar") == str(src / "jars" / "spark-core.jar")
    assert os.listdir(home / "python" / "lib") == ["py4j-src.zip"]
    assert sorted(os.listdir(home / "python")) == ["lib", "pyspark"]
    assert os.path.realpath(home / "python" / "pyspark") == str(src / "python" / "pyspark")
    assert [n for n in os.listdir(home.parent) if n.startswith(".spark-home-")] == []  # no temporary left


def test_a_complete_home_is_used_as_it_is_and_one_of_another_package_is_replaced(package, tmp_path):
    src, home = package
    spark_home.ensure()
    marker = home / "python" / "lib" / "kept"
    marker.write_text("")
    assert spark_home.ensure() == str(home) and marker.exists()
    other = tmp_path / "other-pyspark"
    (other / "jars").mkdir(parents=True)
    (other / "bin").mkdir()
    for name in ("jars", "bin"):
        os.unlink(home / name)
        os.symlink(other / name, home / name)
    assert spark_home.ensure() == str(home)
    assert os.path.realpath(home / "jars") == str(src / "jars") and not marker.exists()


def test_an_installation_where_the_home_cannot_be_made_runs_spark_from_the_package(package):
    _src, home = package
    os.makedirs(home.parent.parent)
    home.parent.write_text("")  # a file where the directory would go (as a read-only prefix would refuse it)
    assert spark_home.ensure() is None
