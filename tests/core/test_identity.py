"""Identities: keyed with the deployment secret, hashed whole, cached in bounded memory,
redacted so that enough stays hidden, and named by a stable key id."""

from __future__ import annotations

import copy
import gc
import hashlib
import hmac
import logging
import os
import pickle
import re
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tokenfuse import ConfigurationError, Fuse, Identity, MemoryStore, VelocityPolicy
from tokenfuse import _secret as secret_module
from tokenfuse._identity import redact
from tokenfuse._secret import FALLBACK_SECRET, SECRET_ENV

SECRET = "a-test-deployment-secret-0123456789"
ROOT = Path(__file__).resolve().parents[2]


class SharedStore:
    """A store the fuse cannot know to be private (as RedisStore): it must derive keys that
    other processes derive too. Keeps its state in a MemoryStore it delegates to."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.fixture(autouse=True)
def no_secret_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)


@pytest.fixture
def fallback_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-arm the once-per-process warning about the public fallback."""
    monkeypatch.setattr(secret_module, "_warned_fallback", False)


def only_store_key(store: MemoryStore) -> str:
    [key] = list(store._entries)
    return key


# -- the keyed hash and where its secret comes from --------------------------------------------


def test_the_store_key_is_an_hmac_of_the_whole_value_under_the_secret() -> None:
    store = MemoryStore()
    fuse = Fuse(store, secret=SECRET)
    fuse.record(Identity.secret("sk-proj-0123456789abcdef"), 10)

    inner = hashlib.sha256(b"secret\x00sk-proj-0123456789abcdef").digest()
    expected = hmac.new(SECRET.encode(), inner, "sha256").hexdigest()[:32]
    assert only_store_key(store) == f"default:{expected}"
    assert fuse.key_id(Identity.secret("sk-proj-0123456789abcdef")) == expected[:12]


def test_fuses_with_the_same_secret_agree_and_other_secrets_do_not() -> None:
    who = Identity.secret("sk-proj-0123456789abcdef")
    one, two = Fuse(secret=SECRET), Fuse(secret=SECRET)
    other = Fuse(secret=SECRET + "-rotated")

    assert one.key_id(who) == two.key_id(who)
    assert other.key_id(who) != one.key_id(who)
    assert one._key(who) == two._key(who) != other._key(who)
    assert re.fullmatch(r"[0-9a-f]{12}", one.key_id(who))


def test_names_credentials_and_clients_of_the_same_text_are_different_identities() -> None:
    fuse = Fuse(secret=SECRET)
    ids = {fuse.key_id(who) for who in (Identity.named("10.0.0.1"),
                                         Identity.secret("10.0.0.1"),
                                         Identity.client("10.0.0.1"))}  # fmt: skip
    assert len(ids) == 3


def test_the_environment_secret_is_used_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    who = Identity.named("agent-42")

    assert Fuse().key_id(who) == Fuse(secret=SECRET).key_id(who)
    assert Fuse(SharedStore()).key_id(who) == Fuse(secret=SECRET).key_id(who)
    assert who.key_id == Fuse(secret=SECRET).key_id(who)
    assert Fuse(secret=SECRET + "!").key_id(who) != who.key_id  # an explicit secret wins


def test_a_memory_store_without_a_secret_uses_a_random_one_per_process() -> None:
    who = Identity.named("agent-42")
    fuse = Fuse()

    assert fuse.key_id(who) == who.key_id  # the process's own secret
    assert fuse.key_id(who) != Fuse(secret=FALLBACK_SECRET).key_id(who)


def test_a_shared_store_without_a_secret_uses_the_public_fallback_and_warns_once(
    caplog: pytest.LogCaptureFixture, fallback_warning: None
) -> None:
    who = Identity.named("agent-42")
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        first, second = Fuse(SharedStore()), Fuse(SharedStore())

    assert first.key_id(who) == second.key_id(who) == Fuse(secret=FALLBACK_SECRET).key_id(who)
    [warning] = [r for r in caplog.records if "deployment secret" in r.getMessage()]
    assert SECRET_ENV in warning.getMessage()


def test_a_shared_store_with_a_secret_does_not_warn(
    caplog: pytest.LogCaptureFixture, fallback_warning: None
) -> None:
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        Fuse(SharedStore(), secret=SECRET)
    assert "deployment secret" not in caplog.text


@pytest.mark.parametrize("bad", ["", "short", b"15-bytes-secret"], ids=["empty", "5", "15"])
def test_short_secrets_are_refused_at_construction(bad: str | bytes) -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Fuse(secret=bad)


