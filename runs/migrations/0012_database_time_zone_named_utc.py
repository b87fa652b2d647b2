"""New sessions start in the time zone Django uses, when the database's
default is UTC under another name (PostgreSQL only).

Django sets a new connection's time zone to 'UTC' unless the server already
reports exactly 'UTC': one round trip more per connection, so per job with
the forking worker (each work horse connects) and per web request without
persistent connections. Debian's initdb takes the system's zone, often
'Etc/UTC': the same zone, another name. Naming it 'UTC' for this database
changes no time anyone sees and saves that round trip.

Left alone: a default that is not UTC (someone chose it for the people who
read this database), and a database this role may not alter (the round trip
stays; nothing else changes).
"""

from django.db import migrations

#: tzdata's other names for UTC.
UTC_ALIASES = ("Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu")

NAME_IT_UTC = """
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'UTC');
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'not the owner of the database: its sessions keep their time zone';
END
$$
"""


def name_it_utc(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # This session's own value is Django's; reset_val is a new session's.
        cursor.execute("SELECT reset_val FROM pg_settings WHERE name = 'TimeZone'")
        (default,) = cursor.fetchone()
        if default in UTC_ALIASES:
            cursor.execute(NAME_IT_UTC)


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_ended_prompt_trigram_index")]

    # Reversing leaves the name: it is the same zone.
    operations = [migrations.RunPython(name_it_utc, migrations.RunPython.noop, elidable=False)]
