"""The ``pystream`` command line, against the real brokers: in-process
through ``pystream.cli.main`` and as a real subprocess."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import pystream
import pystream.ranges
from pystream import cli

from . import brokers
from .conftest import EXTERNAL_URI, MANAGEMENT, MODERN_URI, TLS_PORT, sigint_default

LINES = [b"hello", b"", "caf\u00e9 \u2615".encode(), b"\xff\xfe not utf-8",
         b'{"n": 1}']


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_process(*argv: str, stdin: bytes = b"",
                env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pystream.cli", *argv],
                          input=stdin, capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})


def publish(monkeypatch, capsys, uri: str, stream: str, lines: list[bytes],
            *options: str) -> None:
    data = b"".join(line + b"\n" for line in lines)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    status, _, err = run(capsys, "--uri", uri, *options, "publish", stream)
    assert status == 0, err
    assert f"published {len(lines):,} messages" in err


def read_all(uri: str, stream: str, rows: int, **options) -> pa.Table:
    """The stream's first ``rows`` records, read directly."""
    with pystream.connect(uri) as client, client.consumer(
            stream, offset="first", body="binary", **options) as consumer:
        parts = [consumer.read(rows, timeout=5)]
        while sum(t.num_rows for t in parts) < rows:
            parts.append(consumer.read(rows, timeout=5))
            assert parts[-1].num_rows, "the stream holds fewer records"
    return pa.concat_tables(parts).slice(0, rows)


def assert_one_line_error(status: int, out: str, err: str, *words: str) -> None:
    assert status == 1
    assert out == ""
    assert err.startswith("pystream: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err


@pytest.fixture
def filled(modern, stream_name):
    """A stream of 30 000 numbered messages on the modern broker, sent in
    three batches so that it holds several chunks."""
    modern.create_stream(stream_name)
    with modern.producer(stream_name) as producer:
        for part in range(3):
            producer.send_batch([f"message {i}".encode()
                                 for i in range(part * 10_000, (part + 1) * 10_000)])
    yield stream_name
    modern.delete_stream(stream_name, missing_ok=True)


# --- create, stats, delete, streams -------------------------------------------

@pytest.mark.broker
def test_create_stats_delete(uri, stream_name, capsys):
    create = ["--uri", uri, "create", stream_name, "--max-age", "7D",
              "--max-length-bytes", "100000000", "--max-segment-size-bytes", "10000000"]
    status, out, _ = run(capsys, *create)
    assert (status, out) == (0, f"created stream {stream_name!r}\n")
    try:
        status, out, _ = run(capsys, "stats", stream_name, "--json", "--uri", uri)
        assert status == 0
        stats = json.loads(out)
        assert (stats["first_offset"], stats["end_offset"],
                stats["approximate_records"]) == (0, 0, 0)
        assert stats["leader"].endswith(f":{pystream.parse_uri(uri).port}")
        with pystream.connect(uri) as client:
            if client.supports("stream_stats"):
                assert stats["committed_chunk_id"] == -1
            else:
                assert stats["committed_chunk_id"] is None

        status, out, _ = run(capsys, "--uri", uri, "stats", stream_name)
        assert status == 0
        assert "end offset:" in out and "leader:" in out

        status, out, err = run(capsys, *create)
        assert_one_line_error(status, out, err,
                              f"stream {stream_name!r} already exists")
    finally:
        status, out, _ = run(capsys, "--uri", uri, "delete", stream_name)
    assert (status, out) == (0, f"deleted stream {stream_name!r}\n")
    status, out, err = run(capsys, "--uri", uri, "stats", stream_name)
    assert_one_line_error(status, out, err, f"stream {stream_name!r} does not exist")


@pytest.mark.broker
def test_stats_counts_published_records(modern, filled, capsys):
    status, out, _ = run(capsys, "--uri", MODERN_URI, "stats", filled, "--json")
    stats = json.loads(out)
    assert (stats["first_offset"], stats["end_offset"]) == (0, 30_000)
    assert stats["approximate_records"] == 30_000
    assert stats["last_chunk_id"] >= stats["committed_chunk_id"] > 0


@pytest.mark.broker
def test_streams_lists_a_created_stream(broker, uri, stream, capsys):
    management = MANAGEMENT[broker]
    status, out, _ = run(capsys, "--uri", uri, "streams", "--json",
                         "--management-url", management)
    assert status == 0
    assert stream in [s["name"] for s in json.loads(out)]
    status, out, _ = run(capsys, "--uri", uri, "streams",
                         "--management-url", management)
    assert status == 0
    assert out.split("\n")[0].split()[:2] == ["NAME", "MESSAGES"]
    assert any(line.split()[0] == stream for line in out.splitlines()[1:])


@pytest.mark.broker
def test_streams_management_errors(capsys, monkeypatch):
    monkeypatch.setenv("PYSTREAM_MANAGEMENT_URL", "http://localhost:1")
    status, out, err = run(capsys, "streams")
    assert_one_line_error(status, out, err, "cannot reach the management API",
                          "http://localhost:1")
    monkeypatch.delenv("PYSTREAM_MANAGEMENT_URL")
    status, out, err = run(capsys, "--uri", "rabbitmq-stream://guest:Wr0ng@localhost/",
                           "streams")
    assert_one_line_error(status, out, err, "401")
    assert "Wr0ng" not in err


# --- publish and tail ---------------------------------------------------------

@pytest.mark.broker
def test_publish_then_tail_json(uri, stream, capsys, monkeypatch):
    publish(monkeypatch, capsys, uri, stream, LINES)
    status, out, _ = run(capsys, "--uri", uri, "tail", stream, "--from", "first",
                         "--count", str(len(LINES)), "--format", "json",
                         "--columns", "properties,application_properties")
    assert status == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in records] == list(range(len(LINES)))
    bodies = [r["body"].encode() if "body" in r else base64.b64decode(r["body_base64"])
              for r in records]
    assert bodies == LINES
    assert "body_base64" in records[3] and "body" not in records[3]
    assert records[2]["body"] == "caf\u00e9 \u2615"
    stamp = dt.datetime.fromisoformat(records[0]["chunk_timestamp"])
    assert abs(dt.datetime.now(dt.UTC) - stamp) < dt.timedelta(minutes=5)
    assert all(set(r) >= {"properties", "application_properties"} for r in records)


