"""scripts/capture-golden makes captures the golden tests accept, from each
test broker, written by rbfly, rstream and pika."""

import json

import pytest

from .capture_golden import CODEC_NAMES, URIS, capture
from .test_core_decode import check_capture

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("broker", sorted(URIS))
def test_a_new_capture_passes_the_golden_checks(broker, tmp_path):
    folder = capture(URIS[broker], tmp_path)
    expected = json.loads((folder / "expected.json").read_text())
    kinds = {r["kind"] for r in expected["records"]}
    assert kinds == {"amqp-data", "raw", "amqp091",
                     *(f"sub-batch-{n}" for n in CODEC_NAMES)}
    assert expected["deliver_version"] == (1 if broker == "legacy" else 2)
    for body in ("view", "binary"):
        check_capture((folder / "frames.bin").read_bytes(), expected["records"],
                      body)
