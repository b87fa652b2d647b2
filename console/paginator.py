"""A paginator for tables of millions of rows: no full-table COUNT.

Unfiltered, the count is PostgreSQL's estimate from ``pg_class``; filtered,
counting stops at ``COUNT_CAP`` rows (``LIMIT`` in a subquery), so the cost
is bounded whatever the filter matches.
"""

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

COUNT_CAP = 10_000


class BoundedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        connection = connections[queryset.db]
        if connection.vendor == "postgresql" and not queryset.query.where:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [queryset.model._meta.db_table],
                )
                row = cursor.fetchone()
            if row and row[0] > COUNT_CAP:
                return int(row[0])
        return queryset.order_by()[: COUNT_CAP + 1].count()
