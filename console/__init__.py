"""The operator console: every operator page, in the Django admin. Thin
adapters over the domain (``runs.operators``, ``runs.approvals``,
``agents``, ``spend``, ``tools``); nothing here writes a run's state
itself, and no domain package imports it."""
