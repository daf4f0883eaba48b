"""Data source options as Spark passes them (strings, any case), shared by
the source and the sink: the broker, typed values, and the spellings of the
JVM connector (``rabbitmq_streams``) accepted beside ours."""

from __future__ import annotations

from typing import Any

from .ranges import BrokerRef

#: The JVM connector's spelling -> ours (lower case, as options are compared).
ALIASES = {
    "maxrecordspertrigger": "maxoffsetspertrigger",
    "superstreams": "superstream",
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
                     opts.get("passwordenv", "PYSTREAM_PASSWORD"),
                     opts.get("passwordfile"),
                     ca_file=opts.get("tlscafile"),
                     cert_file=opts.get("tlscertfile"),
                     key_file=opts.get("tlskeyfile"),
                     sasl_mechanism=opts.get("saslmechanism", "PLAIN").upper())


def int_option(opts: dict, key: str, minimum: int) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        raise ValueError(f"option {key} must be an integer, not {opts[key]!r}") from None
    if value < minimum:
        raise ValueError(f"option {key} must be >= {minimum}, not {value}")
    return value


def bool_option(opts: dict, key: str, default: bool) -> bool:
    value = opts.get(key, str(default)).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {key} must be true or false, not {value!r}")
    return value == "true"