def test_a_secret_must_be_text_or_bytes() -> None:
    with pytest.raises(ConfigurationError, match="str or bytes, not int"):
        Fuse(secret=12345678901234567890)  # type: ignore[arg-type]


def test_a_short_environment_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "too-short")
    with pytest.raises(ConfigurationError, match=SECRET_ENV):
        Fuse()


def _key_id_in_a_new_process(env: dict[str, str]) -> str:
    code = "from tokenfuse import Fuse; print(Fuse().key_id('agent-42'))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFUSE_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(ROOT / "src"), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.strip()


def test_key_ids_are_stable_across_processes_sharing_a_secret() -> None:
    assert _key_id_in_a_new_process({SECRET_ENV: SECRET}) == Fuse(secret=SECRET).key_id("agent-42")
    # Per-process secrets: nothing to agree on, and nothing for a reader of the id to guess.
    assert _key_id_in_a_new_process({}) != Fuse().key_id("agent-42")


# -- whole values, bounded caches --------------------------------------------------------------


def test_long_tokens_with_a_common_prefix_are_different_identities() -> None:
    header = "eyJhbGciOiJSUzI1NiJ9." + "x" * 600  # JWTs of one issuer share a long prefix
    one, two = Identity.secret(header + ".signature-one"), Identity.secret(header + ".sig-two")
    fuse = Fuse(secret=SECRET)

    assert one != two
    assert fuse._key(one) != fuse._key(two)
    fuse.record(one, 100)
    assert fuse.status(two).rate == 0


def test_huge_names_are_hashed_whole_and_labelled_short() -> None:
    huge = "n" * 1_000_000
    assert Identity.named(huge) != Identity.named(huge + "!")
    assert Identity.named(huge).label == "n" * 64


def test_identity_caches_stay_bounded_under_a_flood_of_huge_names() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(200):
            Identity.named(f"{n:03d}" + "x" * 1_000_000)  # 200 one-MB names, as in the report
            Identity.secret(f"{n:03d}" + "k" * 1_000_000)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 2_000_000  # was 400 MB when the caches kept whole values


def test_cached_identities_are_reused() -> None:
    assert Identity.named("agent-42") is Identity.named("agent-42")
    assert Identity.secret("sk-" + "j" * 1_000) is Identity.secret("sk-" + "j" * 1_000)


def test_the_credential_cache_keeps_no_credential() -> None:
    """Credentials are cached under a keyed hash: neither the cache's keys nor its identities
    hold the credential (a heap dump of a long-running agent shows none of its API keys)."""
    from tokenfuse import _identity

    credential = "sk-proj-" + uuid.uuid4().hex + uuid.uuid4().hex
    identity = Identity.secret(credential)
    assert Identity.secret(credential) is identity  # cached
    cache = _identity._secrets
    assert identity in cache.values()
    for key, cached in cache.items():
        assert isinstance(key, bytes) and len(key) == 16
        assert credential.encode() not in key and credential not in cached.label


def test_the_credential_cache_stays_bounded_under_churn() -> None:
    from tokenfuse import _identity

    for n in range(_identity._SECRETS_CACHED * 2 + 10):
        Identity.secret(f"sk-churn-{n:08d}-0123456789abcdef")
    assert len(_identity._secrets) <= _identity._SECRETS_CACHED
    assert Identity.secret("sk-churn-00000001-0123456789abcdef") == Identity.secret(
        "sk-churn-00000001-0123456789abcdef"
    )


# -- what an identity shows and what it never does ---------------------------------------------


@pytest.mark.parametrize(
    ("secret", "label"),
    [
        pytest.param("sk-proj-0123456789abcdef", "sk-…cdef", id="openai"),
        pytest.param("sk-ant-api03-zzzzzzzzzzzz9876", "sk-…9876", id="anthropic"),
        pytest.param("AIzaSyD0123456789xyzw", "AIz…xyzw", id="gemini"),
        pytest.param("AIzaSyA-1234567890", "AIz…", id="gemini-short-no-tail"),
        pytest.param("k-123456789012", "k-…", id="prefix-only"),
        pytest.param("123456", "…", id="six-digits-nothing"),
        pytest.param("short", "…", id="short"),
        pytest.param("  ", "(empty)", id="blank"),
        pytest.param("", "(empty)", id="empty"),
    ],
)
def test_secrets_are_redacted(secret: str, label: str) -> None:
    assert Identity.secret(secret).label == label
    assert redact(secret) == label


