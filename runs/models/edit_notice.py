"""What the model is told of a call a person edited before it ran (G24):
its result says so, with the arguments it ran with. The live loop and a
deferred call's completion tell it alike, and the step records it."""

import json

from tools.canonical import storable_text


def edit_notice(editor_name: str) -> str:
    return (
        f"a person ({editor_name}) edited this call before it ran: it ran with the "
        "arguments below, not the ones you asked for"
    )


def told_of_edit(editor_name: str, arguments, result, error: str) -> tuple:
    """``(result, error)`` as the model is told them for a call
    ``editor_name`` edited to ``arguments``."""
    notice = edit_notice(editor_name)
    if error:
        shown = json.dumps(arguments, sort_keys=True)
        return None, storable_text(f"{notice}: {shown}; it failed: {error}")
    return {"notice": notice, "arguments": arguments, "result": result}, ""
