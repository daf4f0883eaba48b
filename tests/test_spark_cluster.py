"""The data source on a real Spark standalone cluster: a master and two
one-core workers on this machine, a driver in a subprocess, and a stream
of a million messages read by both executors in parallel and checked
against a direct read."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
import zlib
from contextlib import ExitStack

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyspark
import pytest

import pystream
from pystream.uri import parse_uri

from .conftest import MODERN_URI
from .test_spark_sink import killed_write_publishes_every_row_once

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.spark]

SPARK_HOME = pathlib.Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
DRIVER = pathlib.Path(__file__).with_name("spark_cluster.py")

MESSAGES = 1_000_000
WORKERS = 2
CLUSTER_TIMEOUT = 120  # seconds for three JVMs to start on a busy 2-core machine
DRIVER_TIMEOUT = 180  # driver JVM, two executor JVMs and the job (about 45 s)
LOG_LINES = 60


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (bound together, so never the same)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def tail(path: pathlib.Path, lines: int = LOG_LINES) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


class Cluster:
    """A standalone master and workers, each ``spark-class`` in its own
    process group (a worker's executors and their Python workers join it),
    logging to a file under ``root``."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.port, self.webui_port, *worker_ports = free_ports(2 + 2 * WORKERS)
        self.worker_uis: set[str] = set()  # host:port of each worker's web UI
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME),
                    "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOCAL_DIRS": str(root / "local"),
                    # Its REST submission server would take the fixed port 6066.
                    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self.procs: list[subprocess.Popen] = []
        self.logs: list[pathlib.Path] = []
        self._start("master", "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.webui_port))
        for i in range(WORKERS):
            work_dir = root / f"worker{i}"
            work_dir.mkdir()
            # Started with the master: a worker retries until it registers.
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                        self.master_url, "--host", "127.0.0.1",
                        "--port", str(worker_ports[i]),
                        "--webui-port", str(worker_ports[WORKERS + i]),
                        "--cores", "1", "--memory", "1g",
                        "--work-dir", str(work_dir))

    def _start(self, name: str, cls: str, *args: str) -> None:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(
                [str(SPARK_CLASS), cls, *args], env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        self.logs.append(log)

    def logs_text(self) -> str:
        """The daemons' logs and those of the executors they started."""
        executor_logs = sorted(self.root.glob("worker*/app-*/*/stderr"))
        return "\n".join(tail(p) for p in [*self.logs, *executor_logs])

    def alive_workers(self) -> list[dict]:
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as r:
                state = json.load(r)
        except (OSError, ValueError):
            return []  # not up yet
        return [w for w in state["workers"] if w["state"] == "ALIVE"]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while len(workers := self.alive_workers()) < WORKERS:
            exited = [str(log) for p, log in zip(self.procs, self.logs, strict=True)
                      if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                why = (f"exited: {', '.join(exited)}" if exited else
                       f"not {WORKERS} ALIVE workers after {CLUSTER_TIMEOUT} s")
                pytest.fail(f"Spark standalone cluster failed to start ({why})\n"
                            + self.logs_text(), pytrace=False)
            time.sleep(0.5)
        self.worker_uis = {urllib.parse.urlsplit(w["webuiaddress"]).netloc
                           for w in workers}

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def bodies(n: int, seed: int = 42) -> pa.BinaryArray:
    """``n`` random bodies of 60 to 140 bytes (about 100)."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(rng.integers(60, 141, n), out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)])


@pytest.fixture(scope="module")
def big_stream():
    name = f"test-spark-cluster-{uuid.uuid4().hex[:8]}"
    with pystream.connect(MODERN_URI) as client:
        client.create_stream(name)
        try:
            array = bodies(MESSAGES)
            with client.producer(name) as producer:
                for start in range(0, MESSAGES, 100_000):
                    producer.send_batch(array.slice(start, 100_000))
                producer.flush(timeout=120)
            yield name
        finally:
            client.delete_stream(name)


def direct_aggregates(stream: str) -> dict:
    """What the driver computes, from one pystream consumer."""
    with pystream.connect(MODERN_URI) as client, \
            client.consumer(stream, offset="first", body="binary") as consumer:
        parts = []
        rows = 0
        while rows < MESSAGES:
            table = consumer.read(MESSAGES - rows, timeout=10)
            assert table.num_rows, f"the direct read stopped at {rows} rows"
            parts.append(table)
            rows += table.num_rows
    table = pa.concat_tables(parts)
    body = table.column("body")
    return {"count": table.num_rows,
            "bytes": pc.sum(pc.binary_length(body)).as_py(),
            "min_offset": pc.min(table.column("offset")).as_py(),
            "max_offset": pc.max(table.column("offset")).as_py(),
            "crc32_sum": sum(zlib.crc32(b) for b in body.to_pylist())}


def test_read_in_parallel_on_a_standalone_cluster(big_stream, cluster, tmp_path):
    address = parse_uri(MODERN_URI)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_DIRS": str(tmp_path),
           # The data source refuses a password in the URI.
           "PYSTREAM_PASSWORD": address.password}
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [sys.executable, str(DRIVER), cluster.master_url, str(free_ports(1)[0]),
             address.uri(), big_stream],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out,
            start_new_session=True)
        try:
            stdout, _ = driver.communicate(timeout=DRIVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            stdout, _ = driver.communicate()
    results = [line[len(b"RESULT "):] for line in stdout.splitlines()
               if line.startswith(b"RESULT ")]
    if driver.returncode != 0 or not results:
        pytest.fail(f"the driver failed (exit code {driver.returncode})\n"
                    + cluster.logs_text() + "\n" + stdout.decode(errors="replace")[-4000:]
                    + "\n" + tail(log), pytrace=False)
    result = json.loads(results[0])
    print(json.dumps(result, indent=1))

    executors = result["executors"]
    busy = {i: e for i, e in executors.items() if e["completedTasks"] > 0}
    assert len(busy) == WORKERS, f"tasks ran on {sorted(busy)} only: {executors}"
    # A worker gives its executors log URLs on its own web UI.
    worker_uis = {urllib.parse.urlsplit(e["log"]).netloc for e in busy.values()}
    assert worker_uis == cluster.worker_uis, executors

    expected = direct_aggregates(big_stream)
    assert expected["count"] == MESSAGES
    assert {k: result[k] for k in expected} == expected


def test_killed_streaming_write_on_a_standalone_cluster(cluster, modern, tmp_path):
    """The sink's exactly-once across a SIGKILL of the driver, with the
    tasks on the cluster's executors (see test_spark_sink.py)."""
    target = f"test-spark-cluster-kill-{uuid.uuid4().hex[:8]}"
    modern.create_stream(target)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_DIRS": str(tmp_path)}
    try:
        killed_write_publishes_every_row_once(modern, target, tmp_path,
                                              cluster.master_url, env)
    finally:
        modern.delete_stream(target, missing_ok=True)
