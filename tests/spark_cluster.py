"""The Spark driver that ``test_spark_cluster.py`` runs in a subprocess
against its standalone cluster (one SparkContext per process, and the
pytest process may hold a local one).

    python spark_cluster.py MASTER_URL UI_PORT BROKER_URI STREAM

reads STREAM with the ``rabbitmq_stream`` data source and prints one line
``RESULT {json}``: the aggregates and, per executor, its address, the log
URL its worker gave it and the tasks it completed. ``PYSTREAM_PASSWORD``
(if set) is passed on to the executors.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pystream.spark import RabbitMQStreamDataSource

EXECUTORS = 2
EXECUTOR_WAIT = 90  # seconds for both executor JVMs to start and register
STATUS_WAIT = 30  # seconds for the UI's status store to record the finished jobs


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def wait_for(what: str, timeout: float, probe):
    """Poll ``probe`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.5)


def main(master: str, ui_port: str, uri: str, stream: str) -> None:
    builder = (SparkSession.builder.master(master)
               .appName("pystream-cluster-test")
               .config("spark.executor.cores", "1")
               .config("spark.executor.memory", "512m")
               .config("spark.ui.enabled", "true")
               .config("spark.ui.port", ui_port)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1"))
    if "PYSTREAM_PASSWORD" in os.environ:
        builder = builder.config("spark.executorEnv.PYSTREAM_PASSWORD",
                                 os.environ["PYSTREAM_PASSWORD"])
    spark = builder.getOrCreate()
    try:
        sc = spark.sparkContext
        # uiWebUrl, not ui_port: Spark moves to the next port if it is taken.
        api = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

        def executors():
            return [e for e in get_json(f"{api}/allexecutors") if e["id"] != "driver"]

        # Tasks go to whichever executors are registered when the job starts:
        # with one, it alone could read every range.
        wait_for(f"{EXECUTORS} executors", EXECUTOR_WAIT,
                 lambda: len([e for e in executors() if e["isActive"]]) >= EXECUTORS)

        spark.dataSource.register(RabbitMQStreamDataSource)
        df = (spark.read.format("rabbitmq_stream")
              .option("uri", uri).option("stream", stream)
              .option("minPartitions", "8").load())
        row = df.agg(F.count("*").alias("count"),
                     F.sum(F.length("body")).alias("bytes"),
                     F.min("offset").alias("min_offset"),
                     F.max("offset").alias("max_offset"),
                     F.sum(F.crc32("body")).alias("crc32_sum")).first()

        # The status store follows the listener bus, which records a job's
        # end after its tasks' ends (and an idle executor's count at once).
        wait_for("finished jobs in the status store", STATUS_WAIT,
                 lambda: (jobs := get_json(f"{api}/jobs"))
                 and all(j["status"] != "RUNNING" for j in jobs))
        result = {
            **row.asDict(),
            "stages": {s["stageId"]: s["numTasks"]
                       for s in get_json(f"{api}/stages?status=complete")},
            "executors": {e["id"]: {"hostPort": e["hostPort"],
                                    "log": e["executorLogs"].get("stderr", ""),
                                    "completedTasks": e["completedTasks"]}
                          for e in executors()},
        }
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
