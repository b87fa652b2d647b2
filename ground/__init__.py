"""What every layer stands on: environment parsing, logs, the database
options and pool, commits that must reach disk, the durability check, the
metrics files and tracing. Nothing here imports the project."""
