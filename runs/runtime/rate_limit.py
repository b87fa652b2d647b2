"""Shared rate limits: requests and tokens per minute per provider
configuration and model, held across every worker process and machine.

A limit (``NRLLM_PROVIDER_RATE_LIMITS``, ``"kind:model"`` or ``"kind:*"``) is
two token buckets in one Redis hash per configuration — the provider's kind,
its endpoint and the model, so two accounts never share one — refilled at the
limit's rate and holding at most ``NRLLM_RATE_LIMIT_BURST_SECONDS`` of it.
One Lua script (``_TAKE``), on Redis's own clock, refills them and gives
the call the next turn they have — a request and its estimated tokens,
taken in debt when its turn is still to come — and says how long until
then: no two workers can both take the last one, and a waiting call sleeps
until its turn without asking again (no herd of waiters polling Redis). The estimate (the
conversation's characters / 4, plus ``max_tokens``) is corrected to the
tokens the provider reports once the call returned.

A call over the limit waits, bounded by ``NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS``:
it holds no database connection, its lease is kept by the heartbeat for the
wait, and the run page shows it (a Redis key per waiting run, ``waiting_for``).
A provider's 429 with ``Retry-After`` pauses the configuration for every
worker (a Redis key with that TTL), and the call is sent again once the
pause is over, within the same bound. Past the bound the call fails
``rate_limit`` (retryable: the run is requeued with backoff, G8).

Redis unreachable: the limiter fails open — the call goes out without the
limit, counted (``unavailable``), after at most ``_REDIS_TIMEOUT_SECONDS``,
and Redis is not asked again for ``_REDIS_DOWN_SECONDS``. The provider's
own limit and the circuit breaker still stand; failing closed would stop
every run for an outage of a part the runs otherwise do not need. Without
``REDIS_URL`` (the embedded default) there is no shared limiter at all.
"""

import functools
import json
import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError
from redis import Redis, RedisError
from redis.backoff import NoBackoff
from redis.retry import Retry

from ground.database import release_connection
from runs import transitions
from runs.models.metrics import RATE_LIMIT_EVENTS, RATE_LIMIT_WAIT_SECONDS
from runs.models.vocabulary import FailureClass
from runs.providers.base import ProviderError
from runs.runtime.errors import LeaseLost, RunCancelled
from runs.runtime.heartbeat import Heartbeat
from runs.transitions import Lease

logger = logging.getLogger(__name__)

#: Each Redis command of the limiter ends by then (connect, and answer).
_REDIS_TIMEOUT_SECONDS = 0.5
#: After Redis failed, the process sends calls without asking it this long.
_REDIS_DOWN_SECONDS = 5.0
_KEY_PREFIX = "nrllm:rate-limit:"
_WAIT_PREFIX = "nrllm:rate-limit-wait:"

# KEYS: the buckets' hash, the configuration's pause. ARGV: requests and
# tokens per millisecond (0: not limited), their capacities, this call's
# tokens, the longest it may wait (ms). A call is given the next turn the
# buckets have, in debt if it must wait: {1, ms until its turn}. Refused,
# nothing taken: {0, ms} — paused (then the pause's rest), or its turn
# further off than it may wait.
_TAKE = """
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then return {0, paused} end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local request_rate, request_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local token_rate, token_cap, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 'requests', 'tokens', 'at')
local elapsed = math.max(0, now - (tonumber(state[3]) or now))
local requests = math.min(request_cap, (tonumber(state[1]) or request_cap) + elapsed * request_rate)
local tokens = math.min(token_cap, (tonumber(state[2]) or token_cap) + elapsed * token_rate)
local wait = 0
if request_rate > 0 and requests < 1 then wait = (1 - requests) / request_rate end
-- A call larger than the bucket goes once the bucket is full, into debt.
local needed = math.min(cost, token_cap)
if token_rate > 0 and tokens < needed then
  wait = math.max(wait, (needed - tokens) / token_rate)
end
if wait > tonumber(ARGV[6]) then return {0, math.ceil(wait)} end
if request_rate > 0 then requests = requests - 1 end
if token_rate > 0 then tokens = tokens - cost end
redis.call('HSET', KEYS[1], 'requests', tostring(requests), 'tokens', tostring(tokens),
  'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], 120000 + math.ceil(wait))
return {1, math.ceil(wait)}
"""

