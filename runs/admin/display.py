"""Showing attacker-influenced text (tool arguments, results, model output)
safely: always escaped by the template engine or ``format_html``, never
``mark_safe``d, and long values cut with a way to see them whole."""

import json

from django.utils.html import format_html

from tools.effects import ToolEffect

SHORT_CHARS = 200

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
