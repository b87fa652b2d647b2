"""What a worker process loads once, before its first job."""

import logging

logger = logging.getLogger(__name__)


def load_for_runs() -> None:
    """Load, once per worker process, what a run needs and Django's start
    has not loaded: with the openai provider configured, its SDK (some 650
    modules) and a client ready to send. The forking worker does it before
    its first fork, so a work horse inherits them instead of importing them
    for its one run: that was most of the CPU a real run cost. Sends nothing
    and opens no connection; the runtime and the tools are loaded by then
    (the admin imports the runtime, the tools app builds the registry)."""
    from runs.providers.openai_chat import OpenAIChatProvider, built_client

    if OpenAIChatProvider.configuration_problem() is None:
        built_client()
        logger.info("loaded for runs before any job: the openai SDK and client")
