"""Cursor pagination over a date-time column, for every list of the API."""

from datetime import UTC

from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination


class TimeCursorPagination(CursorPagination):
    """A cursor is the client's text: its position must be a date-time with
    an offset, or the cursor is invalid (404). Before, one that was not
    reached the query as it was (a 500). It is compared in UTC, because
    PostgreSQL refuses offsets past ±15:59 that Python takes."""

    def decode_cursor(self, request):
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None:
            return cursor
        try:
            moment = parse_datetime(cursor.position)
            moment = moment.astimezone(UTC) if moment and moment.tzinfo else None
        except (ValueError, OverflowError):
            moment = None
        if moment is None:
            raise NotFound(self.invalid_cursor_message)
        return cursor._replace(position=moment.isoformat())
