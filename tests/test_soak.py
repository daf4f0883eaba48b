"""A short soak in every test run (make soak runs the 10-minute one): a
producer and a consumer at a fixed rate while the modern broker closes
their connections, is paused past the heartbeat and is restarted."""

from __future__ import annotations

import os

import pytest

from .soak import FAULTS, Soak

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_every_confirmed_record_consumed_once_in_order_across_faults():
    seconds = float(os.environ.get("PYSTREAM_SOAK_SECONDS", 80))
    report = Soak(seconds, rate=5000, fault_every=20).run()
    print(report.summary())
    assert [f.kind for f in report.faults][:3] == list(FAULTS)
    assert report.published > 0.9 * seconds * 5000
    assert report.confirmed == report.published
    assert report.lost == 0
    assert report.duplicates == 0
    assert report.out_of_order == 0
    assert report.body_mismatches == 0
    assert report.consumed == report.published
    assert (report.first_offset, report.last_offset) == (0, report.published - 1)
    assert report.crc32_consumed == report.crc32_expected
    for fault in report.faults:
        assert fault.producer_recovery is not None, fault
        assert fault.consumer_recovery is not None, fault
        # Each fault cost both of them their connection.
        assert fault.producer_reconnections >= 1, fault
        assert fault.consumer_resubscriptions >= 1, fault
