"""A request holding a NUL character is refused before any view sees it.

PostgreSQL text cannot hold a NUL, so comparing one with a column is an
error in the database, not a row that does not match: an id, a filter value,
a posted form field or a token with a NUL in it would be a server error
wherever it is looked up (the admin's pages for a text primary key, its list
filters, the tool settings' inline edit, whose formset looks each row up by
its posted ``name``; the API's tool routes; knox's token lookup, which the
API would answer 503). No id, value or token we store can hold one, so
refusing the request here answers what the lookup would have: 404 for a
path, 400 for a query string, a form body or a header (in the API's error
shape under ``/api/``: ``api.errors``).

JSON bodies are left to the API, which validates them field by field and
names the field.
"""

from django.core.exceptions import BadRequest
from django.http import Http404, UnreadablePostError

NUL = "\x00"
#: The bodies Django parses into ``request.POST``.
FORM_CONTENT_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


def _holds_nul(query) -> bool:
    return any(NUL in key or any(NUL in value for value in values) for key, values in query.lists())


def _header_with_nul(meta) -> str | None:
    """The first HTTP header (its ``META`` key) whose value holds a NUL."""
    return next(
        (
            key
            for key, value in meta.items()
            if key.startswith("HTTP_") and isinstance(value, str) and NUL in value
        ),
        None,
    )


class RefuseNulInRequest:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if NUL in request.path:
            raise Http404("no such object: the path holds a NUL character")
        if _holds_nul(request.GET):
            raise BadRequest("the query string holds a NUL character")
        if (header := _header_with_nul(request.META)) is not None:
            name = header.removeprefix("HTTP_").replace("_", "-").title()
            raise BadRequest(f"the {name} header holds a NUL character")
        if request.content_type in FORM_CONTENT_TYPES and _form_holds_nul(request):
            raise BadRequest("the form holds a NUL character")
        return self.get_response(request)


def _form_holds_nul(request) -> bool:
    """Parsing the form here, as CsrfViewMiddleware does next anyway, leaves
    it parsed for the view; a JSON body is never read."""
    try:
        return _holds_nul(request.POST)
    except UnreadablePostError:
        # The client went away mid-body: CsrfViewMiddleware lets the view
        # meet it too, so do not turn it into an error here.
        return False
