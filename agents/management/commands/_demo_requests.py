"""How the demo's scripted requests are written: the tokens each answer
reports, and the shape of a run that sends one notification."""


def with_usage(request: dict) -> dict:
    """``request`` with the tokens each answer reports: a prompt that grows
    with the conversation, its earlier part served from the cache."""
    turns, prompt = [], 420
    for turn in request["provider"]["turns"]:
        if "error" not in turn:
            cached = prompt - 420 if prompt > 420 else 0
            turn = {
                **turn,
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": 85,
                    "cached_tokens": cached,
                },
            }
            prompt += 160
        turns.append(turn)
    return {**request, "provider": {**request["provider"], "turns": turns}}


def notifying(prompt: str, notification: dict, answer: str, *, read: dict | None = None) -> dict:
    """A run that may read a note, sends one notification, then answers.
    It asks for the notification's approval itself (``require_approval``),
    so the approval stories are told whatever NRLLM_APPROVAL_REQUIRED_FOR
    says; under the shipped policy the policy requires it anyway."""
    turns = [{"tool_calls": [{"name": "read_note", "arguments": read}]}] if read else []
    turns += [
        {"tool_calls": [{"name": "send_notification", "arguments": notification}]},
        # After a denial too: the model is told, and its next turn answers.
        {"content": answer},
    ]
    return with_usage(
        {
            "prompt": prompt,
            "tools": (["read_note"] if read else []) + ["send_notification"],
            "require_approval": ["send_notification"],
            "provider": {"kind": "scripted", "turns": turns},
        }
    )
