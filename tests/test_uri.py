import pytest

from pystream import parse_uri
from pystream.errors import UnsupportedFeature
from pystream.features import Features, parse_version


def test_defaults():
    a = parse_uri("rabbitmq-stream://")
    assert (a.host, a.port, a.username, a.password, a.virtual_host, a.tls) == (
        "localhost", 5552, "guest", "guest", "/", False)
    assert parse_uri("rabbitmq-stream+tls://h").port == 5551


def test_full_uri_with_percent_encoding():
    a = parse_uri("rabbitmq-stream+tls://us%40er:p%3Ass%2Fw@broker.example:6000/my%2Fvhost")
    assert a.username == "us@er"
    assert a.password == "p:ss/w"
    assert a.host == "broker.example"
    assert a.port == 6000
    assert a.virtual_host == "my/vhost"
    assert a.tls


def test_ipv6_and_default_vhost_escape():
    a = parse_uri("rabbitmq-stream://[::1]:5552/%2F")
    assert a.host == "::1" and a.virtual_host == "/"
    assert a.uri() == "rabbitmq-stream://guest@[::1]:5552/"


def test_password_is_never_shown():
    a = parse_uri("rabbitmq-stream://u:sekret@h/v")
    assert "sekret" not in repr(a)
    assert "sekret" not in a.uri()


@pytest.mark.broker
@pytest.mark.parametrize("uri, part", [
    ("amqp://localhost", "scheme"),
    ("rabbitmq-stream://h:notaport/", "port"),
    ("rabbitmq-stream://h:99999/", "port"),
    ("rabbitmq-stream://h:0/", "port"),
    ("rabbitmq-stream://h/a/b", "virtual host"),
    ("rabbitmq-stream://h/%ff", "virtual host"),
    ("rabbitmq-stream://h/?x=1", "query"),
])
def test_bad_uris_name_the_part(uri, part):
    with pytest.raises(ValueError, match=part):
        parse_uri(uri)


def test_bad_uri_error_does_not_echo_password():
    with pytest.raises(ValueError) as info:
        parse_uri("rabbitmq-stream://u:sekret@h:bad/")
    assert "sekret" not in str(info.value)


@pytest.mark.parametrize("text, version", [
    ("3.10.8", (3, 10, 8)), ("4.0.5", (4, 0, 5)), ("4.1.0-beta.2", (4, 1, 0)),
    ("3.13.7+1.g4c9a5e1", (3, 13, 7)), ("", (0,)), ("unknown", (0,)),
])
def test_parse_version(text, version):
    assert parse_version(text) == version


def test_feature_gates():
    old, new = Features("3.10.8"), Features("4.0.5")
    for feature in ("exchange_command_versions", "stream_stats",
                    "single_active_consumer", "super_stream_commands",
                    "filtering"):
        assert not old.supports(feature)
        assert new.supports(feature)
        with pytest.raises(UnsupportedFeature, match="3.10.8"):
            old.require(feature)
    assert not new.supports("resolve_offset_spec")
