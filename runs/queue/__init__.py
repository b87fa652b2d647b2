"""The queue: waking a worker for a queued run (``dispatch``). Below
everything that wakes a run — the runtime's retries, operators' requeues,
approvals' releases, the reaper — and above the providers and transitions
it uses."""
