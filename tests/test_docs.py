"""The documentation site builds without a warning and renders in a browser.

``mkdocs build --strict`` fails on a broken link or anchor, a reference that
does not resolve, and (docs/hooks.py) a public name without a docstring or
missing from the API reference. The built site is served on 127.0.0.1 and
three pages are opened in headless Chromium (Debian's ``chromium``,
csrc/DEPENDENCIES): each must show its headings and code blocks once its
scripts ran, and a screenshot of each is kept in tests/output/docs/
(git-ignored) for a person to look at. The examples on the pages are run
by tests/test_readme.py.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading

import pytest

from .conftest import ROOT

SCREENSHOTS = ROOT / "tests" / "output" / "docs"
# page: (headings it must show, code blocks it must have at least)
PAGES = {
    "": ({"pystream", "Where to go"}, 1),
    "reference/pystream/": ({"pystream", "Connecting", "pystream.connect", "pystream.Client",
                             "pystream.Consumer", "pystream.Producer", "pystream.decode"}, 10),
    "spark/": ({"Spark", "Writing to streams", "Pushed-down filters",
                "DuckDB and Polars, without Spark"}, 6),
}

pytestmark = pytest.mark.slow


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_a_docstring_and_a_reference_entry():
    hooks = load_hooks()
    assert not hooks.missing_docstrings()
    assert not hooks.unreferenced(ROOT / "docs" / "reference")
    assert "pystream.connect" in hooks.public_objects()


class Page(html.parser.HTMLParser):
    """The headings' text and the code blocks of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.code_blocks = 0
        self._heading: list[str] | None = None
        self._pre = False

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3"):
            self._heading = []
        elif tag == "pre":
            self._pre = True
        elif tag == "code" and self._pre:
            self.code_blocks += 1
            self._pre = False

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._heading is not None:
            # the permalink's "¶" is not part of the title
            self.headings.append("".join(self._heading).replace("¶", "").strip())
            self._heading = None
        elif tag == "pre":
            self._pre = False

    def handle_data(self, data):
        if self._heading is not None:
            self._heading.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "--site-dir", str(out)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()
    thread.join()


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium is missing: scripts/install-deps installs it"
    # --no-sandbox: the tests run as root, where Chromium's sandbox refuses
    # to start. The browser resolves no host name but the loopback server's
    # address and runs none of its background services, so it sends nothing
    # beyond this machine.
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--hide-scrollbars",
                           "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                           "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--disable-default-apps", "--no-first-run",
                           "--no-pings", "--disable-domain-reliability",
                           f"--user-data-dir={tmp_path / 'chromium'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", PAGES)
def test_page_renders_in_chromium(path, served, tmp_path):
    url = served + path
    dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)
    headings, blocks = PAGES[path]
    # an API entry's heading ends with its kind ("function", "class")
    shown = [" ".join(h.split()) for h in page.headings]
    missing = [h for h in headings if not any(s == h or s.startswith(h + " ") for s in shown)]
    assert not missing, (url, missing, shown)
    assert page.code_blocks >= blocks, (url, page.code_blocks)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{path.strip('/').replace('/', '-') or 'index'}.png"
    shot.unlink(missing_ok=True)
    result = chromium(tmp_path, "--window-size=1280,1600", f"--screenshot={shot}", url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a page, not a blank
