"""The agent form's provider, as fields (G18): its kind, chosen from the
registered providers, and each option the shipped providers take — model,
temperature, max_tokens, a scripted provider's turns — with a JSON object
for any other option a provider may take. An operator fills in fields, not
the provider's JSON; what a version holds is the JSON, unchanged.

``provider_of`` joins the fields into the provider's options, refusing a
field the chosen kind does not take (naming it); the definition's check
(``agents.definitions``) then refuses bad values in the API's words, and
``field_of_refusal`` says which field such a refusal is about.
``initial_of`` splits a version's provider back into the fields, and a
field sent back as shown keeps the version's value (``sent_as_shown``),
so a form saved unchanged makes no new version."""

import json
import math
import re

from django import forms
from django.utils.html import format_html

from console.start_run import TURNS_EXAMPLE
from runs.providers import PROVIDER_KINDS

#: The options that have a field of their own, each the field's name.
OPTION_FIELDS = ("model", "temperature", "max_tokens", "turns")
#: Any other option of a provider: a JSON object.
OTHER_OPTIONS = "provider_options"
#: A line's end, as a textarea's value may hold it; a line break.
_LINE_END = re.compile(r"\r\n?|\n")
_LINE_BREAK = re.compile(r"[\r\n]")

TURNS_HELP = format_html(
    "for the <code>scripted</code> provider: the model's answers in order, as a JSON "
    "list — a turn that calls tools, then one that answers; for example:"
    '<pre class="turns-example">{}</pre>',
    TURNS_EXAMPLE,
)


def takes(kind: str) -> list[str]:
    """The option fields a provider of ``kind`` takes (its JSON Schema's)."""
    provider_class = PROVIDER_KINDS.get(kind)
    properties = provider_class.spec_schema.get("properties", {}) if provider_class else {}
    return [name for name in OPTION_FIELDS if name in properties]


def _kinds() -> list[str]:
    """The registered kinds, a real model's first: scripted is for demos and tests."""
    return sorted(PROVIDER_KINDS, key=lambda kind: (kind == "scripted", kind))


def _configured(kind: str) -> bool:
    return PROVIDER_KINDS[kind].configuration_problem() is None


def kind_choices(current: str | None = None) -> list[tuple[str, str]]:
    """The registered kinds, each saying whether it is configured here; and
    ``current``, a version's kind, if it is registered no more (a save then
    says so, as the definition's check refuses it)."""
    choices = [
        (kind, kind if _configured(kind) else f"{kind} (not configured here)") for kind in _kinds()
    ]
    if current and current not in PROVIDER_KINDS:
        choices.append((current, f"{current} (no longer registered)"))
    return choices


def default_kind() -> str:
    """A new agent's kind: the first configured, a real model's before scripted."""
    return next((kind for kind in _kinds() if _configured(kind)), "scripted")


def turns_text(turns) -> str:
    """A scripted provider's turns as the form shows them: a turn a line."""
    if not isinstance(turns, list) or not turns:
        return json.dumps(turns, ensure_ascii=False)
    lines = ",\n  ".join(json.dumps(turn, ensure_ascii=False) for turn in turns)
    return f"[\n  {lines}\n]"


def values_of(provider: dict) -> dict:
    """What each field holds of a version's ``provider``: each option with
    a field of its own, and the others as one object (absent: none)."""
    values = {name: provider[name] for name in OPTION_FIELDS if name in provider}
    others = {key: value for key, value in provider.items() if key not in ("kind", *OPTION_FIELDS)}
    if others:
        values[OTHER_OPTIONS] = others
    return values


def initial_of(provider) -> dict:
    """The form's fields for a version's ``provider``: each option with a
    field in it, the rest as a JSON object (blank when there is none)."""
    if not isinstance(provider, dict):
        return {OTHER_OPTIONS: json.dumps(provider, ensure_ascii=False)}
    initial = {"provider": provider.get("kind", ""), OTHER_OPTIONS: ""}
    for name, value in values_of(provider).items():
        if name == OTHER_OPTIONS:
            initial[name] = json.dumps(value, indent=2, ensure_ascii=False)
        else:
            initial[name] = turns_text(value) if name == "turns" else json_or_text(value)
    return initial


def sent_as_shown(sent, shown: str, *, lines: bool) -> bool:
    """Whether ``sent`` is what a browser sends back for a field that
    showed ``shown``, untouched. HTML's form submission makes every line
    end of a textarea's value (``lines``) CRLF, and an input's value holds
    no line break; so a value a field shows cannot always come back byte
    for byte (and a number "40.0" reads back as 40)."""
    if not isinstance(sent, str):
        return False
    if lines:
        return _LINE_END.sub("\n", sent) == _LINE_END.sub("\n", shown)
    return sent == _LINE_BREAK.sub("", shown)


def json_or_text(value) -> str:
    """A string as it is; anything else as JSON (a number as it was stored)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def number(text: str) -> int | float:
    """``text`` as the number it spells: whole if written whole ("1"), else
    a float ("0.2", "1.0"), so a stored value shown and saved is unchanged."""
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise forms.ValidationError(f"{text[:40]!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise forms.ValidationError(f"{text[:40]!r} is not a number")
    return value


def provider_of(form: forms.Form) -> dict | None:
    """The provider's options the valid fields of ``form`` give; or None,
    with each field the chosen kind does not take, or that repeats a field
    in the other options, refused by name on the form."""
    data = form.cleaned_data
    kind = data["provider"]
    given = {name: data[name] for name in OPTION_FIELDS if data.get(name) not in (None, "")}
    taken = takes(kind)
    for name in given:
        if name not in taken and kind in PROVIDER_KINDS:
            takers = [other for other in PROVIDER_KINDS if name in takes(other)]
            form.add_error(
                name,
                f"{name}: the {kind} provider takes none (only {', '.join(takers)}): "
                "leave it blank, or choose that provider",
            )
    others = data.get(OTHER_OPTIONS) or {}
    for key in others:
        if key == "kind" or key in OPTION_FIELDS:
            field = "Provider" if key == "kind" else key
            form.add_error(
                OTHER_OPTIONS, f"{OTHER_OPTIONS}: {key!r} is set by the {field} field, not here"
            )
    if form.errors:
        return None
    return {"kind": kind, **given, **others}


_QUOTED = re.compile(r'"([^"]+)" (?:is a required property|was unexpected|were unexpected)')


def field_of_refusal(message: str) -> str | None:
    """The form field a definition's refusal of its provider is about
    (``provider/turns/0: …`` is the turns'), or None if it is not the provider's."""
    head, _, rest = message.partition(":")
    where = head.split("/")
    if where[0] != "provider":
        return None
    option = where[1] if len(where) > 1 else None
    if option is None:
        named = _QUOTED.search(rest)  # "model" is a required property; ("x" was unexpected)
        option = named.group(1) if named else "kind"
    if option == "kind":
        return "provider"
    return option if option in OPTION_FIELDS else OTHER_OPTIONS
