"""No server: key parsing, header storage, replay building, SQLSTATE classes, configuration."""

import json

import psycopg
import pytest

import idempotency
from idempotency import core
from idempotency.keys import InvalidKey, parse_key


@pytest.mark.parametrize(
    "header, key",
    [
        ('"abc"', "abc"),
        ('"a\\"b"', 'a"b'),
        ('"a\\\\b"', "a\\b"),
        ('"with space and ; , = ?"', "with space and ; , = ?"),
        ("abc", "abc"),
        ("550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"),
        ("order:42/retry.1", "order:42/retry.1"),
        ("  padded\t", "padded"),
        ("x" * 255, "x" * 255),
        ('"' + "y" * 255 + '"', "y" * 255),
        ('"' + "\\\\" * 255 + '"', "\\" * 255),
    ],
)
def test_accepted_keys(header, key):
    assert parse_key(header) == key


@pytest.mark.parametrize(
    "header, title",
    [
        (None, "missing"),
        ("", "empty"),
        ('""', "empty"),
        ("   ", "empty"),
        ("x" * 256, "too long"),
        ('"' + "y" * 256 + '"', "too long"),
        ('"' + "\\\\" * 256 + '"', "too long"),
        ("two words", "malformed"),
        ("semi;colon", "malformed"),
        ('"unterminated', "malformed"),
        ('"trailing"x', "malformed"),
        ('"bad \\n escape"', "malformed"),
        ('"tab\tinside"', "malformed"),
        ('"caf\u00e9"', "malformed"),
        ("caf\u00e9", "malformed"),
        ('"nul\x00"', "malformed"),
        ("a,b", "malformed"),
    ],
)
def test_rejected_keys(header, title):
    with pytest.raises(InvalidKey) as e:
        parse_key(header)
    assert title in e.value.title


def test_max_bytes_is_configurable():
    assert parse_key("abcd", max_bytes=4) == "abcd"
    with pytest.raises(InvalidKey):
        parse_key("abcde", max_bytes=4)


def test_stored_headers_drop_hop_by_hop_and_group_repeats():
    stored = core.stored_headers([
        ("Content-Type", "application/json"), ("Content-Length", "3"), ("Date", "x"),
        ("Connection", "close"), ("Transfer-Encoding", "chunked"), ("Set-Cookie", "a=1"),
        ("set-cookie", "b=2"), ("X-One", "1"), ("Keep-Alive", "5"), ("Upgrade", "h2c"),
    ])
    assert stored == {"Content-Type": "application/json", "Set-Cookie": ["a=1", "b=2"], "X-One": "1"}


