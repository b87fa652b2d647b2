"""The API's token authentication: knox's, with the token's narrowing
(``teams.TokenScope``: one team, read-only) put on the request's user, so
that every check of ``teams.access`` holds the token to it (G22). The
user's roles are read anew at each request: a member removed from a team
takes their tokens' access to it away at once."""

from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from knox.auth import TokenAuthentication

from teams import access
from teams.models import TokenScope


class ScopedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, token):
        user, auth_token = super().authenticate_credentials(token)
        access.narrow(user, TokenScope.objects.filter(token=auth_token).first())
        return user, auth_token


class ScopedTokenScheme(KnoxTokenScheme):
    """In the schema, the same scheme as knox's own (``knoxApiToken``): the
    narrowing changes what a token may do, not how it is sent."""

    target_class = ScopedTokenAuthentication