# A pause never shortens one already standing (another worker's longer 429).
_PAUSE = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
"""

#: Redis URL → until when calls skip it, having found it unreachable: the
#: memo of one Redis, so pointing at another (a test's, a reconfigured
#: deployment's) starts afresh.
_down_until: dict[str, float] = {}
_down_lock = threading.Lock()


@functools.cache
def _redis(url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_connect_timeout=_REDIS_TIMEOUT_SECONDS,
        socket_timeout=_REDIS_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 0),
        max_connections=max(100, settings.NRLLM_WORKER_CONCURRENCY + 10),
    )


def _available() -> Redis | None:
    if not settings.REDIS_URL or time.monotonic() < _down_until.get(settings.REDIS_URL, 0.0):
        return None
    return _redis(settings.REDIS_URL)


def _went_down(limit_name: str, error: Exception) -> None:
    url = settings.REDIS_URL
    with _down_lock:
        if time.monotonic() >= _down_until.get(url, 0.0):
            logger.warning(
                "rate limit %s: Redis unreachable (%s); calls go without the shared limit for %ss",
                limit_name,
                type(error).__name__,
                _REDIS_DOWN_SECONDS,
            )
        _down_until[url] = time.monotonic() + _REDIS_DOWN_SECONDS
    RATE_LIMIT_EVENTS.labels(limit_name, "unavailable").inc()


def _configured(kind: str, model: str | None) -> tuple[str, dict] | None:
    limits = settings.NRLLM_PROVIDER_RATE_LIMITS
    for name in (f"{kind}:{model}", f"{kind}:*"):
        if name in limits:
            return name, limits[name]
    return None


class SharedLimit:
    """One configuration's buckets in Redis, and its pause."""

    def __init__(self, name: str, configuration: str, limits: dict):
        self.name = name
        # One hash tag for both: a Redis Cluster keeps them on one node, as
        # the script that reads both needs.
        self.bucket_key = f"{_KEY_PREFIX}{{{configuration}}}"
        self.pause_key = f"{_KEY_PREFIX}{{{configuration}}}:paused"
        burst = settings.NRLLM_RATE_LIMIT_BURST_SECONDS
        self.rates = []
        for field in ("requests_per_minute", "tokens_per_minute"):
            per_minute = limits.get(field, 0)
            self.rates += [per_minute / 60_000, max(1.0, per_minute * burst / 60)]

    def take(self, tokens: int, may_wait: float) -> tuple[bool, float] | None:
        """Take a request and ``tokens``: ``(True, seconds)`` — the call's
        turn comes in that many seconds (0: now) — or ``(False, seconds)``,
        nothing taken: paused for that long, or its turn further off than
        ``may_wait``. None when Redis cannot say (the call goes without)."""
        redis = _available()
        if redis is None:
            return None
        try:
            taken, wait_ms = redis.eval(
                _TAKE,
                2,
                self.bucket_key,
                self.pause_key,
                *self.rates,
                tokens,
                int(may_wait * 1000),
            )
        except RedisError as error:
            _went_down(self.name, error)
            return None
        return bool(taken), wait_ms / 1000

    def pause(self, seconds: float) -> None:
        """The provider said to come back in ``seconds``: every worker waits,
        at most the wait's bound (a call past it fails anyway, and one sent
        then meets the provider's own 429 again if its limit still stands;
        a longer pause would outlive any Retry-After sent by mistake, and one
        past what Redis stores would be refused)."""
        seconds = min(seconds, settings.NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS)
        redis = _available()
        if redis is not None:
            try:
                redis.eval(_PAUSE, 1, self.pause_key, max(1, int(seconds * 1000)))
            except RedisError as error:
                _went_down(self.name, error)

    def paused(self) -> bool:
        """Whether a provider's pause stands now (False when Redis cannot say)."""
        redis = _available()
        if redis is None:
            return False
        try:
            return redis.pttl(self.pause_key) > 0
        except RedisError as error:
            _went_down(self.name, error)
            return False

    def correct(self, estimated: int, used: int) -> None:
        """Give back (or charge more of) the tokens the estimate took."""
        redis = _available()
        if redis is not None and estimated != used and self.rates[2]:
            try:
                redis.hincrbyfloat(self.bucket_key, "tokens", estimated - used)
            except RedisError as error:
                _went_down(self.name, error)


def waiting_for(run_id) -> str | None:
    """The limit a run waits for now (the run page's "waiting for the
    provider's rate limit"), or None; None too when Redis cannot say."""
    redis = _available()
    if redis is None:
        return None
    try:
        name = redis.get(f"{_WAIT_PREFIX}{run_id}")
    except RedisError:
        return None
    return name.decode() if name else None


