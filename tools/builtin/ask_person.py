"""``ask_person``: the agent asks a person a question and waits for the answer (G24)."""

from tools.contract import Question, Tool, ToolContext, ToolError
from tools.validation import check_schema

#: The longest question the inbox shows whole.
QUESTION_CHARS = 2000


class AskPerson(Tool):
    """A read: asking changes nothing in the world, so approval never
    applies to it. The run parks ``waiting_for_input`` until a runner of
    its team answers (checked against ``answer_schema``) or the question
    expires; either is the call's result, recorded once and replayed."""

    name = "ask_person"
    description = (
        "Ask a person a question when you lack a fact you cannot find with your other "
        "tools. The run waits for their answer, which is this call's result. Give "
        "answer_schema (a JSON Schema) when the answer must have a shape."
    )
    parameters = {
        "type": "object",
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": QUESTION_CHARS},
            "answer_schema": {"type": "object"},
        },
        "required": ["question"],
        "additionalProperties": False,
    }
    #: Never waits for an approval: a question is no write, and a person answers it anyway.
    never_needs_approval = True

    def run(self, arguments, context: ToolContext):
        schema = arguments.get("answer_schema")
        if schema is not None:
            problem = check_schema(schema)
            if problem is not None:
                raise ToolError(f"answer_schema: {problem.replace('parameters', 'the schema')}")
        return Question(arguments["question"], schema)