def test_replay_response_is_exact_and_marked():
    claim = core.Claim("replay", response_code=201, response_body=b"\x00\xffbytes",
                       response_headers={"Content-Type": "image/x", "Set-Cookie": ["a=1", "b=2"]})
    r = core.replay_response(claim)
    assert (r.status, r.body) == (201, b"\x00\xffbytes")
    assert r.headers == [("Content-Type", "image/x"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
                         ("Idempotent-Replayed", "true")]


def test_replay_of_a_jsonb_only_answer():
    r = core.replay_response(core.Claim("replay", response={"a": 1}, response_code=200))
    assert json.loads(r.body) == {"a": 1} and r.header("Content-Type") == "application/json"


def test_answers():
    cfg = idempotency.Config(policy_url="https://api.example/keys")
    r = core.answer(cfg, core.Claim("in_progress", retry_after=0.2))
    assert r.status == 409 and r.header("Retry-After") == "1"
    assert core.answer(cfg, core.Claim("in_progress", retry_after=29.01)).header("Retry-After") == "30"
    r = core.answer(cfg, core.Claim("mismatch", response_body=b"secret", response_code=201))
    assert r.status == 422 and b"secret" not in r.body
    doc = json.loads(r.body)
    assert doc["type"] == "https://api.example/keys" and doc["status"] == 422 and doc["title"] and doc["detail"]
    assert r.header("Content-Type") == "application/problem+json"


def _err(sqlstate, message="x"):
    cls = psycopg.errors.lookup(sqlstate)
    return cls(message)


@pytest.mark.parametrize(
    "state, status",
    [("22001", 400), ("22023", 400), ("22P02", 400), ("54000", 413), ("40001", 503), ("40P01", 503),
     ("08006", 503), ("57P01", 503), ("42501", 500), ("P0002", 500), ("23505", 500)],
)
def test_sqlstates_to_http(state, status):
    r = core.error_response(idempotency.Config(), _err(state))
    assert r.status == status
    if status == 503:
        assert r.header("Retry-After") == "1"


def test_retry_classes():
    assert core.classify(_err("40001")) == core.RETRY
    assert core.classify(_err("XX000", "cannot execute a distributed query from a query on a shard")) == core.RETRY
    assert core.classify(_err("XX000", "some other internal error")) == core.OTHER
    assert core.classify(psycopg.OperationalError("connection lost")) == core.UNAVAILABLE
    assert core.classify(RuntimeError()) == core.OTHER


def test_config_from_env_and_policy():
    cfg = idempotency.Config.from_env({"IDEM_MODE": "two_phase", "IDEM_STORE_ERRORS": "1", "IDEM_WAIT_MS": "250",
                                        "IDEM_LEASE_SECONDS": "7", "IDEM_TTL_SECONDS": "600"})
    assert (cfg.mode, cfg.store_errors, cfg.wait_ms, cfg.lease_seconds, cfg.ttl_seconds) == ("two_phase", True, 250, 7.0, 600)
    assert cfg.policy() == {"header": "Idempotency-Key", "required_for": ["POST", "PATCH"], "max_length": 255, "ttl_seconds": 600}
    assert idempotency.Config.from_env({}).policy()["ttl_seconds"] == 86400
    with pytest.raises(ValueError):
        idempotency.Config(mode="twophase")
    with pytest.raises(ValueError):
        idempotency.Config(wait_ms=-1)


def test_fingerprint_inputs():
    req = lambda body, ctype="application/json", method="POST", path="/p": core.Request(method, path, [("Content-Type", ctype)], body)  # noqa: E731
    assert core.is_json(req(b'{"a": 1}')) and core.is_json(req(b"[1]", "application/problem+json"))
    assert not core.is_json(req(b"{not json")) and not core.is_json(req(b'{"a": 1}', "text/plain"))
    fp = core.bytes_fingerprint
    assert fp(req(b"x")) == fp(req(b"x"))
    assert len({fp(req(b"x")), fp(req(b"x", method="PATCH")), fp(req(b"x", path="/q")), fp(req(b"y"))}) == 4
    # length-prefixed: moving a byte from the path into the body changes the fingerprint
    assert fp(req(b"ab", path="/p")) != fp(req(b"b", path="/pa"))
    sql, params = core.claim_params(idempotency.Config(), req(b'{"a": 1}'), "k", "")
    assert "request_fingerprint(jsonb_build_array(%(method)s::text, %(path)s::text, %(body)s::jsonb))" in sql
    sql, params = core.claim_params(idempotency.Config(), req(b"raw", "application/octet-stream"), "k", "")
    assert "%(fingerprint)s::bytea" in sql and params["fingerprint"] == fp(req(b"raw", "application/octet-stream"))
    sql, params = core.claim_params(idempotency.Config(fingerprint=lambda r: b"mine"), req(b'{"a": 1}'), "k", "")
    assert params["fingerprint"] == b"mine"


def test_every_statement_is_schema_qualified_and_typed():
    for sql in (core.CLAIM_SQL, core.CLAIM_JSON_SQL, core.COMPLETE_SQL, core.RELEASE_SQL, core.CHECKPOINT_SQL):
        assert "idempotency." in sql
        import re
        for placeholder in re.findall(r"%\(\w+\)s(::\w+)?", sql):
            assert placeholder, f"an untyped parameter in {sql}"