class RateLimitedCalls:
    """A run's model calls through their configuration's shared limit."""

    def __init__(
        self, limit: SharedLimit, lease: Lease, heartbeat: Heartbeat | None, options: dict
    ):
        self.limit = limit
        self.lease = lease
        self.run_id = lease.run_id
        self.heartbeat = heartbeat
        self.max_tokens = int(options.get("max_tokens") or 0)

    def call(self, send, messages: list[dict], call_seconds: float | None):
        """``send()`` once the limit lets it through; again after a 429 that
        paused the configuration, within the wait's bound."""
        deadline = time.monotonic() + settings.NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS
        estimated = len(json.dumps(messages, default=str)) // 4 + self.max_tokens
        while True:
            taken = self._wait_for_turn(estimated, deadline)
            if self.heartbeat is not None:
                self.heartbeat.model_call(call_seconds)
            try:
                turn = send()
            except ProviderError as error:
                if error.failure_class != FailureClass.RATE_LIMIT:
                    raise
                RATE_LIMIT_EVENTS.labels(self.limit.name, "provider_429").inc()
                # Redis could not say (fail open): no pause holds the call
                # back, so it fails as with no limit (the requeue's backoff
                # honours Retry-After) rather than being sent again at once.
                if error.retry_after is None or not taken:
                    raise
                self.limit.pause(error.retry_after)
                if time.monotonic() + error.retry_after > deadline:
                    raise
                continue
            if taken:
                self.limit.correct(estimated, _tokens_used(turn, estimated))
            return turn

    def _wait_for_turn(self, tokens: int, deadline: float) -> bool:
        """Wait for the call's turn; whether the limit took it (False: Redis
        could not say, and the call goes without it). A turn given is waited
        for without asking again: no herd of waiters polls Redis."""
        started, marked = time.monotonic(), False
        try:
            while (answer := self.limit.take(tokens, deadline - time.monotonic())) is not None:
                taken, wait = answer
                left = deadline - time.monotonic()
                if not taken and wait > left:
                    RATE_LIMIT_EVENTS.labels(self.limit.name, "gave_up").inc()
                    raise ProviderError(
                        f"rate limit {self.limit.name}: no turn within "
                        f"{settings.NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS}s",
                        failure_class=FailureClass.RATE_LIMIT,
                        retry_after=wait,
                    )
                if wait > 0:
                    marked = marked or self._mark_waiting(left)
                    time.sleep(wait)
                    self._still_to_send()
                # A turn that came during a provider's pause (given before
                # the 429) is not taken: the call waits the pause out and
                # asks for a new one.
                if taken and not (wait > 0 and self.limit.paused()):
                    return True
            return False
        finally:
            if marked:
                self._unmark_waiting()
                RATE_LIMIT_WAIT_SECONDS.labels(self.limit.name).observe(time.monotonic() - started)

    def _still_to_send(self) -> None:
        """After a wait: the attempt still holds the run (``LeaseLost`` if
        handed back) and no cancel came meanwhile (``RunCancelled``: G9, the
        call is not sent). The database away: the call goes, and the next
        step boundary sees the cancel."""
        if self.heartbeat is not None and self.heartbeat.handed_back:
            raise LeaseLost()
        try:
            cancelled = transitions.cancel_requested(self.lease)
        except DatabaseError:
            transitions.recover_connection(discard=True)
            return
        finally:
            release_connection()  # the model call holds none either
        if cancelled:
            raise RunCancelled()

    def _mark_waiting(self, seconds: float) -> bool:
        # The wait holds no connection, and the heartbeat keeps the lease
        # through it (G16): a lease past its bound at most.
        release_connection()
        if self.heartbeat is not None:
            self.heartbeat.until(seconds + self.heartbeat.lease_seconds)
        redis = _available()
        if redis is not None:
            try:
                redis.set(f"{_WAIT_PREFIX}{self.run_id}", self.limit.name, px=int(seconds * 1000))
            except RedisError as error:
                _went_down(self.limit.name, error)
        return True

    def _unmark_waiting(self) -> None:
        redis = _available()
        if redis is not None:
            try:
                redis.delete(f"{_WAIT_PREFIX}{self.run_id}")
            except RedisError as error:
                _went_down(self.limit.name, error)


def _tokens_used(turn, estimated: int) -> int:
    usage = (getattr(turn, "meta", None) or {}).get("usage") or {}
    counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    if all(isinstance(count, int) for count in counts):
        return sum(counts)
    return estimated  # not reported: the estimate stands


def calls_for(
    provider, kind: str, lease: Lease, heartbeat: Heartbeat | None
) -> RateLimitedCalls | None:
    """The shared limit of the provider's configuration, or None: no limit
    configured for its kind and model, or no Redis to share one."""
    model = getattr(provider, "model", None)
    configured = _configured(kind, model)
    if configured is not None and not settings.REDIS_URL:
        _warn_not_enforced()
    if configured is None or not settings.REDIS_URL:
        return None
    name, limits = configured
    # The endpoint is in the circuit's key: two accounts never share a limit.
    configuration = f"{kind} {getattr(provider, 'circuit_key', None) or model}"
    limit = SharedLimit(name, configuration, limits)
    if hasattr(provider, "paused_on_429"):
        provider.paused_on_429 = True  # its 429s pause the limit, not the circuit
    return RateLimitedCalls(limit, lease, heartbeat, getattr(provider, "options", {}))


@functools.cache
def _warn_not_enforced() -> None:
    # Once a process: the embedded default has no Redis to share a limit.
    logger.warning(
        "NRLLM_PROVIDER_RATE_LIMITS is set but REDIS_URL is not: the limits are not enforced"
    )