@pytest.mark.broker
def test_tail_json_renders_optional_columns(modern, modern_stream, capsys):
    with modern.producer(modern_stream) as producer:
        producer.send(b"x", properties={"message_id": "m-1", "user_id": b"guest"},
                      application_properties={"color": "red", "n": 3})
        producer.flush(10)
    status, out, _ = run(capsys, "--uri", MODERN_URI, "tail", modern_stream,
                         "--from", "first", "--count", "1", "--format", "json",
                         "--columns", "application_properties,properties")
    record = json.loads(out)
    assert record["properties"] == {"message_id": "m-1", "user_id": "guest"}
    assert record["application_properties"] == {"color": "red", "n": "3"}


@pytest.mark.broker
def test_tail_table(uri, stream, capsys, monkeypatch):
    publish(monkeypatch, capsys, uri, stream, LINES + [b"x" * 5000])
    status, out, _ = run(capsys, "--uri", uri, "tail", stream,
                         "--from", "0", "--count", "6")
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["OFFSET", "TIME"] and header.endswith("BODY")
    assert [int(row.split()[0]) for row in rows] == list(range(6))
    assert rows[0].endswith("  hello")
    assert rows[3].endswith(r"\xff\xfe not utf-8")
    assert rows[5].endswith("xxx...") and len(rows[5]) < 300


@pytest.mark.broker
def test_tail_from_a_time_and_next(modern, modern_stream, capsys, monkeypatch):
    publish(monkeypatch, capsys, MODERN_URI, modern_stream, [b"old"])
    time.sleep(1.1)  # chunk timestamps have millisecond resolution
    middle = dt.datetime.now(dt.UTC)
    publish(monkeypatch, capsys, MODERN_URI, modern_stream, [b"new"])
    status, out, _ = run(capsys, "--uri", MODERN_URI, "tail", modern_stream, "--from",
                         middle.isoformat(), "--count", "1", "--format", "raw")
    assert (status, out) == (0, "new\n")

    # --from next waits for a message published after it subscribed.
    def publish_later() -> None:
        with modern.producer(modern_stream) as producer:
            producer.send_batch([b"newest"]).result(10)

    later = threading.Timer(1.0, publish_later)
    later.start()
    status, out, _ = run(capsys, "--uri", MODERN_URI, "tail", modern_stream,
                         "--from", "next", "--count", "1", "--format", "raw")
    later.join()
    assert (status, out) == (0, "newest\n")


