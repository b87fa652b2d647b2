"""Showing attacker-influenced text (tool arguments, results, model output)
safely: always escaped by the template engine or ``format_html``, never
``mark_safe``d, and long values cut with a way to see them whole.

And the console's words for ids, moments, spans and positions: an operator
reads "call 1 of turn 3", not "3.0", and a moment to the second with its
time zone, since they compare it with logs."""

import json
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import format_html

from tools.effects import ToolEffect

SHORT_CHARS = 200
#: A run id's head: enough to tell runs apart on a page, and to search by
#: (the whole id is in the link's tooltip and on the run's page).
SHORT_ID_CHARS = 8

_BADGE_COLOURS = {
    ToolEffect.READ_ONLY: "#3c763d",
    ToolEffect.IDEMPOTENT_WRITE: "#8a6d3b",
    ToolEffect.NON_IDEMPOTENT_WRITE: "#a94442",
}


def as_text(value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def shortened(value) -> dict:
    """``{"short", "full", "cut"}`` for a template to show, escaped."""
    text = as_text(value)
    return {"short": text[:SHORT_CHARS], "full": text, "cut": len(text) > SHORT_CHARS}


def cut(text: str, chars: int) -> str:
    """``text`` on one line, at most ``chars`` long, "…" where it was cut."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def effect_badge(effect: str):
    if not effect:
        return ""
    colour = _BADGE_COLOURS.get(effect, "#555")
    return format_html(
        '<span class="effect-badge" style="background:{};color:#fff;padding:1px 6px;'
        'border-radius:8px;font-size:11px">{}</span>',
        colour,
        effect,
    )


def short_id(run_id) -> str:
    return str(run_id)[:SHORT_ID_CHARS]


def moment(value: datetime | None) -> str:
    """``2026-12-02 16:45:37 UTC``: to the second, with the zone; "" for None."""
    if value is None:
        return ""
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def clock(value: datetime) -> str:
    """``16:45:37 UTC``: a moment of today, as a message names it."""
    return timezone.localtime(value).strftime("%H:%M:%S %Z")


def span(elapsed: timedelta, *, units: int = 2) -> str:
    """A duration in two units at most (``0.4 s``, ``3 min 4 s``, ``2 h 5 min``),
    or the larger alone with ``units=1`` (``3 min``: a list's age)."""
    seconds = max(elapsed.total_seconds(), 0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            rest = (whole % size) // smaller_size if units > 1 else 0
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


def position_in_words(position: str) -> str:
    """A call's place in its run as the loop numbers it (``iteration.index``,
    from 1 and from 0): ``3.0`` is "call 1 of turn 3"."""
    turn, _, index = str(position).partition(".")
    if not (turn.isdigit() and index.isdigit()):
        return f"position {position}"
    return f"call {int(index) + 1} of turn {int(turn)}"