@pytest.mark.parametrize("head", ["", "sk-", "key-"], ids=["plain", "sk", "key"])
@pytest.mark.parametrize("length", range(41))
def test_a_label_shows_nothing_unless_twelve_characters_stay_hidden(head: str, length: int) -> None:
    secret = (head + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH")[:length]
    label = redact(secret)
    shown = len(label.replace("…", ""))

    assert label in ("…", "(empty)") or len(secret) - shown >= 12
    if length >= 3 + 4 + 12 + len(head):  # room for the head, 12 hidden and the tail
        assert label.endswith(secret[-4:])  # the tail tells keys apart where it is safe


def test_an_identity_never_shows_or_pickles_its_value() -> None:
    credential = "sk-live-very-secret-credential-0001"
    identity = Identity.secret(credential)
    digest = hashlib.sha256(f"secret\x00{credential}".encode()).hexdigest()

    assert credential not in repr(identity) and digest[:12] not in repr(identity)
    assert repr(identity) == f"<Identity sk-…0001 [id {identity.key_id}]>"
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(identity)
    assert copy.deepcopy(identity) is identity
    with pytest.raises(AttributeError):
        identity.label = "changed"


def test_client_identities_group_ipv6_by_network() -> None:
    assert Identity.client("2001:db8:1:2::7") == Identity.client("2001:db8:1:2:ffff::1")
    assert Identity.client("2001:db8:1:3::7") != Identity.client("2001:db8:1:2::7")
    assert Identity.client("::ffff:203.0.113.7") == Identity.client("203.0.113.7")
    assert Identity.client(" 203.0.113.7 ").label == "client 203.0.113.7"
    with pytest.raises(ConfigurationError):
        Identity.client("not-an-address")


def test_derived_identities_are_apart_and_unambiguous() -> None:
    caller = Identity.named("agent-42")
    tool = caller.derived("tool", "refund", label="agent-42 tool refund")

    assert tool == caller.derived("tool", "refund", label="another label")  # labels only show
    assert tool != caller and tool != Identity.named("agent-43").derived("tool", "refund", label="")
    assert caller.derived("a\x00b", "c", label="") != caller.derived("a", "b\x00c", label="")
    assert caller.derived("ab", label="") != caller.derived("a", "b", label="")


def test_a_companion_fuse_keys_with_its_fuse_s_secret(
    caplog: pytest.LogCaptureFixture, fallback_warning: None
) -> None:
    from tokenfuse._middleware.mcp.keys import companion

    fuse = Fuse(SharedStore(), secret=SECRET)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        tools = companion(fuse, "tools", fuse.velocity or VelocityPolicy())

    assert tools.key_id("agent-42") == fuse.key_id("agent-42")
    assert "deployment secret" not in caplog.text  # no public fallback behind its back


# -- the attack the keyed hash defeats ---------------------------------------------------------

Derive = Callable[[bytes], bytes]


def plain_sha256(candidate: bytes) -> bytes:
    """How store keys were derived before they were keyed: the same in every deployment."""
    return hashlib.sha256(b"secret\x00" + candidate).digest()[:16]


def keyed(secret: bytes) -> Derive:
    def derive(candidate: bytes) -> bytes:
        inner = hashlib.sha256(b"secret\x00" + candidate).digest()
        return hmac.digest(secret, inner, "sha256")[:16]

    return derive


def six_digit_search(store_hash: str, derive: Derive) -> str | None:
    """Every 6-digit key, as the attacker who recovered one in 1.3 s searched."""
    target = bytes.fromhex(store_hash)
    for n in range(1_000_000):
        candidate = b"%06d" % n
        if derive(candidate) == target:
            return candidate.decode()
    return None


@pytest.mark.redis
def test_a_six_digit_key_cannot_be_recovered_from_its_redis_key_without_the_secret(
    redis_url: str, redis_prefix: str
) -> None:
    redis = pytest.importorskip("redis")
    from tokenfuse._stores.redis import RedisStore

    key = "004817"  # low, so that the searches that must succeed stop early
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    Fuse(store, secret=SECRET).record(Identity.secret(key), 10)
    store.close()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        [name] = list(client.scan_iter(match=f"{redis_prefix}:*"))
    finally:
        client.close()
    found = re.fullmatch(rf"{redis_prefix}:\{{default:([0-9a-f]{{32}})\}}", name)
    assert found is not None, name
    store_hash = found.group(1)

    assert six_digit_search(store_hash, plain_sha256) is None  # the old attack: nothing
    assert six_digit_search(plain_sha256(key.encode()).hex(), plain_sha256) == key  # it worked
    assert six_digit_search(store_hash, keyed(SECRET.encode())) == key  # needs the secret
