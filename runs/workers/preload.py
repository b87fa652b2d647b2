"""What a worker process loads once, before its first job."""

import gc
import logging

logger = logging.getLogger(__name__)


def load_for_runs(*, url_configuration: bool = False) -> None:
    """Load, once per worker process, what a run needs and Django's start
    has not loaded: with the openai provider configured, its SDK (some 650
    modules) and its clients ready to send. The forking worker does it before
    its first fork, so a work horse inherits them instead of importing them
    for its one run: that was most of the CPU a real run cost. Sends nothing
    and opens no connection; the runtime and the tools are loaded by then
    (the admin imports the runtime, the tools app builds the registry)."""
    from runs.providers.openai_chat import OpenAIChatProvider
    from runs.providers.openai_clients import built_clients

    if OpenAIChatProvider.configuration_problem() is None:
        built_clients()
        logger.info("loaded for runs before any job: the openai SDK and client")
    if url_configuration:
        # A run's webhooks name admin pages (``reverse``). A worker's start
        # no longer checks the URLs (``rqworker``), which loaded them: the
        # forking worker loads them here once, for every horse, rather than
        # in each horse that sends one (0.2 s and some 340 modules each).
        from django.urls import get_resolver

        get_resolver().url_patterns  # noqa: B018  (loading is the point)
    # What is loaded by now lives as long as the process: moved out of the
    # collector's generations, a full collection no longer walks it. With
    # thousands of runs in flight, their objects live long enough to reach
    # the oldest generation, whose collections then came often and walked
    # the modules' hundreds of thousands of objects each time; a forking
    # worker's horses also stop touching (and copying) the pages they share.
    # Garbage first: frozen, it would never be collected.
    gc.collect()
    gc.freeze()
