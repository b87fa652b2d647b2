"""Notes: a small store the agent reads and keeps up to date."""

from urllib.parse import urlencode

from django.urls import reverse

from tools.contract import Tool, ToolContext, ToolError, WhereToCheck
from tools.effects import ToolEffect
from tools.models import Note

_SLUG = {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,199}$"}
_SEARCH_LIMIT = 20


class ReadNote(Tool):
    name = "read_note"
    description = "Read the body of the note with the given slug."
    parameters = {
        "type": "object",
        "properties": {"slug": _SLUG},
        "required": ["slug"],
        "additionalProperties": False,
    }

    def run(self, arguments, context: ToolContext):
        note = Note.objects.filter(slug=arguments["slug"]).first()
        if note is None:
            raise ToolError(f"no note with slug {arguments['slug']!r}")
        return {"slug": note.slug, "body": note.body}


class SearchNotes(Tool):
    name = "search_notes"
    description = "Find notes whose slug or body contains the query (case-insensitive)."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
        "required": ["query"],
        "additionalProperties": False,
    }

    def run(self, arguments, context: ToolContext):
        query = arguments["query"]
        matches = Note.objects.filter(slug__icontains=query) | Note.objects.filter(
            body__icontains=query
        )
        return {
            "matches": [
                {"slug": note.slug, "excerpt": note.body[:200]}
                for note in matches.order_by("slug")[:_SEARCH_LIMIT]
            ]
        }


class UpsertNote(Tool):
    """Setting a body by slug twice leaves the same state: idempotent."""

    name = "upsert_note"
    description = "Create the note with the given slug, or replace its body."
    effect = ToolEffect.IDEMPOTENT_WRITE
    parameters = {
        "type": "object",
        "properties": {"slug": _SLUG, "body": {"type": "string", "maxLength": 100_000}},
        "required": ["slug", "body"],
        "additionalProperties": False,
    }

    def run(self, arguments, context: ToolContext):
        _, created = Note.objects.update_or_create(
            slug=arguments["slug"], defaults={"body": arguments["body"]}
        )
        return {"slug": arguments["slug"], "created": created}

    def where_to_check(self, arguments, idempotency_key):
        slug = arguments.get("slug") if isinstance(arguments, dict) else None
        if not isinstance(slug, str):
            return None
        notes = reverse("admin:tools_note_changelist")
        return WhereToCheck(
            f"the note “{slug}”: if its body is the one this call set, it landed (applied)",
            f"{notes}?{urlencode({'slug': slug})}",
        )
