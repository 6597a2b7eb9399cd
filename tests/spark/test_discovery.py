"""`format("scow")` in a new SparkSession with no `spark.dataSource.register`.

Spark finds Python data sources by listing top-level `pyspark_*` modules
(`pyspark.sql.worker.lookup_data_sources`: `pkgutil.iter_modules()`, then each module's
`DefaultSource`). The session runs in its own process, from a directory that is not the
repository, so nothing the other tests registered, and no module the working directory
happens to hold, takes part.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyspark_scow
import pytest

from tests.spark.conftest import publish, stream, wait_stream

pytestmark = pytest.mark.spark

SCRIPT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    url = sys.argv[1]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("scow-discovery")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    def bodies():
        df = spark.read.format("scow").option("url", url).option("queues", "s").load()
        return [bytes(r.body).decode() for r in df.orderBy("sequence").collect()]
    found = bodies()
    from scow.plugins.spark.source import ScowDataSource
    spark.dataSource.register(ScowDataSource)
    registered = bodies()
    print("FOUND", ",".join(found))
    print("REGISTERED", ",".join(registered))
    spark.stop()
    """
)


def installed_layout(tmp_path: Path) -> Path:
    """A path entry holding `pyspark_scow` as a wheel installs it (a top-level package).

    The editable install (`pip install -e .`, setuptools' default mode) maps packages with
    an import hook that `pkgutil.iter_modules()` does not list, so Spark's lookup cannot
    see them there; a regular install puts `pyspark_scow/` in site-packages.
    """
    site = tmp_path / "site"
    site.mkdir()
    (site / "pyspark_scow").symlink_to(Path(pyspark_scow.__file__).parent)
    return site


def test_new_session_reads_format_scow_without_registering(streams, tmp_path):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", [f"m{i}" for i in range(10)])
    wait_stream(broker, "s", 10)
    site = installed_layout(tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            p for p in [str(site), os.environ.get("PYTHONPATH", "")] if p
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, broker.url],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    expected = ",".join(f"m{i}" for i in range(10))
    assert f"FOUND {expected}" in done.stdout.splitlines()
    assert f"REGISTERED {expected}" in done.stdout.splitlines()
