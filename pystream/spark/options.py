"""Data source options as Spark passes them (strings, any case), shared by
the source and the sink: the broker, typed values, and the spellings of the
JVM connector (``rabbitmq_streams``) accepted beside ours."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..ranges import DEFAULT_PASSWORD_ENV, BrokerRef
from ..records import Filter

#: The JVM connector's spelling -> ours (lower case, as options are compared).
ALIASES = {
    "maxrecordspertrigger": "maxoffsetspertrigger",
    # the Java stream client's name for sub-entry batching
    "subentrysize": "subbatchsize",
}


def normalize(options: Any) -> dict[str, str]:
    """Lower-cased keys, the JVM connector's spellings renamed to ours (both
    spellings of one option at once is refused: which one would win?)."""
    opts: dict[str, str] = {}
    for key, value in dict(options).items():
        key = str(key).lower()
        ours = ALIASES.get(key, key)
        if ours in opts:
            raise ValueError(f"option {key} is another spelling of {ours}: give one")
        opts[ours] = str(value)
    return opts


def broker_ref(opts: dict[str, str]) -> BrokerRef:
    """The broker of normalized options; no password may travel with them."""
    if "password" in opts:
        raise ValueError("the 'password' option would travel with the plan "
                         "to every executor: use passwordEnv or passwordFile")
    return BrokerRef(opts.get("uri", "rabbitmq-stream://localhost:5552/"),
                     opts.get("passwordenv", DEFAULT_PASSWORD_ENV),
                     opts.get("passwordfile"),
                     ca_file=opts.get("tlscafile"),
                     cert_file=opts.get("tlscertfile"),
                     key_file=opts.get("tlskeyfile"),
                     sasl_mechanism=opts.get("saslmechanism", "PLAIN").upper())


def int_option(opts: dict[str, str], key: str, minimum: int) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        raise ValueError(f"option {key} must be an integer, not {opts[key]!r}") from None
    if value < minimum:
        raise ValueError(f"option {key} must be >= {minimum}, not {value}")
    return value


def bool_option(opts: dict[str, str], key: str, default: bool) -> bool:
    value = opts.get(key, str(default)).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {key} must be true or false, not {value!r}")
    return value == "true"


class PropertyIn:
    """The client post-filter of ``filterProperty``: rows whose application
    property is one of ``values`` (or, with ``match_unfiltered``, missing)."""

    def __init__(self, name: str, values: tuple[str, ...], match_unfiltered: bool) -> None:
        self.name, self.values, self.match_unfiltered = name, values, match_unfiltered

    def __call__(self, batch: pa.RecordBatch) -> pa.Array[Any]:
        found = pc.map_lookup(batch.column("application_properties"),
                              pa.scalar(self.name), "first")
        keep = pc.is_in(found, pa.array(self.values, pa.string()))
        if self.match_unfiltered:
            keep = pc.or_kleene(keep, pc.is_null(found))
        kept: pa.Array[Any] = keep.fill_null(False)
        return kept


def source_filter(opts: dict[str, str]) -> Filter | None:
    """The broker-side filter of ``filterValues`` (comma-separated),
    ``filterMatchUnfiltered`` and the post-filter of ``filterProperty``."""
    keys = ("filtervalues", "filtermatchunfiltered", "filterproperty")
    if "filtervalues" not in opts:
        if any(k in opts for k in keys):
            raise ValueError("filterMatchUnfiltered and filterProperty refine "
                             "filterValues: give it too")
        return None
    values = tuple(v.strip() for v in opts["filtervalues"].split(",") if v.strip())
    if not values:
        raise ValueError("option filterValues names no value")
    unfiltered = bool_option(opts, "filtermatchunfiltered", False)
    prop = opts.get("filterproperty")
    return Filter(values, unfiltered,
                  PropertyIn(prop, values, unfiltered) if prop else None)
