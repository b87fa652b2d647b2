"""A URL holding a NUL character is refused before any view sees it.

PostgreSQL text cannot hold a NUL, so comparing one with a column is an
error in the database, not a row that does not match: an id or a filter
value with a NUL in it would be a server error wherever it is looked up (the
admin's pages for a text primary key, its list filters, the API's tool
routes). No id or value we store can hold one, so refusing the URL here
answers what the lookup would have: 404 for a path, 400 for a query string
(in the API's error shape under ``/api/``: ``api.errors``).
"""

from django.core.exceptions import BadRequest
from django.http import Http404

NUL = "\x00"


def _holds_nul(query) -> bool:
    return any(NUL in key or any(NUL in value for value in values) for key, values in query.lists())


class RefuseNulInUrl:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if NUL in request.path:
            raise Http404("no such object: the path holds a NUL character")
        if _holds_nul(request.GET):
            raise BadRequest("the query string holds a NUL character")
        return self.get_response(request)
