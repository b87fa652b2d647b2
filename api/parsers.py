"""The API's JSON parser: DRF's, with one more way a body is malformed."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    """DRF's parser turns a ``ValueError`` into a 400, but ``json.loads``
    raises ``RecursionError`` for a body nested thousands of levels deep
    (``[[[[…]]]]`` in a few hundred KB): that was a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
