"""What watches a process's fuses without code: observers of decisions and of LLM usage.

Two hooks, one on each hot path, both a single truthiness check when nothing observes:

* every decision a ``Fuse`` takes (gate, record, admit), with the seconds its store took
  (``decided``), and every store call that failed (``store_failed``);
* the usage of every outbound LLM call a transport metered, with its model and operation
  (``metered``).

Observers are installed process-wide (``install``). ``apply(settings)``, run whenever a ``Fuse``
is built or the settings change, installs the ones the settings ask for: Prometheus metrics
when ``prometheus_client`` is installed, the OpenTelemetry GenAI histogram when
``opentelemetry-api`` is (unless ``TOKENFUSE_METRICS=0``), and a webhook for
``TOKENFUSE_ALERT_WEBHOOK``. An observer that raises is logged once and never breaks a call.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._settings import Settings

if TYPE_CHECKING:
    from ._fuse import Decision, Fuse
    from ._identity import Identity
    from ._stores.ops import Op
    from ._usage import Usage

__all__ = [
    "WATCHERS",
    "CallFacts",
    "DecisionObserver",
    "Observer",
    "UsageObserver",
    "apply",
    "call_facts",
    "decided",
    "install",
    "loop_passed",
    "metered",
    "store_failed",
]

logger = logging.getLogger("tokenfuse")


# Not frozen: built on every observed call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class CallFacts:
    """What an outbound call asked for, as the GenAI conventions name it."""

    model: str
    operation: str


class DecisionObserver(Protocol):
    """Watches every decision; must be quick and must not do I/O. One that also has
    ``loop_passed(fuse, op, seconds)`` is told of a plain failure-loop check that way, with
    no ``Decision`` made for it (``loop_passed`` below; ``Tally`` has one)."""

    def decided(self, fuse: Fuse, op: Op[Any], decision: Decision, seconds: float) -> None: ...

    def store_failed(self, fuse: Fuse, op: Op[Any], error: Exception) -> None: ...


class UsageObserver(Protocol):
    """Watches the usage of every metered outbound call; must be quick and do no I/O."""

    def metered(self, identity: Identity, usage: Usage, call: CallFacts) -> None: ...


Observer = DecisionObserver | UsageObserver


class _Watchers:
    """The installed observers of each hook, each tuple replaced whole on change: a hot path
    reads its tuple once and pays nothing more when it is empty."""

    __slots__ = ("decisions", "usage")

    def __init__(self) -> None:
        self.decisions: tuple[DecisionObserver, ...] = ()
        self.usage: tuple[UsageObserver, ...] = ()


WATCHERS = _Watchers()
_failed: set[int] = set()


def install(observer: Observer) -> Callable[[], None]:
    """Let ``observer`` watch every fuse (``decided``, ``store_failed``) and transport
    (``metered``) of the process, whichever of the methods it has; returns its removal."""
    with _lock:
        if hasattr(observer, "decided"):
            WATCHERS.decisions = (*WATCHERS.decisions, observer)  # type: ignore[arg-type]
        if hasattr(observer, "metered"):
            WATCHERS.usage = (*WATCHERS.usage, observer)  # type: ignore[arg-type]

    def remove() -> None:
        with _lock:
            WATCHERS.decisions = tuple(o for o in WATCHERS.decisions if o is not observer)
            WATCHERS.usage = tuple(o for o in WATCHERS.usage if o is not observer)

    return remove


def _failing(observer: object, exc: Exception) -> None:
    if id(observer) not in _failed:
        _failed.add(id(observer))
        logger.error("tokenfuse observer %r failed; the call goes on", observer, exc_info=exc)


def decided(
    watchers: tuple[DecisionObserver, ...],
    fuse: Fuse,
    op: Op[Any],
    decision: Decision,
    seconds: float,
) -> None:
    for observer in watchers:
        try:
            observer.decided(fuse, op, decision, seconds)
        except Exception as exc:
            _failing(observer, exc)


def loop_passed(
    watchers: tuple[DecisionObserver, ...],
    fuse: Fuse,
    op: Op[Any],
    decision: Callable[[], Decision],
    seconds: float,
) -> None:
    """``decided`` for a failure-loop check allowed with nothing to report (``op``: a
    ``CheckLoops``), which observers count and nothing more: an observer with a
    ``loop_passed(fuse, op, seconds)`` method (``Tally``) is told so, and needs no
    ``Decision``; the others get ``decision()``'s, made once, as ``decided`` gives it."""
    made: Decision | None = None
    for observer in watchers:
        try:
            quick = getattr(observer, "loop_passed", None)
            if quick is not None:
                quick(fuse, op, seconds)
                continue
            if made is None:
                made = decision()
            observer.decided(fuse, op, made, seconds)
        except Exception as exc:
            _failing(observer, exc)