@pytest.mark.broker
def test_publish_and_tail_raw_as_processes(uri, stream):
    lines = LINES + [b"line %d" % i for i in range(25_000)]
    # No newline after the last line: it is still a message.
    done = run_process("--uri", uri, "publish", stream,
                       stdin=b"\n".join(lines))
    assert done.returncode == 0, done.stderr
    assert b"published 25,005 messages" in done.stderr
    done = run_process("tail", stream, "--from", "first", "--count", str(len(lines)),
                       "--format", "raw", env={"PYSTREAM_URI": uri})
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"".join(line + b"\n" for line in lines)


@pytest.mark.broker
def test_tail_ctrl_c_exits_quietly(modern_stream):
    process = subprocess.Popen(
        [sys.executable, "-m", "pystream.cli", "--uri", MODERN_URI, "tail",
         modern_stream],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default)
    try:
        assert process.stdout.readline().split()[0] == b"OFFSET"  # subscribed
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        assert process.stderr.read() == b""
    finally:
        process.kill()
        process.communicate()


def test_line_batches_send_slow_input_without_waiting_for_more():
    read, write = os.pipe()
    with open(read, "rb") as source, open(write, "wb", buffering=0) as sink:
        sink.write(b"a\nb\nunfinished")
        batches = cli.line_batches(source)
        started = time.monotonic()
        assert next(batches) == [b"a", b"b"]  # after the linger, input still open
        assert time.monotonic() - started < 2
        sink.write(b" line\n" + b"x\n" * 25_000)
        sink.close()
        rest = list(batches)
    assert rest[0][0] == b"unfinished line"
    assert sum(map(len, rest)) == 25_001
    assert max(map(len, rest)) == cli.PUBLISH_BATCH


# --- dump ---------------------------------------------------------------------

@pytest.mark.broker
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_dump_matches_a_direct_read(filled, tmp_path, capsys, suffix):
    target = tmp_path / f"out{suffix}"
    status, out, err = run(capsys, "--uri", MODERN_URI, "dump", filled,
                           "--to", str(target), "--columns", "application_properties")
    assert status == 0
    assert out == ""
    assert err.count("\n") == 1 and "30,000 records" in err  # no bar: not a TTY
    table = (pq.read_table(target) if suffix == ".parquet"
             else pa.ipc.open_file(target).read_all())
    expected = read_all(MODERN_URI, filled, 30_000, columns=["application_properties"])
    assert table.schema.names == ["offset", "chunk_timestamp", "body",
                                  "application_properties"]
    assert table["offset"].to_pylist() == list(range(30_000))
    assert table["body"].to_pylist() == expected["body"].to_pylist()
    assert (table["chunk_timestamp"].to_pylist()
            == expected["chunk_timestamp"].to_pylist())
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.broker
def test_dump_range_with_progress(filled, tmp_path, capsys):
    target = tmp_path / "part.arrow"
    status, _, err = run(capsys, "--uri", MODERN_URI, "dump", filled,
                         "--to", str(target), "--from", "15000",
                         "--to-offset", "25000", "--progress")
    assert status == 0
    assert "] 100%" in err and "10,000 records" in err
    table = pa.ipc.open_file(target).read_all()
    assert table["offset"].to_pylist() == list(range(15_000, 25_000))
    assert table["body"][0].as_py() == b"message 15000"

    # --to-offset beyond the end stops at the end; an empty range is a file too.
    for start, end, rows in (("29990", "99999999", 10), ("next", None, 0)):
        argv = ["--uri", MODERN_URI, "dump", filled, "--to", str(target),
                "--from", start]
        assert cli.main(argv + (["--to-offset", end] if end else [])) == 0
        assert pa.ipc.open_file(target).read_all().num_rows == rows


