"""Django's PostgreSQL backend with its connection pool opened once
(``base.DatabaseWrapper``); the engine ``ground.database`` names when a
pool is configured."""
