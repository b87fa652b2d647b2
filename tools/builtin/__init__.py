"""The tools nrllm-ops ships with."""

from tools.builtin.ask_person import AskPerson
from tools.builtin.http import HttpGet, PostWebhook
from tools.builtin.notes import ReadNote, SearchNotes, UpsertNote
from tools.builtin.notifications import SendNotification

BUILTIN_TOOLS = [
    ReadNote,
    SearchNotes,
    UpsertNote,
    SendNotification,
    HttpGet,
    PostWebhook,
    AskPerson,
]