@pytest.mark.broker
def test_dump_from_last_is_the_last_chunk(filled, tmp_path, capsys):
    """--from last starts where a consumer at "last" does: the broker says
    where the last chunk begins (a probe answered before a later request),
    never a quiet second."""
    with pystream.connect(MODERN_URI) as client, \
            client.consumer(filled, offset="last", amqp=False) as consumer:
        first = consumer.read(1, timeout=10).column("offset")[0].as_py()
    assert 0 < first < 30_000
    target = tmp_path / "last.arrow"
    assert cli.main(["--uri", MODERN_URI, "dump", filled, "--to", str(target),
                     "--from", "last"]) == 0
    assert (pa.ipc.open_file(target).read_all()["offset"].to_pylist()
            == list(range(first, 30_000)))


@pytest.mark.broker
def test_interrupted_dump_leaves_no_file(filled, tmp_path, capsys, monkeypatch):
    def one_batch_then_ctrl_c(*args, **kwargs):
        yield from pystream.ranges.read_range(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.dump, "read_range", one_batch_then_ctrl_c)
    status, _, _ = run(capsys, "--uri", MODERN_URI, "dump", filled,
                       "--to", str(tmp_path / "out.parquet"))
    assert status == 130
    assert list(tmp_path.iterdir()) == []


def test_dump_usage_errors(capsys, tmp_path):
    status, _, err = run(capsys, "dump", "s", "--to", str(tmp_path / "out.csv"))
    assert status == 2 and ".parquet or .arrow" in err
    status, _, err = run(capsys, "dump", "s", "--to", "x.arrow", "--from", "yesterday")
    assert status == 2 and "ISO 8601" in err
    status, out, err = run(capsys, "dump", "s",
                           "--to", str(tmp_path / "no" / "x.arrow"))
    assert_one_line_error(status, out, err, "not a directory")


# --- TLS ----------------------------------------------------------------------

TLS_URI = f"rabbitmq-stream+tls://guest@localhost:{TLS_PORT}/"  # password: guest


@pytest.mark.broker
def test_tls_publish_tail_stats_dump(tls_dir, modern_stream, capsys,
                                     monkeypatch, tmp_path):
    """PLAIN over TLS, trusting the test CA; the TLS options also work after
    the command."""
    ca = ("--ca-file", str(tls_dir / "ca.pem"))
    publish(monkeypatch, capsys, TLS_URI, modern_stream, LINES, *ca)
    status, out, _ = run(capsys, "--uri", TLS_URI, *ca, "tail", modern_stream,
                         "--from", "first", "--count", str(len(LINES)),
                         "--format", "json")
    records = [json.loads(line) for line in out.splitlines()]
    assert status == 0
    assert [r["body"].encode() if "body" in r else base64.b64decode(r["body_base64"])
            for r in records] == LINES
    status, out, _ = run(capsys, "--uri", TLS_URI, *ca, "stats", modern_stream,
                         "--json")
    report = json.loads(out)
    assert (status, report["end_offset"]) == (0, len(LINES))
    assert report["leader"] == f"localhost:{TLS_PORT}"  # the TLS port, advertised
    target = tmp_path / "out.arrow"
    status, _, err = run(capsys, "--uri", TLS_URI, "dump", modern_stream,
                         "--to", str(target), *ca)
    assert status == 0, err
    assert pa.ipc.open_file(target).read_all()["body"].to_pylist() == LINES