def store_failed(
    watchers: tuple[DecisionObserver, ...], fuse: Fuse, op: Op[Any], error: Exception
) -> None:
    for observer in watchers:
        try:
            observer.store_failed(fuse, op, error)
        except Exception as exc:
            _failing(observer, exc)


def metered(
    watchers: tuple[UsageObserver, ...], identity: Identity, usage: Usage, call: CallFacts
) -> None:
    for observer in watchers:
        try:
            observer.metered(identity, usage, call)
        except Exception as exc:
            _failing(observer, exc)


# -- what an outbound call asked for ------------------------------------------------------------

# The GenAI conventions' operation names, by the end of the request's path (one regex, one
# named group per operation).
_OPERATION = re.compile(
    r"(?P<chat>/chat/completions|/messages|/converse(-stream)?|/chat|/responses)$"
    r"|(?P<embeddings>/embeddings|/embed|:embedContent|:batchEmbedContents)$"
    r"|(?P<generate_content>:(stream)?[gG]enerateContent)$"
    r"|(?P<text_completion>/completions|/api/generate)$"
)
_MODEL_IN_PATH = re.compile(r"/(?:models|model|deployments)/([^/:]+)")
_BODY_PREFIX = 4_096  # the model field comes early in every SDK's JSON
# What each path says (its operation, and its model if it names one), under the path as sent
# (%-encoded, bytes): a client calls the same few endpoints over and over, so this stays small,
# and a path seen before is neither decoded nor searched again. Bounded all the same.
_by_path: dict[bytes, tuple[str, str | None]] = {}
_MAX_PATHS = 512


def _path_facts(url: Any) -> tuple[str, str | None]:
    """The operation and the model (None: not in the path) of an httpx URL's path."""
    sent = url.raw_path.partition(b"?")[0]
    facts = _by_path.get(sent)
    if facts is None:
        path = url.path  # decoded, as the patterns read it
        operation = _OPERATION.search(path)
        model = _MODEL_IN_PATH.search(path)
        facts = (
            operation.lastgroup or "unknown" if operation else "unknown",
            model.group(1) if model else None,
        )
        if len(_by_path) < _MAX_PATHS:
            _by_path[sent] = facts
    return facts


def _model_in(body: bytes) -> str:
    """The ``"model": "..."`` of a JSON body (found with ``bytes.find``: a regex costs more)."""
    start = body.find(b'"model"', 0, _BODY_PREFIX)
    if start < 0:
        return "unknown"
    opening = body.find(b'"', start + 7, start + 40)
    if opening < 0 or body[start + 7 : opening].strip() != b":":
        return "unknown"
    closing = body.find(b'"', opening + 1, opening + 202)
    if closing < 0:
        return "unknown"
    return body[opening + 1 : closing].decode("utf-8", "replace") or "unknown"


def call_facts(request: Any) -> CallFacts:
    """The model and the operation of an httpx request: the model from its path (Gemini,
    Bedrock, Azure deployments) or its JSON body's ``model``; ``unknown`` when neither says."""
    try:
        operation, model = _path_facts(request.url)
        if model is None:
            body = getattr(request, "_content", None)  # only a body already in memory
            model = _model_in(body) if body else "unknown"
        return CallFacts(model, operation)
    except Exception:  # a request this cannot read costs its labels, never the call
        return CallFacts("unknown", "unknown")


# -- installed from the settings ----------------------------------------------------------------

_lock = threading.RLock()
_applied: Settings | None = None
_webhook: tuple[str, Callable[[], None], Callable[[], None]] | None = None  # url, stop, close
_metrics_installed = False


def apply(settings: Settings) -> None:
    """Install what ``settings`` ask for, unless these very settings were applied already."""
    global _applied
    if settings is _applied:
        return
    with _lock:
        if settings is _applied:
            return
        _apply_webhook(settings.alert_webhook)
        if settings.metrics:
            _install_metrics(settings)
        _applied = settings


def _install_metrics(settings: Settings) -> None:
    """Prometheus and OpenTelemetry, each once per process and only when installed."""
    global _metrics_installed
    if _metrics_installed:
        from ._metrics.prometheus import configure_keys

        configure_keys(settings.metrics_keys, settings.metrics_top)
        return
    _metrics_installed = True
    if _installed("prometheus_client"):
        from ._metrics.prometheus import install_default

        install_default(settings.metrics_keys, settings.metrics_top)
    if _installed("opentelemetry.metrics"):
        from ._metrics.otel import install_default as install_otel

        install_otel()


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported; ``find_spec`` of a submodule raises, rather than
    answering None, when its parent package is missing."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _apply_webhook(url: str | None) -> None:
    global _webhook
    if _webhook is not None and _webhook[0] == url:
        return
    if _webhook is not None:
        _, stop, close = _webhook
        stop()
        close()
        _webhook = None
    if url is None:
        return
    from ._alerts import WebhookSink
    from ._events import listen

    sink = WebhookSink(url)
    _webhook = (url, listen(sink), sink.close)
