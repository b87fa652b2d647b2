"""The runs list's search: a run id, words in the prompt, or a lease owner.

A run id is answered by the primary key alone. Otherwise a run matches if
every word of the term is in its prompt (``icontains``, quoted phrases kept
whole, as in Django's admin search), or if the whole term is its lease owner
(``iexact``: an owner has no spaces). For PostgreSQL's sake:

- All words go into one condition on the prompt, which the trigram index
  answers in one scan; a word in every prompt costs nothing extra.
- The prompt is matched separately for ended and live runs. The trigram
  index on prompts covers ended runs only (migration 0011): a run's row is
  rewritten with new index entries at every status change, and a trigram
  entry set costs as much as the prompt is long (a 4 KB prompt made each
  claim and settle three times slower). An ended run is not updated again,
  so its prompt is indexed once. Live runs (queued, running) are few and
  are found through the status index.
- Results are ordered newest first by an expression no index provides (see
  ``ordering``).
"""

import uuid
from datetime import timedelta

from django.db.models import DateTimeField, ExpressionWrapper, F, OrderBy, Q, Value
from django.utils.text import smart_split, unescape_string_literal

from runs.models.vocabulary import RunStatus

ENDED = sorted(RunStatus.terminal())
LIVE = [status for status in RunStatus.values if status not in ENDED]

_CREATED_AT_UNINDEXED = ExpressionWrapper(
    F("created_at") + Value(timedelta(0)), output_field=DateTimeField()
)


def run_id_in(term: str) -> uuid.UUID | None:
    """The run id a search term names, if it is one."""
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


def is_text_search(term: str) -> bool:
    term = term.strip()
    return bool(term) and run_id_in(term) is None


def search_runs(queryset, term: str):
    """The runs ``term`` names: by id, with every word of it in the prompt,
    or with the whole of it as lease owner."""
    term = term.strip()
    if not term:
        return queryset
    run_id = run_id_in(term)
    if run_id is not None:
        # OR-ing an id clause into the text search would scan every row.
        return queryset.filter(pk=run_id)
    in_prompt = Q()
    for word in smart_split(term):
        if word.startswith(('"', "'")) and word[0] == word[-1]:
            word = unescape_string_literal(word)
        in_prompt &= Q(prompt__icontains=word)
    return queryset.filter(
        (in_prompt & Q(status__in=ENDED))
        | (in_prompt & Q(status__in=LIVE))
        | Q(lease_owner__iexact=term)
    )


def ordering():
    """Newest first by an expression no index provides: otherwise PostgreSQL,
    guessing a text match is common, walks the created_at index past every
    non-matching row to fill a page (0.6 s at 1M runs for a term nothing
    matches) instead of asking the trigram index (milliseconds)."""
    return [OrderBy(_CREATED_AT_UNINDEXED, descending=True), "-pk"]