@pytest.mark.broker
def test_tls_external_with_a_client_certificate(tls_dir, cert_user,
                                                modern_stream, capsys,
                                                monkeypatch):
    """The URI's user does not exist and has no password: EXTERNAL logs in
    as the certificate's CN."""
    uri = f"rabbitmq-stream+tls://nobody@localhost:{TLS_PORT}/"
    options = ("--ca-file", str(tls_dir / "ca.pem"),
               "--cert-file", str(tls_dir / "client.pem"),
               "--key-file", str(tls_dir / "client.key"),
               "--sasl-mechanism", "external")
    publish(monkeypatch, capsys, uri, modern_stream, [b"one", b"two"], *options)
    status, out, _ = run(capsys, "--uri", uri, *options, "tail", modern_stream,
                         "--from", "first", "--count", "2", "--format", "raw")
    assert (status, out) == (0, "one\ntwo\n")
    done = run_process("--uri", uri, *options, "stats", modern_stream, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["end_offset"] == 2
    # PLAIN as that user fails, so the certificate was what logged in.
    status, out, err = run(capsys, "--uri", uri, *options[:6], "stats",
                           modern_stream)
    assert_one_line_error(status, out, err, "refused user 'nobody'")


@pytest.mark.broker
def test_tls_wrong_ca_is_one_line(tls_dir, capsys):
    status, out, err = run(capsys, "--uri", TLS_URI, "--ca-file",
                           str(tls_dir / "wrong-ca.pem"), "stats", "s")
    assert_one_line_error(status, out, err, "certificate did not verify: "
                          "self-signed certificate in certificate chain "
                          "(give --ca-file the CA that signed it)")
    assert "ssl_context" not in err
    done = run_process("--uri", TLS_URI, "stats", "s")  # the system's CAs
    assert done.returncode == 1 and done.stderr.count(b"\n") == 1
    assert b"certificate did not verify" in done.stderr


@pytest.mark.broker
def test_tls_streams_from_the_https_management_api(tls_dir, modern_stream,
                                                   capsys):
    """A TLS URI reads the management API over HTTPS (15671), verified with
    --ca-file; a wrong CA is a one-line certificate error."""
    ca = str(tls_dir / "ca.pem")
    status, out, err = run(capsys, "--uri", TLS_URI, "--ca-file", ca,
                           "streams", "--json")
    assert status == 0, err
    assert modern_stream in [s["name"] for s in json.loads(out)]
    status, out, err = run(capsys, "--uri", TLS_URI, "--ca-file",
                           str(tls_dir / "wrong-ca.pem"), "streams")
    assert_one_line_error(status, out, err, "https://localhost:15671",
                          "certificate did not verify: self-signed",
                          "(give --ca-file the CA that signed it)")


def test_tls_settings_that_cannot_work_are_one_line(capsys, tmp_path):
    for argv, words in [
            (["--uri", "rabbitmq-stream://localhost:5552/", "--ca-file", "ca.pem"],
             "needs a rabbitmq-stream+tls:// URI"),
            (["--uri", TLS_URI, "--sasl-mechanism", "EXTERNAL"],
             "SASL EXTERNAL logs in as the name of the TLS client certificate"),
            (["--uri", TLS_URI, "--ca-file", str(tmp_path / "ca.pem")],
             f"cannot load the TLS CA file {tmp_path}/ca.pem: No such file"),
            (["--uri", TLS_URI, "--cert-file", str(tmp_path)],
             f"cannot load the TLS client certificate {tmp_path}")]:
        status, out, err = run(capsys, *argv, "stats", "s")
        assert_one_line_error(status, out, err, words)
    status, _, err = run(capsys, "--sasl-mechanism", "SCRAM", "stats", "s")
    assert status == 2 and "invalid choice: 'SCRAM'" in err


def test_external_refused_names_the_certificate():
    args = cli.build_parser().parse_args(
        ["--uri", EXTERNAL_URI, "--sasl-mechanism", "EXTERNAL", "stats", "s"])
    text = cli.describe(pystream.AuthenticationFailure("refused"), args)
    assert text == (f"authentication failed: {pystream.parse_uri(EXTERNAL_URI).uri()} "
                    f"refused the TLS client certificate (EXTERNAL logs in as "
                    f"its name: is that a broker user?)")


# --- passwords outside argv ----------------------------------------------------

class Terminal(io.StringIO):
    """stdin as a terminal (getpass itself is replaced: it reads /dev/tty)."""

    def isatty(self) -> bool:
        return True


def logged_in(status: int, out: str, err: str, stream: str) -> bool:
    """Whether ``stats STREAM`` of a missing stream got past the login."""
    if f"stream {stream!r} does not exist" in err:
        return True
    assert_one_line_error(status, out, err, "authentication failed")
    return False


@pytest.mark.broker
def test_password_from_a_file_the_environment_or_the_prompt(
        modern, stream_name, capsys, monkeypatch, tmp_path):
    """The URI names the user; the password comes from --password-file,
    $PYSTREAM_PASSWORD or getpass, never from argv. A wrong one in each
    place is refused (so it was read), the right one logs in."""
    address = pystream.parse_uri(MODERN_URI)
    uri = f"rabbitmq-stream://{address.username}@{address.host}:{address.port}/"
    stats = ("--uri", uri, "stats", stream_name)
    monkeypatch.delenv("PYSTREAM_PASSWORD", raising=False)
    secret = tmp_path / "password"
    for text, right in ((f"{address.password}\n", True), ("Wr0ng-file\n", False)):
        secret.write_text(text)
        result = run(capsys, *stats, "--password-file", str(secret))
        assert logged_in(*result, stream_name) is right
        assert "Wr0ng" not in result[2]

    monkeypatch.setenv("PYSTREAM_PASSWORD", "Wr0ng-env")
    assert not logged_in(*run(capsys, *stats), stream_name)
    monkeypatch.setenv("PYSTREAM_PASSWORD", address.password)
    assert logged_in(*run(capsys, *stats), stream_name)
    monkeypatch.delenv("PYSTREAM_PASSWORD")

    prompts: list[str] = []

    def getpass(prompt: str) -> str:
        prompts.append(prompt)
        return answer

    monkeypatch.setattr("getpass.getpass", getpass)
    answer = "Wr0ng-typed"
    monkeypatch.setattr(sys, "stdin", Terminal())
    assert not logged_in(*run(capsys, *stats), stream_name)  # by itself on a TTY
    answer = address.password
    assert logged_in(*run(capsys, *stats), stream_name)
    assert prompts == [f"password for {pystream.parse_uri(uri).uri()}: "] * 2
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a TTY: no prompt
    assert logged_in(*run(capsys, *stats), stream_name)  # the default, guest
    assert len(prompts) == 2
    answer = "Wr0ng-asked"
    assert not logged_in(*run(capsys, *stats, "--password-prompt"), stream_name)
    assert len(prompts) == 3


def test_password_options_that_conflict_are_usage_errors(capsys, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("S3cret\n")
    for argv, words in [
            (["--uri", "rabbitmq-stream://guest:guest@localhost:1/",
              "--password-file", str(secret)], "the URI holds a password"),
            (["--password-file", str(secret), "--password-prompt"], "not both"),
            (["--uri", "rabbitmq-stream+tls://localhost:1/", "--cert-file", "c.pem",
              "--sasl-mechanism", "EXTERNAL", "--password-prompt"], "EXTERNAL")]:
        status, out, err = run(capsys, *argv, "stats", "s")
        assert status == 2 and words in err, err
        assert "S3cret" not in err
    status, out, err = run(capsys, "--uri", "rabbitmq-stream://guest@localhost:1/",
                           "--password-file", str(tmp_path / "none"), "stats", "s")
    assert_one_line_error(status, out, err, "No such file", str(tmp_path / "none"))


# --- the management API's Basic auth --------------------------------------------

class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET as ``answer`` says, and records the Authorization
    header it came with."""

    seen: list[str | None]
    answer: tuple[int, dict[str, str], bytes]

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        code, headers, body = self.answer
        self.send_response(code)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_server(code: int, headers: dict[str, str], body: bytes = b""):
    handler = type("Handler", (Recorder,), {"seen": [], "answer": (code, headers, body)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


def test_streams_does_not_follow_a_redirect_with_the_password(capsys):
    """A management URL that redirects (here to another port, as it could to
    another host) is an error: the Authorization header goes nowhere else."""
    uri = "rabbitmq-stream://guest:S3cret@localhost/"
    with http_server(200, {"Content-Type": "application/json"}, b"[]") as (target, reached):
        with http_server(302, {"Location": f"{target}/api/queues/%2F"}) as (url, asked):
            status, out, err = run(capsys, "--uri", uri, "streams",
                                   "--management-url", url)
    assert_one_line_error(status, out, err, "redirected (302)", target, "not followed")
    assert len(asked) == 1 and reached == []
    assert "S3cret" not in err


def test_streams_sends_no_password_over_plain_http_to_another_host(capsys, monkeypatch):
    """Basic auth over http:// goes to this machine only, unless
    --allow-plain-http: refused before any request."""
    requests: list[str] = []

    def open_(self, request, *args, **kwargs):
        requests.append(request.full_url)
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", open_)
    remote = "rabbitmq-stream://guest:S3cret@broker.example.com/"
    for argv in (["--uri", remote, "streams"],
                 ["streams", "--management-url", "http://broker.example.com:15672"]):
        status, out, err = run(capsys, *argv)
        assert status == 2 and "plain http" in err and "--allow-plain-http" in err, err
        assert "S3cret" not in err
    assert requests == []
    for argv in (["--uri", remote, "streams", "--allow-plain-http"],
                 ["--uri", remote, "streams", "--management-url",
                  "https://broker.example.com:15671"],
                 ["--uri", "rabbitmq-stream://guest:S3cret@127.0.0.2/", "streams"]):
        status, out, err = run(capsys, *argv)
        assert_one_line_error(status, out, err, "cannot reach the management API")
    assert requests == [
        "http://broker.example.com:15672/api/queues/%2F?columns=name,type,messages,"
        "message_bytes,segments",
        "https://broker.example.com:15671/api/queues/%2F?columns=name,type,messages,"
        "message_bytes,segments",
        "http://127.0.0.2:15672/api/queues/%2F?columns=name,type,messages,"
        "message_bytes,segments"]


# --- errors -------------------------------------------------------------------

@pytest.mark.broker
def test_wrong_password_is_one_line_without_the_password(capsys):
    bad = brokers.MODERN.uri("guest:N0tThePassw0rd@")
    status, out, err = run(capsys, "--uri", bad, "stats", "anything")
    assert_one_line_error(status, out, err, "authentication failed", "'guest'")
    assert "N0tThePassw0rd" not in out + err

    done = run_process("stats", "anything", env={"PYSTREAM_URI": bad})
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.startswith(b"pystream: error: authentication failed")
    assert done.stderr.count(b"\n") == 1 and b"Traceback" not in done.stderr
    assert b"N0tThePassw0rd" not in done.stderr


@pytest.mark.broker
@pytest.mark.parametrize("argv", [
    ["tail", "{}", "--from", "first"], ["dump", "{}", "--to", "{}.arrow"],
    ["stats", "{}"], ["delete", "{}"], ["publish", "{}"]])
def test_missing_stream_is_one_line(modern, stream_name, capsys, tmp_path,
                                    monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    argv = [a.format(stream_name) for a in argv]
    status, out, err = run(capsys, "--uri", MODERN_URI, *argv)
    assert_one_line_error(status, out, err, f"stream {stream_name!r} does not exist")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_broker_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("PYSTREAM_URI", "rabbitmq-stream://guest:guest@localhost:1/")
    status, out, err = run(capsys, "tail", "s")
    assert_one_line_error(status, out, err, "cannot connect", "localhost:1",
                          "Connection refused")
    status, out, err = run(capsys, "stats", "s", "--uri",
                           "rabbitmq-stream://guest:guest@no-such-host.invalid/")
    assert_one_line_error(status, out, err, "no-such-host.invalid")


@pytest.mark.broker
def test_debug_shows_the_traceback(modern, stream_name, capsys):
    with pytest.raises(pystream.StreamDoesNotExist):
        cli.main(["--uri", MODERN_URI, "stats", stream_name, "--debug"])


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "--uri", "http://localhost/", "stats", "s")[0] == 2
    assert run(capsys, "create", "s", "--max-age", "a week")[0] == 2
    assert run(capsys, "tail", "s", "--columns", "body")[0] == 2
    assert run(capsys, "tail", "s", "--count", "0")[0] == 2
    assert run(capsys)[0] == 2
    status, out, _ = run(capsys, "--help")
    assert status == 0 and "publish" in out


def test_version_is_the_package_version_and_says_what_the_build_has(capsys):
    status, out, _ = run(capsys, "--version")
    info = pystream.build_info()
    assert status == 0 and out.strip() == (
        f"pystream {pystream.__version__} (CRC-32: {info.crc}; codecs: "
        f"{' '.join(info.codecs)})")


def test_start_spec():
    assert cli.start_spec("first") == "first"
    assert cli.start_spec("42") == 42
    when = cli.start_spec("2024-05-01T12:00:00Z")
    assert when == dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
    assert cli.start_spec("2024-05-01T12:00:00").tzinfo is not None  # local time


